"""One verdict on every surface (docs/contracts.md): for each simulated scenario, the verdict and the worst finding
agree across report.json, report.md, report.html, junit.xml, the CLI's exit codes, the history, the handover sheet,
and, for XIDs, the alert that fires (promtool over the XID watcher's real textfile, the watcher configured as the
gpu_monitoring role configures it, following the node's kernel log).

Cost: one burn-in of a six-node simulated fleet (one scenario per node), one audit of one of them after it, one
interrupted burn-in; every assertion reads those runs (module-scoped fixtures).

  ok01     healthy H100, its DCGM stage switched off   pass, dcgm_diag SKIPPED in every summary
  solo01   one RTX 5090 (a workstation)                pass: NCCL skipped as nothing to check, not a check left out
  junk01   nvidia-smi prints junk                      error, GPU_FACTS_UNREADABLE naming nvidia-smi, GPUs unknown
  riser01  XID 79: GPU 3 falls off the bus             fail, GPU_LOST; pages (GpuXidCritical, GpuLost)
  nvl01    XID 145 whose line says Nonfatal            warn, XID_WARNING; tickets (GpuXidWarning), never pages
  leak01   slow ECC leak: passes its burn-in, then its audit 25 days later fails: the history's "last pass" is the
           burn-in, the handover sheet is refused and, forced, says FAIL first
  ok01 again, Ctrl-C during its burn: interrupted, gate failed with its own fail_on, exit 3, nothing in the history
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest
import yaml
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import GATE_VERDICTS, PASSING
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import FILE_NAME, History
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.node_verdict import MODULE_JUDGES
from helpers.playbook_runner import ANSIBLE_PLAYBOOK, REPO, run_playbook

sys.path.insert(0, str(REPO / "tests" / "unit" / "monitoring"))
from watchlib import WatcherProc  # noqa: E402 (the monitoring tests' watcher harness)

pytestmark = pytest.mark.slow

SIM = REPO / "sim"
NODES = {"ok01": "healthy_h100", "junk01": "nvidia_smi_junk", "riser01": "riser_xid79",
         "nvl01": "hgx_nvlink5_nonfatal", "leak01": "ecc_leak_trend",
         "solo01": "workstation_rtx5090_1gpu"}
HOST_VARS = {"ok01": {"gpufleet_dcgm_enabled": False}, "solo01": {"gpufleet_expected_gpus": 1}}
EXPECTED = {"ok01": ("pass", None), "junk01": ("error", "GPU_FACTS_UNREADABLE"), "riser01": ("fail", "GPU_LOST"),
            "nvl01": ("warn", "XID_WARNING"), "solo01": ("pass", None)}
# judge_xid's codes -> the alert a human gets for the same event (GpuLost too for a lost GPU).
PAGES, TICKETS = ("GPU_LOST", "PSU_RAIL_LOSS", "GPU_GROUP_LOST", "XID_RMA", "XID_CRITICAL"), ("ECC_LEAK", "XID_WARNING")
PROMTOOL = shutil.which("promtool")


def _inventory(root):
    inv = root / "inv"
    inv.mkdir()
    hosts = {h: dict({"gpufleet_sim_scenario": s}, **HOST_VARS.get(h, {})) for h, s in NODES.items()}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"gpufleet_nodes": {"children": {"gpufleet_sim": None}},
                                                   "gpufleet_sim": {"hosts": hosts}}))
    os.symlink(REPO / "inventories" / "sim" / "group_vars", inv / "group_vars")
    return inv


def _sim_env(root, host):
    return dict(os.environ, GPUFLEET_SIM_SCENARIO=str(SIM / "scenarios" / (NODES[host] + ".json")),
                GPUFLEET_SIM_STATE=str(root / "sim-state" / host), GPUFLEET_SIM_NODE=host)


def _set_clock(root, host, day):
    subprocess.run([str(SIM / "bin" / "gpufleet-sim"), "clock", "--set", str(day)], env=_sim_env(root, host),
                   capture_output=True, text=True, check=True)


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "gpufleet_cli.main"] + list(args), cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, COLUMNS="250"))
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The burn-in of the six nodes, then the audit of leak01 25 days on (same report directory and history)."""
    root = tmp_path_factory.mktemp("one-verdict")
    inv = _inventory(root)
    _set_clock(root, "leak01", 0)
    rc, output, burn = run_playbook("burn_in", root, inventory=str(inv))
    assert burn is not None, output[-4000:]
    burn_dir = root / "reports" / burn["run_id"]
    _set_clock(root, "leak01", 25)
    rc_audit, output, audit = run_playbook("audit", root, inventory=str(inv), args=["-l", "leak01,localhost"],
                                           extra={"gpufleet_audit_dcgm_enabled": False,
                                                  "gpufleet_audit_env_enabled": False,
                                                  "gpufleet_checkpoint_path": ""})
    assert audit is not None, output[-4000:]
    return {"root": root, "inv": inv, "rc": rc, "burn": burn, "burn_dir": burn_dir, "audit": audit,
            "history": root / "reports" / "history" / FILE_NAME}


