"""What the node_lifecycle action tells the lifecycle playbook, from a node's lifecycle rows and its runs: the fault
it is out for, the rungs tried since, the ladder's next rung with the stages its validation switches on, and whether
a validation passed after the last quarantine; and which nodes of a fleet report gpufleet_quarantine=critical
quarantines (the report's fail verdicts with a finding the ladder knows, never judged again)."""

from ansible_collections.kentino.gpufleet.plugins.action.node_lifecycle import describe, passed_since
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import repair_ladder
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle

T0 = 1.8e9
XID79 = "NVRM: Xid (PCI:0000:c1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def _rows(*steps, rows=()):
    rows = list(rows)
    for state, actor, extra in steps:
        # The lemon rule off: these tests are about one fault's ladder.
        rows += lifecycle.plan(rows, "n1", state, "why", actor, now=T0 + len(rows) * 60,
                               t={"gpufleet_lemon_quarantines": 0}, **extra)
    return rows


REMAP = {"code": "ROW_REMAP_PENDING", "gpu": "2"}


def _run(ts, verdict, playbook="burn_in"):
    return {"run_id": "r%d" % ts, "playbook": playbook, "ts": ts, "verdict": verdict}


def test_a_failed_validation_after_the_reset_leads_to_the_next_rung():
    rows = _rows(("quarantined", "audit", REMAP), ("repairing", "repair", {"evidence": ["rung: gpu_reset"]}),
                 ("validating", "repair", {}), ("quarantined", "burn_in", {}))
    info = describe(rows, [])
    assert info["state"] == "quarantined" and info["out_of_service"]
    assert (info["fault"]["code"], info["fault"]["gpu"], info["fault"]["ts"]) == ("ROW_REMAP_PENDING", "2", T0)
    assert info["tried"] == ["gpu_reset"] and info["next"]["rung"] == "reboot"
    assert info["next"]["validate"] == {"playbook": "burn_in", "gpufleet_burn_enabled": True,
                                        "gpufleet_dcgm_enabled": True, "gpufleet_nccl_enabled": False,
                                        "gpufleet_nvlink_enabled": False}
    assert info["quarantined_ts"] == T0 + 180


def test_the_ladder_starts_from_the_xid_of_the_evidence_and_a_new_fault_starts_it_again():
    rows = _rows(("quarantined", "watcher", {"code": "XID_CRITICAL", "evidence": [XID79]}))
    assert describe(rows, [])["next"]["rung"] == "bmc_power_cycle"
    assert describe(rows, [])["next"]["validate"] == {"playbook": "preflight"}
    rows = _rows(("validating", "operator:ana", {}), ("healthy", "preflight", {}), ("quarantined", "audit", REMAP),
                 rows=rows)
    assert describe(rows, [])["tried"] == [] and describe(rows, [])["next"]["rung"] == "gpu_reset"
    assert describe([], []) == dict(describe([], []), state="healthy", out_of_service=False, fault=None, next=None)


def test_only_a_passing_preflight_or_burn_in_after_the_last_quarantine_counts():
    newest_first = [_run(T0 + 300, "fail"), _run(T0 + 200, "pass", "audit"), _run(T0 - 100, "pass")]
    assert passed_since(newest_first, T0) is None
    assert passed_since([_run(T0 + 400, "warn", "preflight")] + newest_first, T0)["run_id"] == "r%d" % (T0 + 400)
    rows = _rows(("quarantined", "audit", REMAP))
    assert describe(rows, [_run(T0 + 60, "pass")])["validation_passed"]["playbook"] == "burn_in"
    assert describe(rows, [_run(T0 - 60, "pass")])["validation_passed"] is None


def _node(host, verdict, *findings, worst=None):
    return {"host": host, "verdict": verdict, "worst": worst, "findings": list(findings)}


def _finding(code, severity="fail", gpu=None, pci=None, evidence=()):
    return {"code": code, "severity": severity, "gpu": gpu, "pci": pci, "message": "%s on the node" % code,
            "evidence": list(evidence)}


def test_the_report_fail_verdicts_with_a_finding_the_ladder_knows_are_quarantined():
    remap = _finding("ROW_REMAP_PENDING", gpu=2, pci="0000:3a:00")
    xid = _finding("XID_UNKNOWN_CODE", pci="0000:c1:00", evidence=[XID79])
    doc = {"nodes": [
        _node("a", "fail", _finding("NCCL_SLOW", "warn"), remap, worst=remap),
        _node("b", "fail", xid),                                  # known through its XID line
        _node("c", "fail", _finding("CHECKPOINT_READONLY")),      # no rung fixes it: reported only
        _node("d", "warn", _finding("ROW_REMAP_PENDING", "warn")),  # not a fail verdict
        _node("e", "error", _finding("ROW_REMAP_PENDING")),       # could not be judged: never quarantined on a guess
    ]}
    found = repair_ladder.quarantine_candidates(doc)
    assert sorted(found) == ["a", "b"]
    assert found["a"] == {"code": "ROW_REMAP_PENDING", "gpu": "2", "evidence": [],
                          "message": "ROW_REMAP_PENDING on the node"}
    assert found["b"]["gpu"] == "0000:c1:00" and found["b"]["evidence"] == [XID79]


def test_the_query_names_the_return_to_service_an_alerts_fault_started_before():
    rows = _rows(("quarantined", "alert", REMAP), ("repairing", "repair", {}), ("validating", "repair", {}),
                 ("healthy", "repair", {}))
    back = rows[-1]["ts"]
    handled = describe(rows, [], started=back - 1)["handled"]
    assert handled == {"ts": back, "reason": "why", "actor": "repair", "at": "2027-01-15T08:03:00+00:00"}
    assert describe(rows, [], started=back + 1)["handled"] is None and describe(rows, [])["handled"] is None
