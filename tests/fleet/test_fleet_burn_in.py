"""playbooks/burn_in.yml over real SSH on the fleet, with the simulator installed from the local apt repo.

Each node answers from one scenario (healthy, riser XID 79, PSU rail B loss, ECC leak). The same scenarios run locally
(ansible_connection=local, the repo's sim/bin) give the reference report: over SSH it must say the same thing.
"""

import json
import os
import signal
import sys
import time

import harness
import jsonschema
import pytest
from fleet_ansible import ANSIBLE_BIN, INSTALL_SIM, NODE_SIM_VARS, REPO, SIM_VARS, PlaybookRun, ansible_env

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(420)]

BURN_IN = REPO / "playbooks" / "burn_in.yml"
SCHEMA = REPO / "plugins" / "plugin_utils" / "report_schema.json"
SCENARIOS = ("healthy_h100", "riser_xid79", "psu_rail_b", "ecc_leak")
if not BURN_IN.exists():
    pytest.skip("playbooks/burn_in.yml is not in this checkout", allow_module_level=True)


def _write_inventory(path, hosts, group_vars):
    path.write_text(json.dumps({"gpufleet_nodes": {"hosts": hosts, "vars": group_vars}}, indent=1))
    return path


@pytest.fixture(scope="module")
def burn_in_setup(fleet, tmp_path_factory):
    """Install the simulator on every node (real apt) and write the SSH and local inventories (same host names)."""
    tmp = tmp_path_factory.mktemp("burn_in")
    install = PlaybookRun(fleet, INSTALL_SIM, tmp_path=tmp).wait(180)
    assert install.proc.returncode == 0, install.output[-3000:]
    scen = {n.name: {"gpufleet_sim_scenario": s} for n, s in zip(fleet.nodes, SCENARIOS, strict=True)}
    ssh_inv = _write_inventory(tmp / "ssh_vars.yml", scen, NODE_SIM_VARS)
    local_inv = _write_inventory(tmp / "local.yml", scen, dict(
        SIM_VARS, gpufleet_sim_root=str(REPO / "sim"), gpufleet_sim_state_root=str(tmp / "local-state"),
        gpufleet_sim_base_path=os.environ["PATH"], ansible_connection="local",
        ansible_python_interpreter=sys.executable))
    return {"tmp": tmp, "ssh": [fleet.inventory_path, ssh_inv], "local": [local_inv]}


def _fresh_state(fleet):
    for node in fleet.nodes:
        fleet.ssh(node.name, "rm -rf /var/lib/gpufleet-sim")


def _start(fleet, setup, kind, name, extra=()):
    report_dir = setup["tmp"] / ("reports-" + name)
    run = PlaybookRun(fleet, str(BURN_IN), ["-e", "gpufleet_report_dir=%s" % report_dir, *extra],
                      inventories=setup[kind], tmp_path=setup["tmp"])
    run.report_dir = report_dir
    return run


def _report(run):
    files = sorted(f for f in run.report_dir.glob("*/report.json") if not f.parent.is_symlink())  # not latest/
    assert len(files) == 1, "expected one report in %s, found %s\n%s" % (run.report_dir, files, run.output[-3000:])
    report = json.loads(files[0].read_text())
    jsonschema.validate(report, json.loads(SCHEMA.read_text()))
    return report


def _summary(report):
    """What an operator acts on, per node: verdicts, findings, actions, GPUs. Not times, run ids or raw series."""
    out = {}
    for n in report["nodes"]:
        out[n["host"]] = {
            "verdict": n["verdict"], "stage": n["stage"], "reachable": n["reachable"],
            "worst": (n.get("worst") or {}).get("code"), "action": n.get("action"),
            "findings": sorted((f["severity"], f["code"], str(f.get("gpu")), f.get("check")) for f in n["findings"]),
            "gpus": [(g["index"], g.get("pci"), g.get("uuid"), g["verdict"]) for g in n["gpus"]],
            "checks": {k: v["verdict"] for k, v in sorted(n["checks"].items())},
        }
    return out


@pytest.fixture(scope="module")
def local_reference(fleet, burn_in_setup):
    """The local burn-in, started once (it runs beside the first SSH burn-in) and awaited by whoever needs it."""
    run = _start(fleet, burn_in_setup, "local", "local")
    state = {}

    def result():
        if "summary" not in state:
            run.wait(300)
            state["rc"] = run.proc.returncode
            state["summary"] = _summary(_report(run))
        return state
    return result


