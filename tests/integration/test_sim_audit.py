"""The audit on the simulated fleet, with its history, as an operator runs it: nightly, the simulator's clock advanced
one day between runs.

- the slow ECC leak (sim scenario ecc_leak_trend) is flagged by the trend before its first uncorrectable error, and a
  healthy node audited alongside is never flagged;
- a node left on an older driver is drift; a node whose GPUs lost 20% against its own burn-in baseline in two runs
  in a row is flagged;
- a node unreachable on every audit is stale in the history, never healthy; an empty inventory is refused;
- two audits started at the same moment both land in one history.
"""

import json
import os
import subprocess
import sys
import threading

import pytest
import yaml
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import FILE_NAME, History
from helpers.history_files import garbage_in_the_middle, healthy_history
from helpers.playbook_runner import REPO, codes, nodes_by_host, run_playbook

GROUP_VARS = REPO / "inventories" / "sim" / "group_vars"
SIM = REPO / "sim"


def inventory(tmp_path, hosts, extra_hosts=None):
    """An inventory like inventories/sim with these {host: scenario}; extra_hosts go straight into gpufleet_nodes."""
    inv = tmp_path / "inv"
    inv.mkdir()
    doc = {"gpufleet_nodes": {"children": {"gpufleet_sim": None}},
           "gpufleet_sim": {"hosts": {h: {"gpufleet_sim_scenario": s} for h, s in hosts.items()}}}
    if extra_hosts:
        doc["gpufleet_nodes"]["hosts"] = extra_hosts
    (inv / "hosts.yml").write_text(yaml.safe_dump(doc))
    os.symlink(GROUP_VARS, inv / "group_vars")
    return inv


def set_clock(tmp_path, hosts, day):
    """`gpufleet-sim clock --set DAY` on each simulated node (its environment as the inventory sets it)."""
    for host, scenario in hosts.items():
        env = dict(os.environ, GPUFLEET_SIM_SCENARIO=str(SIM / "scenarios" / (scenario + ".json")),
                   GPUFLEET_SIM_STATE=str(tmp_path / "sim-state" / host), GPUFLEET_SIM_NODE=host)
        out = subprocess.run([str(SIM / "bin" / "gpufleet-sim"), "clock", "--set", str(day)], env=env,
                             capture_output=True, text=True, check=True)
        assert json.loads(out.stdout)["days"] == day


def gpu_codes(node, index):
    return {f["code"] for f in node["findings"] if f.get("gpu") == index}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_slow_ecc_leak_is_caught_as_a_trend_before_its_first_uncorrectable_error(tmp_path):
    hosts = {"leak01": "ecc_leak_trend", "ok01": "healthy_h100"}
    inv = inventory(tmp_path, hosts)
    first_trend = first_uncorrectable = None
    seen = {}
    # An audit every third night over 26 days (a schedule that skips nights, as real ones do, and a third of the runs;
    # the trend shows on day 9, the first uncorrectable error on day 24): the GPU and XID reading only (no diag,
    # environment or storage, which this test is not about).
    nightly = {"gpufleet_fail_on": "never", "gpufleet_audit_dcgm_enabled": False, "gpufleet_audit_env_enabled": False,
               "gpufleet_checkpoint_path": ""}
    days = range(0, 26, 3)
    for day in days:
        set_clock(tmp_path, hosts, day)
        rc, output, report = run_playbook("audit", tmp_path, inventory=str(inv), extra=nightly)
        assert rc == 0 and report is not None, output[-3000:]
        by_host = nodes_by_host(report)
        leak, ok = by_host["leak01"], by_host["ok01"]
        assert ok["verdict"] == "pass" and ok["findings"] == [], (day, ok["findings"])
        found = gpu_codes(leak, 2)
        seen[day] = sorted(found)
        assert not {c for f in leak["findings"] if f.get("gpu") not in (2, None) for c in [f["code"]]}, day
        if first_trend is None and found & {"XID92_ACCELERATING", "ECC_LEAK_ACCELERATING"}:
            first_trend = day
        if first_uncorrectable is None and found & {"ECC_UNCORRECTED", "XID_RMA"}:
            first_uncorrectable = day
    assert first_trend is not None and first_uncorrectable is not None, seen
    assert first_trend < first_uncorrectable - 5, seen  # days of warning, not hours
    # The history holds every reading of the leaking GPU, and the report shows its ECC rate curve.
    with History(tmp_path / "reports" / "history" / FILE_NAME, readonly=True) as history:
        (gpu,) = [g for g in history.gpus_of("leak01", index=2)]
        series = history.gpu_series(gpu["id"])
        assert len(series) == len(days) and series[-1]["ecc_corr_agg"] > series[0]["ecc_corr_agg"]
        assert len(history.xid_events(gpu["id"], [92])) > 50
    leak = nodes_by_host(report)["leak01"]
    assert len(leak["history"]["ecc_per_day"]["2"]) == len(days) - 1  # a rate between each two readings
    html = (tmp_path / "reports" / "latest" / "report.html").read_text()
    assert "Corrected ECC errors per day (history)" in html and 'data-history-host="leak01"' in html