def _node(report, host):
    return next(n for n in report["nodes"] if n["host"] == host)


def _worst_code(node):
    return node["worst"]["code"] if node["worst"] else None


@pytest.mark.parametrize("host", sorted(EXPECTED))
def test_report_json_md_html_and_junit_agree(fleet, host):
    node = _node(fleet["burn"], host)
    verdict, code = EXPECTED[host]
    assert (node["verdict"], _worst_code(node)) == (verdict, code), node["findings"]
    md = (fleet["burn_dir"] / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| %s |" % host))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1].split(" ")[0] == verdict.upper() and cells[3].startswith(code or "no findings"), row
    html = (fleet["burn_dir"] / "report.html").read_text()
    rows = re.findall(r'<tr class="noderow" data-verdict="(\w+)">\s*<td><a href="#node-\d+">([^<]+)</a></td>(.*?)</tr>',
                      html, re.S)
    (hverdict, hrest), = [(v, rest) for v, h, rest in rows if h == host]
    assert hverdict == verdict and (("<code>%s</code>" % code) in hrest if code else "no findings" in hrest), hrest
    suite = next(s for s in ET.parse(fleet["burn_dir"] / "junit.xml").getroot() if s.get("name") == host)
    bad = int(suite.get("failures")) + int(suite.get("errors"))
    assert (bad > 0) == (verdict in GATE_VERDICTS[fleet["burn"]["fail_on"]]), (host, suite.attrib)
    if code and verdict in GATE_VERDICTS[fleet["burn"]["fail_on"]]:
        types = {el.get("type") for el in suite.iter() if el.tag in ("failure", "error")}
        assert code in types, types


def test_the_cli_exit_code_and_table(fleet):
    rc, out = _cli("report", str(fleet["burn_dir"]))
    gated = [n["host"] for n in fleet["burn"]["nodes"] if n["verdict"] in GATE_VERDICTS["fail"]]
    assert rc == (2 if gated else 0) == fleet["rc"], out[-3000:]
    for host, (verdict, _code) in EXPECTED.items():
        assert re.search(r"%s\s*│\s*%s" % (host, verdict.upper()), out), (host, out[-4000:])


@pytest.mark.parametrize("host", sorted(EXPECTED))
def test_the_history_and_the_handover_sheet_agree(fleet, host):
    verdict, code = EXPECTED[host]
    with History(fleet["history"], readonly=True) as history:
        run = history.node_runs(host, limit=1)[0]
        summary = {s["name"]: s for s in history.fleet_summary()}[host]
    assert run["verdict"] == verdict and (code is None or code in run["codes"]), run
    assert (summary["pass_ts"] == run["ts"]) == (verdict in PASSING), summary
    rc, out = _cli("history", host, "--report-dir", str(fleet["root"] / "reports"))
    assert rc == (2 if verdict in GATE_VERDICTS["fail"] else 0), out[-2000:]
    sheet = fleet["root"] / ("handover-" + host)
    rc, out = _cli("handover", host, "--out", str(sheet), "--report-dir", str(fleet["root"] / "reports"))
    assert rc == (0 if verdict in PASSING else 2), out[-2000:]
    if rc:
        assert "not handing over as healthy" in out and code in out and not (sheet / "handover.html").exists()
        rc, out = _cli("handover", host, "--force", "--out", str(sheet), "--report-dir",
                       str(fleet["root"] / "reports"))
        assert rc == 0, out
    html = (sheet / "handover.html").read_text()
    assert 'data-current="%s"' % verdict in html and ("data-blocked" in html) == (verdict not in PASSING)
    for internal in ("_reference=", "compared=", "recorded="):
        assert internal not in html, internal


def test_garbage_nvidia_smi_names_the_tool_and_leaves_the_gpus_unknown(fleet):
    node = _node(fleet["burn"], "junk01")
    assert [f["code"] for f in node["findings"]] == ["GPU_FACTS_UNREADABLE"], node["findings"]
    assert "nvidia-smi" in node["action"] and "reseat" not in node["action"]
    assert node["gpus"] and all(g["verdict"] == "error" for g in node["gpus"])
    html = (fleet["burn_dir"] / "report.html").read_text()
    row = html.split('">junk01</a></td>', 1)[1].split("</tr>", 1)[0]
    (cell,) = re.findall(r'data-label="GPUs ok">(.*?)</td>', row)
    assert cell.startswith("0/8") and "8 unknown" in cell, cell


def test_a_switched_off_stage_is_skipped_on_every_surface(fleet):
    node = _node(fleet["burn"], "ok01")
    assert node["skipped"] == ["dcgm_diag"] and node["checks"]["dcgm_diag"]["verdict"] == "skipped"
    assert "| ok01 | PASS (SKIPPED: dcgm_diag) |" in (fleet["burn_dir"] / "report.md").read_text()
    assert 'data-skipped="dcgm_diag"' in (fleet["burn_dir"] / "report.html").read_text()
    suite = next(s for s in ET.parse(fleet["burn_dir"] / "junit.xml").getroot() if s.get("name") == "ok01")
    case = next(c for c in suite if c.get("name") == "dcgm_diag")
    assert case.find("skipped") is not None
    _rc, out = _cli("report", str(fleet["burn_dir"]))
    assert "SKIPPED: dcgm_diag" in out


def test_one_gpu_has_no_nccl_to_check_and_passes_on_every_surface(fleet):
    """all_reduce_perf on one GPU moves nothing between GPUs (0 GB/s): the stage does not run it, and the report
    says why without listing it among the checks the node left out."""
    node = _node(fleet["burn"], "solo01")
    assert node["verdict"] == "pass" and node["skipped"] == [], node["findings"]
    check = node["checks"]["nccl_test"]
    assert check["verdict"] == "skipped" and check["reasons"][0].startswith("one GPU on this node"), check
    assert "| solo01 | PASS |" in (fleet["burn_dir"] / "report.md").read_text()
    suite = next(s for s in ET.parse(fleet["burn_dir"] / "junit.xml").getroot() if s.get("name") == "solo01")
    case = next(c for c in suite if c.get("name") == "nccl_test")
    assert case.find("skipped") is not None and case.find("failure") is None


def test_every_node_module_said_what_the_report_says(fleet):
    inputs = json.loads((fleet["burn_dir"] / "inputs.json").read_text())["hosts"]
    compared = 0
    for host, hv in inputs.items():
        checks = _node(fleet["burn"], host)["checks"]
        for key, result in hv.items():
            module = key[len("gpufleet_result_"):]
            if key.startswith("gpufleet_result_") and module in MODULE_JUDGES and "verdict" in (result or {}) \
                    and module != "health_snapshot":
                assert result["verdict"] == checks[module]["verdict"], (host, module, result.get("reasons"))
                compared += 1
    assert compared >= 12, compared


def test_an_audit_failing_after_a_passing_burn_in(fleet):
    """leak01 passed its burn-in; 25 days on its audit fails (the leak's uncorrectable error): the history says it,
    its last pass is the burn-in, its handover sheet is refused, and forced it says FAIL before the burn-in's PASS."""
    burn, audit = _node(fleet["burn"], "leak01"), _node(fleet["audit"], "leak01")
    assert burn["verdict"] in PASSING and audit["verdict"] == "fail", (burn["findings"], audit["findings"])
    with History(fleet["history"], readonly=True) as history:
        runs = history.node_runs("leak01")
        summary = {s["name"]: s for s in history.fleet_summary()}["leak01"]
    assert [r["playbook"] for r in runs[:2]] == ["audit", "burn_in"]
    assert summary["verdict"] == "fail" and summary["pass_ts"] == runs[1]["ts"]
    rc, out = _cli("history", "--report-dir", str(fleet["root"] / "reports"))
    assert rc == 2 and re.search(r"leak01\s*│[^\n]*audit\s*│\s*fail", out), out[-3000:]
    sheet = fleet["root"] / "handover-leak01"
    rc, out = _cli("handover", "leak01", "--out", str(sheet), "--report-dir", str(fleet["root"] / "reports"))
    assert rc == 2 and "newest run" in out and _worst_code(audit) in out, out
    rc, out = _cli("handover", "leak01", "--force", "--out", str(sheet), "--report-dir",
                   str(fleet["root"] / "reports"))
    html = (sheet / "handover.html").read_text()
    assert rc == 0 and html.index('data-current="fail"') < html.index("burn-in %s" % burn["verdict"])
    assert _worst_code(audit) in html


# --- the alerts, for the XIDs: the watcher's real textfile through the shipped rules -----------------------------

def _watch(fleet, host, tmp_path):
    """The watcher as the gpu_monitoring role configures it (its vars with the inventory's overrides), following the
    node's simulated journal until it has counted the XIDs the report judged; its textfile's samples."""
    from test_watcher_policy import role_config

    cfg = role_config({})
    node = _node(fleet["burn"], host)
    wanted = {(e["pci"], str(e["xid"])) for e in node["xid_timeline"] if e.get("pci") and e["severity"] != "info"}
    watcher = WatcherProc(tmp_path / host, source="journal", journalctl=str(SIM / "bin" / "journalctl"),
                          nvidia_smi=str(SIM / "bin" / "nvidia-smi"), severity_overrides=cfg["severity_overrides"],
                          env={k: v for k, v in _sim_env(fleet["root"], host).items() if k.startswith("GPUFLEET_SIM")},
                          inventory_interval_seconds=1)
    watcher.start()
    try:
        metrics = watcher.wait_for(lambda m: wanted <= {(dict(ls).get("pci"), dict(ls).get("xid")) for (n, ls) in m
                                                        if n == "gpufleet_xid_last_event_timestamp_seconds"},
                                   timeout=60, what="the report's XIDs")
    finally:
        watcher.stop()
    return metrics


def _alerts(metrics, tmp_path):
    """{alert name: [labels]} that fire 5 minutes after the watcher's events, by promtool test rules."""
    node = {"instance": "n1:9100", "job": "gpufleet-node"}
    series, info = [], {}
    for (name, labels), value in metrics.items():
        labels = dict(labels, **node)
        if name == "gpufleet_gpu_info":
            info[labels["pci"]] = labels
        if name.startswith(("gpufleet_xid_last_event", "gpufleet_gpu_info", "gpufleet_gpu_lost", "gpufleet_xid_events")):
            # the events' times on the test's clock: one minute in
            values = "60x30" if name.startswith("gpufleet_xid_last_event") else "%gx30" % value
            series.append({"series": "%s{%s}" % (name, ",".join('%s="%s"' % kv for kv in sorted(labels.items()))),
                           "values": values})
    expected = {"GpuXidCritical": [], "GpuXidWarning": []}
    for (name, labels), _value in metrics.items():
        labels = dict(labels)
        if name != "gpufleet_xid_last_event_timestamp_seconds" or labels["severity"] == "info":
            continue
        alert = "GpuXidCritical" if labels["severity"] == "critical" else "GpuXidWarning"
        exp = dict(node, pci=labels["pci"], xid=labels["xid"], severity="critical" if alert == "GpuXidCritical"
                   else "warning", cause="critical_code" if alert == "GpuXidCritical" else "warning_code")
        if labels["pci"] in info:  # an empty label is no label to Prometheus (a lost GPU's index is unknown)
            exp.update((k, info[labels["pci"]][k]) for k in ("gpu", "uuid") if info[labels["pci"]].get(k))
        expected[alert].append(exp)
    rules = yaml.safe_load((REPO / "monitoring" / "prometheus" / "gpufleet-alerts.yml").read_text())
    for rule in rules["groups"][0]["rules"]:
        rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    spec = {"rule_files": [str(tmp_path / "rules.yml")], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [{"eval_time": "5m", "alertname": a, "exp_alerts": [{"exp_labels": ls} for ls in exp]}
                            for a, exp in expected.items()]}]}
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "tests.yml")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return {a: e for a, e in expected.items() if e}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: apt-get install prometheus")
@pytest.mark.parametrize("host", ["riser01", "nvl01"])
def test_the_alert_that_fires_is_the_report_s_verdict_on_the_xid(fleet, host, tmp_path):
    node = _node(fleet["burn"], host)
    xid_codes = {f["code"] for f in node["findings"] if f["check"] == "xid_facts"}
    fired = _alerts(_watch(fleet, host, tmp_path), tmp_path)
    assert ("GpuXidCritical" in fired) == bool(xid_codes & set(PAGES)), (xid_codes, fired)
    assert ("GpuXidWarning" in fired) == bool(xid_codes & set(TICKETS)), (xid_codes, fired)
    if host == "nvl01":  # the catalog rates XID 145 critical; its line says Nonfatal: a ticket, like the report
        assert node["verdict"] == "warn" and [a["xid"] for a in fired["GpuXidWarning"]] == ["145"]


