"""An operator's first day with the collection, on the simulated fleet: every step the way a person does it.

The demo twice (and the burn stage again and again) gives the same findings; a typo is refused before any node is
touched; Ctrl-C in the middle of the burn leaves no tool running on any node and a report marked interrupted, and the
rerun right after it passes; a read-only reports directory is refused up front; an nvidia-smi that prints garbage or
stops after two rows is an error or a missing GPU, never a pass.
"""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from helpers.playbook_runner import ANSIBLE_PLAYBOOK, REPO, codes, nodes_by_host, run_playbook
from helpers.sim_processes import kill_tree, node_processes

pytestmark = pytest.mark.slow


def _findings(report):
    """What must be the same from one run to the next: per node, the verdict and the sorted findings."""
    return {n["host"]: (n["verdict"], sorted((f["code"], f["severity"], f["gpu"], f["check"]) for f in n["findings"]))
            for n in report["nodes"]}


def _check_errors(report):
    """The messages of every CHECK_ERROR, to tell why a run differed (its report is gone with the test's tmp_path)."""
    return [f["message"] for n in report["nodes"] for f in n["findings"] if f["code"] == "CHECK_ERROR"]


def _inventory(tmp_path, scenarios):
    inv = tmp_path / "inv"
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(inv), "--nodes",
                    str(len(scenarios))], check=True)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    for (_name, node), scenario in zip(sorted(hosts["gpufleet_sim"]["hosts"].items()), scenarios, strict=True):
        node["gpufleet_sim_scenario"] = scenario
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return str(inv)


def test_the_demo_twice_gives_the_same_findings(tmp_path, burn_in_run):
    """The session's demo run (the gate on) and one more (the gate off): the gate changes the exit code only."""
    first = burn_in_run
    second = run_playbook("burn_in", tmp_path / "b", extra={"gpufleet_fail_on": "never"})
    assert first[2] is not None and second[2] is not None, first[1][-3000:] + second[1][-3000:]
    assert _findings(first[2]) == _findings(second[2]), (_check_errors(first[2]), _check_errors(second[2]))
    assert first[2]["run_id"] != second[2]["run_id"]


def test_the_burn_stage_in_a_loop_never_loses_a_finding(tmp_path):
    """The faults a race used to hide (a stage failure read as a lost node): the same report run after run."""
    inv = _inventory(tmp_path, ["pcie_degraded", "riser_xid79"])
    extra = {"gpufleet_fail_on": "never", "gpufleet_dcgm_enabled": False, "gpufleet_nccl_enabled": False,
             "gpufleet_checkpoint_path": ""}
    seen = []
    # Four runs at once (each with its own nodes' state and reports): the same findings every time, and concurrent
    # runs load the machine as a busy controller would. (Eight, four at a time, cost 158 CPU-s of the suite's
    # budget; the race this guards against showed under concurrency, which four at once keep.)
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = list(pool.map(lambda i: run_playbook("burn_in", tmp_path / ("run%d" % i), inventory=inv, extra=extra),
                             range(4)))
    for _rc, output, report in runs:
        assert report is not None, output[-3000:]
        seen.append(_findings(report))
        by_host = nodes_by_host(report)
        assert "PCIE_DEGRADED" in codes(by_host["sim-node01"]) and "GPU_LOST" in codes(by_host["sim-node02"])
        assert all(n["reachable"] for n in report["nodes"]), output[-3000:]
    assert all(s == seen[0] for s in seen), seen


def test_a_typo_is_refused_before_any_node_is_touched(tmp_path):
    rc, output, report = run_playbook("burn_in", tmp_path, extra={"gpufleet_burn_duraton_s": 60})
    assert rc == 2 and report is None
    assert "did you mean gpufleet_burn_duration_s" in output
    assert not (tmp_path / "sim-state").exists(), "a node was touched"


def test_wrong_choices_and_ranges_are_refused_before_any_node_is_touched(tmp_path):
    """The role's argument spec (choices, "Range:" lines) refuses them in the run guard (bench/run_guard_refusal.py
    times it); on main fail_on=sometimes ran the whole burn-in and wrote no report, the others reached the nodes and
    came back as node errors stored in their history."""
    bad = {"gpufleet_fail_on": "sometimes", "gpufleet_burn_duration_s": -5, "gpufleet_sample_interval_s": -1,
           "gpufleet_lease_timeout_s": 0}
    rc, output, report = run_playbook("burn_in", tmp_path, extra=bad)
    assert rc == 2 and report is None and "refusing to start" in output, output[-3000:]
    assert all(name in output for name in bad), output[-3000:]
    assert not (tmp_path / "sim-state").exists(), "a node was touched"
    assert not (tmp_path / "reports" / "history").exists(), "the refusal reached the history"