def test_drift_staleness_and_the_history_of_a_node_never_reached(tmp_path):
    hosts = {"h1": "healthy_h100", "h2": "healthy_h100", "h3": "healthy_h100", "old1": "healthy_h100_old_driver"}
    # 127.0.0.1 port 9 (discard): the connection is refused at once, on every audit.
    dead = {"dead1": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9,
                      "ansible_python_interpreter": "/usr/bin/python3"}}
    inv = inventory(tmp_path, hosts, extra_hosts=dead)
    for night in range(2):
        set_clock(tmp_path, hosts, night)
        rc, output, report = run_playbook("audit", tmp_path, inventory=str(inv))
        assert report is not None, output[-3000:]
        assert rc == 4, "ansible-playbook says a host was unreachable (and the gate failed)"
        by_host = nodes_by_host(report)
        drift = [f for f in by_host["old1"]["findings"] if f["code"] == "VERSION_DRIFT"]
        assert drift and "570.86.15" in drift[0]["message"] and "570.133.20" in drift[0]["message"], drift
        for host in ("h1", "h2", "h3"):
            assert by_host[host]["verdict"] == "pass", by_host[host]["findings"]
        assert by_host["dead1"]["verdict"] == "unreachable"
        assert {"UNREACHABLE", "HISTORY_STALE"} <= codes(by_host["dead1"]), by_host["dead1"]["findings"]
        assert "since never" in next(f["message"] for f in by_host["dead1"]["findings"]
                                     if f["code"] == "HISTORY_STALE")
    with History(tmp_path / "reports" / "history" / FILE_NAME, readonly=True) as history:
        summary = {s["name"]: s for s in history.fleet_summary()}
        assert summary["dead1"]["stale"] and summary["dead1"]["verdict"] == "unreachable"
        assert not summary["h1"]["stale"]
        assert len(history.node_runs("dead1")) == 2 and history.last_pass("dead1") is None


