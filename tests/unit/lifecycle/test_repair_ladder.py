"""The repair ladder as data: where each finding starts (an XID 79 behind a riser is not fixed by a GPU reset; a
pending row remap is), the fabric manager only on NVSwitch machines, every rung followed by a validation, rma last;
and every finding code the ladder names is one the collection makes."""

from ansible_collections.kentino.gpufleet.plugins.plugin_utils import repair_ladder
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import codes

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def test_xid_79_starts_at_the_power_cycle_and_a_pending_remap_at_the_gpu_reset():
    assert [s["rung"] for s in repair_ladder.plan("XID_CRITICAL", repair_ladder.xid_of([XID79]))] == [
        "bmc_power_cycle", "rma"]
    assert [s["rung"] for s in repair_ladder.plan("ROW_REMAP_PENDING")] == ["gpu_reset", "reboot", "bmc_power_cycle",
                                                                            "rma"]
    assert [s["rung"] for s in repair_ladder.plan("ROW_REMAP_PENDING", nvswitch=True)][:2] == [
        "gpu_reset", "fabric_manager_restart"]
    assert repair_ladder.plan("PSU_RAIL_LOSS")[0]["rung"] == "rma"
    assert all(s["validate"]["playbook"] in ("preflight", "burn_in") for s in repair_ladder.plan("BURN_FAULTY"))


def test_the_next_rung_follows_what_was_tried_and_ends_at_rma():
    assert repair_ladder.next_rung("ROW_REMAP_PENDING", ["gpu_reset"])["rung"] == "reboot"
    assert repair_ladder.next_rung("ROW_REMAP_PENDING", ["gpu_reset", "reboot", "bmc_power_cycle", "rma"])["rung"] == "rma"
    assert repair_ladder.next_rung("UNKNOWN_CODE", [])["rung"] == "reboot"


def test_every_code_of_the_ladder_is_a_finding_the_collection_makes():
    known = set(codes.table())
    named = {c for c in repair_ladder.START if not c.startswith("XID_") or c in ("XID_CRITICAL", "XID_RMA")}
    assert named - known == set()