# --- an interrupted run ----------------------------------------------------------------------------------------------

def test_an_interrupted_run_is_no_pass_anywhere(fleet, tmp_path):
    reports = tmp_path / "reports"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
               ANSIBLE_NOCOLOR="1", GPUFLEET_SIM_STATE_ROOT=str(tmp_path / "sim-state"))
    extra = json.dumps({"gpufleet_report_dir": str(reports), "gpufleet_burn_duration_s": 6000,
                        "gpufleet_lease_timeout_s": 10, "gpufleet_fail_on": "warn",
                        "gpufleet_history_dir": str(fleet["history"].parent)})
    proc = subprocess.Popen([str(ANSIBLE_PLAYBOOK), "playbooks/burn_in.yml", "-i", str(fleet["inv"]), "-l",
                             "ok01,localhost", "-e", extra], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    state = tmp_path / "sim-state" / "ok01" / "load"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (state.is_dir() and any(state.iterdir())):
        time.sleep(0.5)  # polls the burn's load marker: the condition, not a guess of how long it takes
    assert state.is_dir() and any(state.iterdir()), "the burn never started"
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=180)
    doc = json.loads((reports / "latest" / "report.json").read_text())
    assert doc["interrupted"] is True and doc["fail_on"] == "warn" and doc["summary"]["gate"]["failed"] is True
    node = _node(doc, "ok01")
    assert _worst_code(node) == "RUN_INTERRUPTED" and node["verdict"] != "pass"
    run_dir = reports / doc["run_id"]
    assert "Gate (fail_on=warn): FAILED: the run was interrupted" in (run_dir / "report.md").read_text()
    assert "gate failed: run interrupted" in (run_dir / "report.html").read_text()
    suite = next(s for s in ET.parse(run_dir / "junit.xml").getroot() if s.get("name") == "ok01")
    assert int(suite.get("errors")) + int(suite.get("failures")) > 0
    rc, out = _cli("report", str(run_dir))
    assert rc == 3 and "INTERRUPTED" in out, out[-2000:]
    with History(fleet["history"], readonly=True) as history:
        assert doc["run_id"] not in {r["run_id"] for r in history.runs(100)}, "an interrupted run is not a run"
