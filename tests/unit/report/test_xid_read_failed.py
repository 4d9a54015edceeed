"""An XID read that failed is an error, never a window without XIDs: the host's fact gpufleet_xid still holds the
read before the burn when the read after it fails, and the report judged that mark alone as a pass."""

import copy
import json
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import xid_after

REPO = Path(__file__).resolve().parents[3]
BURN = json.loads((REPO / "tests" / "fixtures" / "report" / "sim_burn_in.json").read_text())["hosts"]
MSG = "stage xid_window failed: journalctl: Failed to open journal: Permission denied"


def window_failed(hv):
    """The node as the stage's rescue leaves it: its result failed, the host's fact still the mark before the burn."""
    hv = copy.deepcopy(hv)
    hv["gpufleet_result_xid_facts"] = {"failed": True, "stage": "xid_window", "msg": MSG}
    hv["gpufleet_stage_failures"] = [{"stage": "xid_window", "result": "xid_facts", "msg": MSG}]
    before = hv["gpufleet_xid_before"]["ansible_facts"]["gpufleet_xid"]
    hv["ansible_facts"]["gpufleet_xid"] = copy.deepcopy(before)
    return hv


def test_a_healthy_node_whose_window_read_failed_is_an_error_not_a_pass():
    assert rules.evaluate_node("sim-node01", copy.deepcopy(BURN["sim-node01"]))["verdict"] == "pass"
    node = rules.evaluate_node("sim-node01", window_failed(BURN["sim-node01"]))
    assert node["verdict"] == "error"
    assert node["checks"]["xid_facts"]["verdict"] == "error"
    finding = next(f for f in node["findings"] if f["check"] == "xid_facts")
    assert finding["code"] == "CHECK_ERROR" and MSG in finding["message"] and "sim-node01" in finding["message"]
    assert "unknown, not absent" in finding["action"]


def test_the_events_of_the_read_before_still_count_when_the_window_failed():
    hv = window_failed(BURN["sim-node04"])
    window = BURN["sim-node04"]["gpufleet_result_xid_facts"]["ansible_facts"]["gpufleet_xid"]
    hv["gpufleet_xid_before"]["ansible_facts"]["gpufleet_xid"] = copy.deepcopy(window)  # what it saw came before
    hv["ansible_facts"]["gpufleet_xid"] = copy.deepcopy(window)
    node = rules.evaluate_node("sim-node04", hv)
    whole = rules.evaluate_node("sim-node04", copy.deepcopy(BURN["sim-node04"]))
    codes = {f["code"] for f in node["findings"] if f["check"] == "xid_facts"}
    assert {f["code"] for f in whole["findings"] if f["check"] == "xid_facts"} | {"CHECK_ERROR"} == codes
    assert node["checks"]["xid_facts"]["figures"] == whole["checks"]["xid_facts"]["figures"]


def test_a_skipped_read_and_a_run_without_one_are_not_errors():
    hv = copy.deepcopy(BURN["sim-node01"])
    fact = hv["ansible_facts"]["gpufleet_xid"]
    assert xid_after(hv, {"xid_facts": {"skipped": True, "skip_reason": "check mode"}}) == (fact, None)
    assert xid_after(hv, {}) == (fact, None)  # an audit: its snapshot's read is the host's fact
    assert xid_after(hv, {"xid_facts": {"failed": True}}) == (None, "the read failed without a message")