def test_a_read_only_reports_directory_is_refused_up_front(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.access(str(ro), os.W_OK):  # root ignores the mode: a file where the directory should be, then
        ro.chmod(0o755)
        ro.rmdir()
        ro.write_text("not a directory")
    rc, output, report = run_playbook("burn_in", tmp_path, extra={"gpufleet_report_dir": str(ro / "reports")})
    assert rc == 2 and "refusing to start" in output and "reports directory" in output
    assert not (tmp_path / "sim-state").exists(), "the burn ran although its report could not be written"


def test_ctrl_c_mid_burn_stops_the_nodes_work_and_leaves_an_interrupted_report(tmp_path):
    state = tmp_path / "sim-state"
    reports = tmp_path / "reports"
    inv = _inventory(tmp_path, ["healthy_h100", "healthy_rtx5090"])
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
               ANSIBLE_NOCOLOR="1", GPUFLEET_SIM_STATE_ROOT=str(state))
    extra = json.dumps({"gpufleet_report_dir": str(reports), "gpufleet_burn_duration_s": 6000,
                        "gpufleet_lease_timeout_s": 10})
    proc = subprocess.Popen([str(ANSIBLE_PLAYBOOK), "playbooks/burn_in.yml", "-i", inv, "-e", extra], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not any("gpu_burn" in p for p in node_processes(state)):
        time.sleep(1)
    assert any("gpu_burn" in p for p in node_processes(state)), "the burn never started"
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    report = json.loads((reports / "latest" / "report.json").read_text())
    assert report.get("interrupted") is True, output[-3000:]
    assert all(n["stage"] == "burn" and "RUN_INTERRUPTED" in codes(n) for n in report["nodes"])
    assert not (reports / ".gpufleet-run.lock").exists(), "the interrupted run kept the reports lock"
    deadline = time.monotonic() + 60  # the lease (10 s) expires: the nodes stop their tools by themselves
    while time.monotonic() < deadline and node_processes(state):
        time.sleep(1)
    assert node_processes(state) == []

    rc, output, report = run_playbook("burn_in", tmp_path, inventory=inv, extra={"gpufleet_burn_duration_s": 300})
    assert rc == 0 and report is not None, output[-3000:]
    assert [n["verdict"] for n in report["nodes"]] == ["pass", "pass"]


def test_a_rerun_after_a_dead_controller_stops_the_leftovers_instead_of_refusing_the_node(tmp_path):
    state = tmp_path / "sim-state"
    reports = tmp_path / "reports"
    inv = _inventory(tmp_path, ["healthy_h100"])
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
               ANSIBLE_NOCOLOR="1", GPUFLEET_SIM_STATE_ROOT=str(state))
    extra = json.dumps({"gpufleet_report_dir": str(reports), "gpufleet_burn_duration_s": 6000,
                        "gpufleet_lease_timeout_s": 600})  # a lease that will not expire during the test
    proc = subprocess.Popen([str(ANSIBLE_PLAYBOOK), "playbooks/burn_in.yml", "-i", inv, "-e", extra], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    # The tool itself (gpu_burn -m ...), not the module that starts it: by then its async wrapper has left the
    # controller's process tree, so killing the controller leaves the work over.
    while time.monotonic() < deadline and not any("gpu_burn -m" in p for p in node_processes(state)):
        time.sleep(1)
    # A controller that dies with its workers (Ctrl-C stops the node's work itself): the work is left over.
    kill_tree(proc.pid)
    proc.wait(timeout=120)
    assert any("gpu_burn -m" in p for p in node_processes(state)), "nothing left over to test with"
    rc, output, report = run_playbook("burn_in", tmp_path, inventory=inv, extra={"gpufleet_burn_duration_s": 300})
    assert rc == 0 and report["nodes"][0]["verdict"] == "pass", output[-3000:]
    assert not any("6000" in p for p in node_processes(state))


@pytest.mark.parametrize("scenario,code", [("nvidia_smi_junk", "GPU_FACTS_UNREADABLE"),
                                           ("nvidia_smi_two_rows", "GPU_MISSING")])
def test_garbage_from_nvidia_smi_is_never_healthy(tmp_path, scenario, code):
    inv = _inventory(tmp_path, [scenario])
    rc, output, report = run_playbook("preflight", tmp_path, inventory=inv)
    assert report is not None, output[-3000:]
    node = report["nodes"][0]
    assert node["verdict"] in ("fail", "error") and code in codes(node), node["findings"]
    assert rc == 2
