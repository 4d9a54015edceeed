"""The XID read before the burn comes from the identity snapshot's round trip (its fact gpufleet_xid): the report
and the history read it exactly as xid_facts' own registered read of older runs, and never take an audit's
snapshot (whose XIDs are the host's facts, the read after) for a mark."""

import copy
import json
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.records import xid_events_of
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import xid_before

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "report"
BURN = json.loads((FIXTURES / "sim_burn_in.json").read_text())["hosts"]
WITH_XIDS = sorted(h for h, hv in BURN.items()
                   if hv["gpufleet_xid_before"]["ansible_facts"]["gpufleet_xid"]["events"])


def marked_by_identity(hv):
    """The node as a burn-in records it now: the mark is the identity snapshot's fact, no gpufleet_xid_before."""
    hv = copy.deepcopy(hv)
    before = hv.pop("gpufleet_xid_before")["ansible_facts"]["gpufleet_xid"]
    hv["gpufleet_result_health_snapshot"]["ansible_facts"] = {"gpufleet_xid": before}
    return hv


def test_the_recording_has_nodes_with_xids_before_the_burn():
    assert len(WITH_XIDS) >= 2, WITH_XIDS


@pytest.mark.parametrize("name", sorted(BURN))
def test_the_identity_mark_is_judged_as_xid_facts_own_read(name):
    hv = BURN[name]
    assert rules.evaluate_node(name, marked_by_identity(hv)) == rules.evaluate_node(name, copy.deepcopy(hv))
    assert xid_events_of(marked_by_identity(hv)) == xid_events_of(hv)


def test_without_a_mark_the_xids_before_the_burn_are_not_seen():
    name = WITH_XIDS[0]
    hv = marked_by_identity(BURN[name])
    del hv["gpufleet_result_health_snapshot"]["ansible_facts"]
    assert xid_before(hv) is None
    assert xid_events_of(hv) != xid_events_of(BURN[name])


def test_an_audit_snapshot_is_not_a_mark():
    hv = marked_by_identity(BURN[WITH_XIDS[0]])
    hv["gpufleet_result_health_snapshot"]["mode"] = "audit"
    assert xid_before(hv) is None
