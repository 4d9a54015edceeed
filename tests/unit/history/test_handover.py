"""The customer handover sheet states the machine's current verdict first: a machine whose audits fail since its
burn-in, or whose driver changed since, is refused (or, with force, marked so first); the history's internal figures
never reach it. On main such a machine got a green BURN-IN PASS, GPU 2 PASS, "None: every check passed" and the new
driver shown as the burn-in's, beside "bios_reference=group ... (< 3)" and "compared=0 recorded=10"."""

import json
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import report
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import handover
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.records import node_record, run_record
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import FILE_NAME, History
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import history as history_rules

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "report" / "sim_burn_in.json"
DAY = 86400.0
T0 = 1.8e9


def _history(tmp_path, audit_verdict="fail", driver_now=None):
    """sim-node01 burned in (pass, the recorded run), then audited three times."""
    hosts = json.loads(FIXTURE.read_text())["hosts"]
    hv = {"sim-node01": hosts["sim-node01"]}
    nodes = report.evaluate_fleet(["sim-node01"], hv)
    path = tmp_path / FILE_NAME
    with History(path) as history:
        records = history_rules.annotate(nodes, hv, history, T0, "burn_in")
        doc = report.build_report(nodes, "burn-1", playbook="burn_in", finished="2027-01-15T08:00:00+00:00")
        history.record(run_record(doc), records)
        for day in (1, 2, 3):
            node = json.loads(json.dumps(nodes[0]))
            rec = node_record(node, hv["sim-node01"], T0 + day * DAY, "audit")
            rec.update(ts=T0 + day * DAY, verdict=audit_verdict, codes="ECC_LEAK,XID_RMA" if audit_verdict == "fail"
                       else None)
            if driver_now:
                rec["versions"] = dict(rec["versions"] or {}, driver=driver_now)
            for gpu in rec["gpus"]:
                gpu["ts"] = rec["ts"]
                gpu["verdict"] = "fail" if audit_verdict == "fail" and gpu["idx"] == 2 else "pass"
            history.record({"run_id": "audit-%d" % day, "playbook": "audit", "started": None, "finished": None,
                            "ts": T0 + day * DAY, "verdict": audit_verdict, "interrupted": False}, [rec])
    return path


def test_a_machine_failing_its_audits_is_refused_then_marked_first_when_forced(tmp_path):
    path = _history(tmp_path)
    with pytest.raises(handover.HandoverRefused, match="newest run .*audit-3.* is FAIL: ECC_LEAK, XID_RMA.*--force"):
        handover.write(path, ["sim-node01"], tmp_path / "out")
    assert not (tmp_path / "out" / "handover.html").exists()
    written = handover.write(path, ["sim-node01"], tmp_path / "out", force=True)
    html = Path(written["html"]).read_text()
    first = html.index('data-current="fail"')
    assert first < html.index("burn-in pass") and first < html.index('data-blocked="sim-node01"') < \
        html.index("burn-in pass"), "the current verdict and the warning come before the burn-in's proof"
    row = html.split('<tr data-gpu="2">', 1)[1].split("</tr>", 1)[0]
    assert 'v-fail">fail' in row, "GPU 2 shows its current verdict beside the burn-in's"
    assert "None: every check of the burn-in passed (the newest run found ECC_LEAK, XID_RMA, above)" in html


def test_a_version_changed_since_the_burn_in_is_not_shown_as_burned_in(tmp_path):
    path = _history(tmp_path, audit_verdict="pass", driver_now="575.51.03")
    with pytest.raises(handover.HandoverRefused, match="versions changed since its burn-in .driver .* -> 575.51.03"):
        handover.write(path, ["sim-node01"], tmp_path / "out")
    html = Path(handover.write(path, ["sim-node01"], tmp_path / "out", force=True)["html"]).read_text()
    assert 'data-changed="driver"' in html and "575.51.03 now" in html and "not burned in" in html


def test_internal_text_never_reaches_the_sheet(tmp_path):
    path = _history(tmp_path, audit_verdict="pass")
    written = handover.write(path, ["sim-node01"], tmp_path / "out")
    html = Path(written["html"]).read_text()
    assert written["forced"] == [] and 'data-blocked' not in html and 'data-current="pass"' in html
    for internal in ("bios_reference", "_reference=", "compared=", "recorded=", "budget_s", ">trend<", ">drift<",
                     ">baseline<", "stopped_early", "threshold_source"):
        assert internal not in html, internal
    assert "busbw_gbps=" in html and ">nccl_test<" in html, "the customer's figures stay"


def test_a_quarantined_machine_is_refused_and_its_lifecycle_is_on_the_sheet(tmp_path):
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.lifecycle import transition

    path = _history(tmp_path, audit_verdict="pass")
    with History(path) as history:
        transition(history, "sim-node01", "quarantined", "XID 79 on GPU 2", "watcher", code="XID_CRITICAL",
                   gpu="0000:3b:00", evidence=["NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."],
                   now=T0 + 4 * DAY)
    with pytest.raises(handover.HandoverRefused, match=r"it is quarantined since .* \(XID 79 on GPU 2, by watcher\)"):
        handover.write(path, ["sim-node01"], tmp_path / "out")
    html = Path(handover.write(path, ["sim-node01"], tmp_path / "out", force=True)["html"]).read_text()
    table = html.split('data-lifecycle="quarantined"', 1)[1].split("</table>", 1)[0]
    assert "XID_CRITICAL" in table and "GPU has fallen off the bus." in table and "watcher" in table
    with History(path) as history:
        for state, actor in (("repairing", "repair"), ("validating", "repair"), ("healthy", "preflight")):
            transition(history, "sim-node01", state, "ladder", actor, now=T0 + 5 * DAY)
    html = Path(handover.write(path, ["sim-node01"], tmp_path / "out")["html"]).read_text()
    assert 'data-lifecycle="healthy"' in html, "a repaired, validated machine is handed over with its history"