def test_burn_in_over_ssh_reports_what_the_local_run_reports(fleet, burn_in_setup, local_reference):
    _fresh_state(fleet)
    started = time.monotonic()
    run = _start(fleet, burn_in_setup, "ssh", "ssh").wait(300)
    ssh_s = time.monotonic() - started
    local = local_reference()
    print("burn-in over SSH on %d nodes: %.1f s" % (len(fleet.nodes), ssh_s))
    summary = _summary(_report(run))
    assert summary == local["summary"]
    assert run.proc.returncode == local["rc"], run.output[-3000:]
    verdicts = {host: s["verdict"] for host, s in summary.items()}
    assert verdicts[fleet.nodes[0].name] == "pass" and \
        {verdicts[n.name] for n in fleet.nodes[1:]} == {"fail"}, verdicts  # the scenarios are not all healthy
    assert all(s["stage"] == "done" and s["reachable"] for s in summary.values())


# The processes of the check itself (the identity stage runs `dcgmi -v` for the version: not the kill point).
# dcgmi diag and NCCL run in one job where both run: the stage the node was lost in is that job's.
@pytest.mark.parametrize("process,stage", [("gpu_burn", "burn"), ("dcgmi.diag", "dcgm_nccl"),
                                           ("all_reduce_perf", "dcgm_nccl")])
def test_node_killed_mid_check_is_unreachable_at_once_with_its_stage(fleet, burn_in_setup, local_reference,
                                                                      restore_nodes, process, stage):
    """Killed during the burn, dcgmi diag or NCCL: UNREACHABLE within the SSH keepalive bound (the long checks are
    waited for with job_wait, never with an async poll that would wait out its timeout: 4 h for dcgmi)."""
    victim = fleet.nodes[0].name  # the healthy one: it would otherwise pass
    restore_nodes.append(victim)
    _fresh_state(fleet)
    # A longer simulated dcgmi and NCCL so that the kill lands while they run (the simulated NCCL of a healthy node
    # took under a second: the polls below missed it in one run).
    run = _start(fleet, burn_in_setup, "ssh", "killed-" + process,
                 [] if stage == "burn" else ["-e", "gpufleet_dcgm_level=4", "-e", "gpufleet_sim_nccl_hold_s=30"])
    deadline = time.monotonic() + 240
    while fleet.ssh(victim, "pgrep -f %s" % process, check=False, timeout=10).returncode != 0:
        assert run.proc.poll() is None and time.monotonic() < deadline, "%s never ran on %s\n%s" % (
            process, victim, run.output[-3000:])
        time.sleep(0.1)
    fleet.kill_node(victim)
    killed_at = time.monotonic() - run.started
    run.wait(300)
    seen = run.first(r"%s.*UNREACHABLE|UNREACHABLE.*%s" % (victim, victim))
    assert seen is not None and seen - killed_at < 75, "UNREACHABLE %s s after the kill" % (
        None if seen is None else round(seen - killed_at, 1))
    summary = _summary(_report(run))
    assert summary[victim]["reachable"] is False and summary[victim]["stage"] == stage, summary[victim]
    assert summary[victim]["verdict"] != "pass"
    assert run.recap[victim]["unreachable"] == 1
    assert run.proc.returncode != 0
    if stage == "burn":
        reference = local_reference()["summary"]
        for node in fleet.nodes[1:]:  # the others finished and say what they said without the loss
            assert summary[node.name] == reference[node.name]