def test_a_node_twenty_percent_below_its_own_burn_in_baseline_is_flagged(tmp_path):
    hosts = {"slow1": "h100_slowing", "ok1": "healthy_h100"}
    # A short burn (3 s at the simulated clock: several 1 s samples fall inside it); no DCGM, NCCL or checkpoint
    # write: the baseline under test is gpu-burn's Gflop/s per GPU.
    inv = inventory(tmp_path, hosts)
    short = {"gpufleet_burn_duration_s": 300, "gpufleet_dcgm_enabled": False, "gpufleet_nccl_enabled": False,
             "gpufleet_checkpoint_path": ""}
    set_clock(tmp_path, hosts, 0)
    rc, output, first = run_playbook("burn_in", tmp_path, inventory=str(inv), extra=short)
    assert rc == 0 and first is not None, output[-3000:]
    assert nodes_by_host(first)["slow1"]["checks"]["baseline"]["figures"]["recorded"] == 8
    set_clock(tmp_path, hosts, 8)  # a week later the slowing node's GPUs run at 80%
    rc, output, later = run_playbook("burn_in", tmp_path, inventory=str(inv), extra=short)
    assert later is not None, output[-3000:]
    # One run is no spread: the first low burn-in is recorded as low, the second in a row warns.
    assert not [f for f in nodes_by_host(later)["slow1"]["findings"] if f["code"] == "BELOW_BASELINE"]
    set_clock(tmp_path, hosts, 9)
    rc, output, later = run_playbook("burn_in", tmp_path, inventory=str(inv), extra=short)
    assert later is not None, output[-3000:]
    slow, ok = nodes_by_host(later)["slow1"], nodes_by_host(later)["ok1"]
    below = [f for f in slow["findings"] if f["code"] == "BELOW_BASELINE"]
    assert sorted(f["gpu"] for f in below) == list(range(8)), slow["findings"]
    assert all("20% below its own baseline" in f["message"] and "low in the previous run too" in f["message"]
               for f in below)
    assert slow["checks"]["gpu_burn"]["verdict"] == "pass", "the fleet's own burn threshold still passes it"
    assert slow["verdict"] == "warn" and rc == 0
    assert ok["verdict"] == "pass" and ok["checks"]["baseline"]["figures"]["compared"] == 8
    # The customer handover sheet of both machines, from the history, in one command (HTML and PDF).
    out = tmp_path / "handover"
    proc = subprocess.run([sys.executable, "-m", "gpufleet_cli.main", "handover", "slow1", "ok1", "--pdf", "--out",
                           str(out), "--report-dir", str(tmp_path / "reports")], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = (out / "handover.html").read_text()
    for host in ("slow1", "ok1"):
        assert 'data-host="%s"' % host in html
    assert "NVIDIA H100 80GB HBM3" in html and "570.133.20" in html and "96.00.99.00.01" in html
    assert "SYS-821GE-TNHR" in html and "B" in html  # product and board serial from the DMI identity
    assert html.count('data-gpu="') == 16 and "BELOW_BASELINE" in html and "% below its own baseline" in html
    assert (out / "handover.pdf").read_bytes().startswith(b"%PDF")


def test_two_audits_started_at_the_same_moment_both_land_in_one_history(tmp_path):
    hosts = {"a1": "healthy_h100", "b1": "healthy_rtx5090"}
    inv = inventory(tmp_path, hosts)
    history_dir = tmp_path / "shared-history"
    results = {}

    def audit(name, host):
        root = tmp_path / name
        root.mkdir()
        # Separate report directories (each run holds its own reports lock), one history for both.
        results[name] = run_playbook("audit", root, inventory=str(inv), args=["-l", host + ",localhost"],
                                     extra={"gpufleet_history_dir": str(history_dir)})

    threads = [threading.Thread(target=audit, args=(name, host)) for name, host in (("ra", "a1"), ("rb", "b1"))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    for name, (rc, output, report) in results.items():
        assert rc == 0 and report is not None, (name, output[-3000:])
    with History(history_dir / FILE_NAME, readonly=True) as history:
        runs = {r["run_id"] for r in history.runs()}
        assert runs == {results["ra"][2]["run_id"], results["rb"][2]["run_id"]}
        assert set(history.hosts()) == {"a1", "b1"} and history.integrity() == ["ok"]


def test_an_empty_inventory_is_refused_with_the_reason(tmp_path):
    inv = tmp_path / "empty.yml"
    inv.write_text("all:\n  hosts: {}\n")
    rc, output, report = run_playbook("audit", tmp_path, inventory=str(inv))
    assert rc != 0 and report is None
    assert "matched no host" in output or "no nodes to judge" in output, output[-2000:]


def test_a_damaged_history_never_loses_the_report_nor_the_run_silently(tmp_path):
    """Garbage in one page in the middle of the history (a bad sector): the audit's report is written and says the
    run is not recorded, the console summary says it, the playbook fails, and not one byte of the file changes."""
    hosts = {"c1": "healthy_h100"}
    inv = inventory(tmp_path, hosts)
    history = healthy_history(tmp_path / "reports" / "history" / FILE_NAME)
    damaged = garbage_in_the_middle(history)
    rc, output, report = run_playbook("audit", tmp_path, inventory=str(inv))
    assert rc != 0 and report is not None, output[-3000:]
    assert [n["verdict"] for n in report["nodes"]] == ["pass"]
    error = report["history"]["error"]
    assert "NOT recorded" in error and "is damaged (PRAGMA quick_check" in error, error
    assert "History: this run is NOT recorded" in output  # the console summary
    assert "Gate on the verdicts" in output and "history: this run is NOT recorded" in output  # the failed task
    run_dir = tmp_path / "reports" / report["run_id"]
    assert "History: this run is NOT recorded" in (run_dir / "report.md").read_text()
    assert 'id="history-error"' in (run_dir / "report.html").read_text()
    assert history.read_bytes() == damaged


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
