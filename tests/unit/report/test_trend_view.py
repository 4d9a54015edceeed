"""The report's trend view from a real history file: the recorded burn-in of the simulated fleet judged against three
weeks of earlier nightly readings of sim-node02 whose GPU 3 leaks (written through the store), rendered, and checked
in headless Chromium (the page's script ran, the node's ECC-per-day curve and its changes table are in the DOM).
"""

import copy
import re
import subprocess
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import render_html, report
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import records
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import FILE_NAME, History
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import history as history_rules
from helpers import sample_fleet

CHROMIUM = Path("/usr/bin/chromium")
DAY = 86400.0


def _judged(tmp_path):
    data = sample_fleet.hosts()
    # The recorded run's identity snapshot carries the recording's read times; this history runs on its own clock.
    data["sim-node02"].pop("gpufleet_result_health_snapshot", None)
    nodes = report.evaluate_fleet(list(data), data, sample_fleet.in_play())
    node = next(n for n in nodes if n["host"] == "sim-node02")
    now = records.node_record(node, data["sim-node02"], 1.8e9 + 21 * DAY, "burn_in")
    with History(tmp_path / FILE_NAME) as history:
        for day in range(21):
            past = copy.deepcopy(now)
            past["ts"] = 1.8e9 + day * DAY
            for gpu in past["gpus"]:
                gpu["ts"] = past["ts"]
                leak = gpu["idx"] == 3
                gpu["ecc_corr_agg"] = int(40 * 0.7 * (2.72 ** (0.2 * day) - 1)) if leak else 0
                gpu["ecc_corr_vol"] = gpu["ecc_corr_agg"]
            past["baselines"], past["doc"] = [], None
            history.record({"run_id": "night-%02d" % day, "playbook": "audit", "ts": past["ts"], "verdict": "pass"},
                           [past])
        for gpu in now["gpus"]:
            gpu["ecc_corr_agg"] = int(40 * 0.7 * (2.72 ** (0.2 * 21) - 1)) if gpu["idx"] == 3 else 0
        # The current run's reading of GPU 3 as its facts (the history step reads them from the observations).
        data = copy.deepcopy(data)
        for gpu in data["sim-node02"]["ansible_facts"]["gpufleet_gpus"]:
            if gpu["index"] == 3:
                gpu["ecc_aggregate_corrected"] = now["gpus"][3]["ecc_corr_agg"]
        history_rules.annotate([node], {"sim-node02": data["sim-node02"]}, history, 1.8e9 + 21 * DAY, "audit")
    return nodes, node


def test_the_trend_view_is_judged_and_drawn_from_the_history(tmp_path):
    nodes, node = _judged(tmp_path)
    assert "ECC_LEAK_ACCELERATING" in {f["code"] for f in node["findings"] if f["gpu"] == 3}, node["findings"]
    assert node["history"]["previous"]["run_id"] == "night-20"
    curve = node["history"]["ecc_per_day"]["3"]
    assert len(curve) == 21 and curve[-1][0] == 0.0 and curve[-1][1] > 10 * curve[0][1]
    doc = report.build_report(nodes, "trend-view", playbook="audit")
    report.validate_report(doc)
    html = render_html.render(doc)
    assert 'data-history-host="sim-node02"' in html and "Corrected ECC errors per day (history)" in html


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)")
def test_the_trend_view_renders_in_chromium(tmp_path):
    nodes, _node = _judged(tmp_path)
    doc = report.build_report(nodes, "trend-view", playbook="audit")
    written = report.write_report(doc, tmp_path / "reports")
    html = Path(written["files"]["report.html"])
    proc = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--user-data-dir=%s" % (tmp_path / "profile"), "--enable-logging=stderr", "--v=0",
                           "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120)
    dom = proc.stdout
    assert 'data-gpufleet-rendered="%d"' % len(doc["nodes"]) in dom, proc.stderr[-2000:]
    block = dom[dom.index('data-history-host="sim-node02"'):]
    block = block[:block.index("</article>")]
    assert re.search(r'<path d="M[0-9.]+,[0-9.]+ L', block), "the ECC curve is drawn"
    assert "corrected ECC (lifetime)" in block and "night-20" in block
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not [line for line in console if re.search(r"error|uncaught", line, re.I)], console


def test_the_card_never_says_no_ecc_errors_beside_ecc_findings():
    """A node's first run in the history has no ECC curve; on main its card said "No corrected ECC errors in the
    history." beside its own rising-ECC findings (the leaking node of the demo)."""
    data = sample_fleet.hosts()
    nodes = report.evaluate_fleet(list(data), data, sample_fleet.in_play())
    leak = next(n for n in nodes if any("ECC" in f["code"] for f in n["findings"]))
    healthy = next(n for n in nodes if n["verdict"] == "pass")
    for node in (leak, healthy):
        node["history"] = {"previous": None, "changes": [], "ecc_per_day": {}}
    doc = report.build_report(nodes, "20260101T000000Z-abc123", playbook="burn_in")
    html = render_html.render(doc)
    card = html.split('data-history-host="%s"' % leak["host"], 1)[1].split("</div>", 1)[0]
    assert "No corrected ECC errors" not in html
    assert "This run&#39;s ECC findings are below: ECC_" in card
    other = html.split('data-history-host="%s"' % healthy["host"], 1)[1].split("</div>", 1)[0]
    assert "No rise of corrected ECC between this node&#39;s readings" in other


def test_the_report_shows_the_nodes_lifecycle_as_the_history_held_it(tmp_path):
    """A node quarantined by an alert and returned by a preflight before this run: its card says so, with the newest
    transitions and the reason escaped; a node with no lifecycle has none."""
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle

    data = sample_fleet.hosts()
    nodes = report.evaluate_fleet(list(data), data, sample_fleet.in_play())
    ts = 1.8e9
    with History(tmp_path / FILE_NAME) as history:
        lifecycle.transition(history, "sim-node02", "quarantined", "XID 79 <riser>", "alert", code="XID_79", gpu="3",
                             now=ts)
        lifecycle.transition(history, "sim-node02", "validating", "preflight after a reseat", "operator:ana",
                             now=ts + 60)
        history_rules.annotate(nodes, data, history, ts + 3600, "burn_in")
    life = next(n for n in nodes if n["host"] == "sim-node02")["history"]["lifecycle"]
    assert life["state"] == "validating" and life["since"] == history_rules.iso(ts + 60), life
    assert [(t["from"], t["to"], t["actor"], t["code"], t["gpu"]) for t in life["transitions"]] == [
        ("healthy", "quarantined", "alert", "XID_79", "3"), ("quarantined", "validating", "operator:ana", None, None)]
    assert next(n for n in nodes if n["host"] == "sim-node01")["history"]["lifecycle"] is None
    doc = report.build_report(nodes, "lifecycle-view", playbook="burn_in")
    report.validate_report(doc)
    html = render_html.render(doc)
    assert 'data-lifecycle="validating"' in html and "XID 79 &lt;riser&gt;" in html and "<riser>" not in html
    assert html.count("data-lifecycle=") == 1