def test_hanging_tool_is_killed_on_the_node_with_its_children(fleet):
    """Over SSH, a check whose tool hangs returns verdict=error at its timeout and leaves no process on the node."""
    node = fleet.nodes[1].name
    fleet.ssh(node, "printf '#!/bin/sh\\nsleep 3031 &\\nsleep 3032\\n' > /usr/local/bin/gpufleet-hang && "
                    "chmod +x /usr/local/bin/gpufleet-hang")
    started = time.monotonic()
    proc = harness.subprocess.run(
        [str(ANSIBLE_BIN / "ansible"), "-i", str(fleet.inventory_path), node, "-m", "kentino.gpufleet.gpu_burn",
         "-a", "duration=2 timeout=5 executable=/usr/local/bin/gpufleet-hang"],
        capture_output=True, text=True, env=ansible_env({"ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
                                                         "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}),
        cwd=str(REPO), timeout=120)
    took = time.monotonic() - started
    out = proc.stdout
    assert "UNREACHABLE" not in out and '"verdict": "error"' in out, out[-3000:]
    assert '"timed_out": true' in out, out[-3000:]
    assert took < 60, "the 5 s timeout took %.0f s to surface" % took
    left = fleet.ssh(node, "pgrep -af 'sleep 303[12]'", check=False)
    assert left.returncode == 1, "tool processes survived on %s: %s" % (node, left.stdout)


def test_sigint_during_the_report_keeps_the_previous_report(fleet, burn_in_setup):
    """Ctrl-C while the report is written: ansible-playbook ends promptly, the previous report stays intact and
    readable (reports/latest still points at a whole report), and no half-written file stays behind."""
    _fresh_state(fleet)
    quick = ["-e", "gpufleet_burn_enabled=false", "-e", "gpufleet_dcgm_enabled=false",
             "-e", "gpufleet_nccl_enabled=false"]
    first = _start(fleet, burn_in_setup, "ssh", "sigint", quick).wait(240)
    previous = (first.report_dir / "latest").resolve()
    before = {p.name: p.read_bytes() for p in previous.iterdir()}
    assert set(before) >= {"report.json", "report.md", "report.html", "junit.xml"}, first.output[-3000:]

    run = _start(fleet, burn_in_setup, "ssh", "sigint", quick)
    deadline = time.monotonic() + 240
    while run.first(r"TASK \[Judge every node") is None:
        assert run.proc.poll() is None and time.monotonic() < deadline, run.output[-3000:]
        time.sleep(0.01)
    os.killpg(run.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    interrupted = time.monotonic()
    run.wait(60)
    assert time.monotonic() - interrupted < 30, "ansible-playbook took too long to stop after SIGINT"
    assert run.proc.returncode != 0
    print("SIGINT %.2f s after the report task started; rc=%s"
          % (interrupted - run.started - run.first(r"TASK \[Judge every node"), run.proc.returncode))
    # The previous run's files are untouched, byte for byte.
    assert {p.name: p.read_bytes() for p in previous.iterdir()} == before
    # latest points at a whole report: the previous one, or the new one if it was complete before the signal.
    latest = (run.report_dir / "latest").resolve()
    jsonschema.validate(json.loads((latest / "report.json").read_text()), json.loads(SCHEMA.read_text()))
    assert {"report.json", "report.md", "report.html", "junit.xml"} <= {p.name for p in latest.iterdir()}
    for path in run.report_dir.rglob("*"):
        assert not path.name.endswith((".tmp", ".part")) and not path.name.startswith(".tmp"), path
    assert not [p for p in os.listdir("/proc") if p.isdigit() and str(run.report_dir) in harness._cmdline(int(p))]


def test_hanging_tool_inside_the_burn_in_makes_that_node_an_error(fleet, burn_in_setup):
    """The same hang inside the playbook: the node is `error` in the report with the timeout as its reason, the
    other nodes are judged as usual, and nothing of the tool is left on the node."""
    _fresh_state(fleet)
    victim = fleet.nodes[0].name
    fleet.ssh(victim, "printf '#!/bin/sh\\nsleep 3041 &\\nsleep 3042\\n' > /usr/local/bin/gpufleet-hang && "
                      "chmod +x /usr/local/bin/gpufleet-hang")
    host_vars = burn_in_setup["tmp"] / "hang_vars.yml"
    host_vars.write_text(json.dumps({"gpufleet_nodes": {"hosts": {victim: {
        "gpufleet_burn_executable": "/usr/local/bin/gpufleet-hang", "gpufleet_burn_timeout_s": 8}}}}))
    quick = ["-e", "gpufleet_dcgm_enabled=false", "-e", "gpufleet_nccl_enabled=false"]
    run = PlaybookRun(fleet, str(BURN_IN), ["-e", "gpufleet_report_dir=%s" % (burn_in_setup["tmp"] / "reports-hang"),
                                            *quick],
                      inventories=burn_in_setup["ssh"] + [host_vars], tmp_path=burn_in_setup["tmp"])
    run.report_dir = burn_in_setup["tmp"] / "reports-hang"
    run.wait(300)
    report = _report(run)
    node = [n for n in report["nodes"] if n["host"] == victim][0]
    assert node["verdict"] == "error" and node["checks"]["gpu_burn"]["verdict"] == "error", node["checks"]
    assert "timed out" in " ".join(node["checks"]["gpu_burn"]["reasons"]), node["checks"]["gpu_burn"]
    others = {n["host"]: n["checks"]["gpu_burn"]["verdict"] for n in report["nodes"] if n["host"] != victim}
    assert set(others.values()) <= {"pass", "fail"}, others  # judged, not errors
    left = fleet.ssh(victim, "pgrep -af 'sleep 304[12]'", check=False)
    assert left.returncode == 1, "tool processes survived on %s: %s" % (victim, left.stdout)
