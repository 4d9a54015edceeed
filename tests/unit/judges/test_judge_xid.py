"""judge_xid: lost GPUs (riser, PSU rail, underpowered), RMA XIDs, the slow ECC leak, other catalogued XIDs, GPUs the
driver could not initialise; the timeline; bad input."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_xid
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import resolve
from hypothesis import given, settings
from judgelib import BAD_TOP, GARBAGE, HOST, check_shape, codes, door, only, thresholds

PCI = ["0000:18:00", "0000:2a:00", "0000:3a:00", "0000:5d:00", "0000:9a:00", "0000:ab:00", "0000:ba:00", "0000:db:00"]
GPUS = dict((pci, i) for i, pci in enumerate(PCI))
RAILS = {"A": [0, 1, 2, 3], "B": [4, 5, 6, 7]}


def xid(code, index, second=0.0, **extra):
    event = {"xid": code, "pci": PCI[index], "time": "2026-03-01T10:00:%06.3f+00:00" % second,
             "line": "NVRM: Xid (PCI:%s): %d, pid=1234, name=python, test" % (PCI[index], code)}
    event.update(extra)
    return event


def lost(index, second=0.0, line=None):
    return {"index": None, "pci": PCI[index], "time_s": 1772359200.0 + second, "why": "lost (gpu_sample)",
            "line": line or "Unable to determine the device handle for GPU %s.0: GPU is lost" % PCI[index].upper()}


def judge(events, lost_gpus=(), gpus=GPUS, **t):
    findings, timeline = judge_xid.judge(list(events), list(lost_gpus), thresholds(**t), HOST, gpus)
    check_shape(findings)
    return findings, timeline


def test_no_event_no_finding():
    assert judge([]) == ([], [])


def test_xid_79_is_a_lost_gpu_blamed_on_the_riser_first():
    findings, timeline = judge([xid(79, 2)])
    f = only(findings, "GPU_LOST")
    assert (f["severity"], f["gpu"], f["pci"]) == ("fail", 2, "0000:3a:00")
    assert "fell off the bus (XID 79)" in f["message"] and "reseat the riser" in f["action"]
    assert "before any RMA" in f["action"] and f["evidence"] == [xid(79, 2)["line"]]
    assert [(e["xid"], e["gpu"]) for e in timeline] == [(79, 2)]


def test_lost_xids_are_a_threshold():
    assert codes(judge([xid(79, 2)], gpufleet_lost_xids=[])[0]) == [("XID_CRITICAL", 2)]


def test_lost_gpu_from_nvidia_smi_without_an_xid_and_its_index_from_bus_order():
    # nvidia-smi still shows GPUs 0, 1, 3 (PCI bus order): the lost 0000:3a:00 was GPU 2
    known = {PCI[0]: 0, PCI[1]: 1, PCI[3]: 3}
    f = only(judge([], [lost(2)], gpus=known)[0], "GPU_LOST")
    assert f["gpu"] == 2 and "index 2 inferred from PCI bus order" in f["message"]
    # not inferred when the known indices do not follow the bus order
    f = only(judge([], [lost(2)], gpus={PCI[0]: 1, PCI[1]: 0})[0], "GPU_LOST")
    assert f["gpu"] is None and f["pci"] == "0000:3a:00"


def test_insufficiently_powered_is_its_own_finding():
    line = "Unable to determine the device handle for GPU 0000:3A:00.0: GPU requires an insufficiently powered state"
    findings, _ = judge([], [lost(2, line=line)])
    f = only(findings, "GPU_UNDERPOWERED")
    assert f["gpu"] == 2 and "power cables" in f["action"]
    assert "GPU_LOST" not in [c for c, _ in codes(findings)]


@pytest.mark.parametrize("spread, expected", [
    (5.0, ["PSU_RAIL_LOSS", "GPU_LOST", "GPU_LOST"]), (5.01, ["GPU_LOST", "GPU_LOST"])])
def test_two_gpus_of_one_rail_within_the_window_are_that_psu(spread, expected):
    findings, _ = judge([xid(79, 4, 0.0), xid(79, 5, spread)], gpufleet_psu_rails=RAILS)
    assert [c for c, _ in codes(findings)] == expected
    if spread <= 5.0:
        rail = findings[0]
        assert "GPUs 4, 5 (PSU B rail) were lost together within 5.000 s" in rail["message"]
        assert "split rails are not redundancy" in rail["action"]
        assert all("PSU B first" in f["action"] for f in findings[1:]), "each GPU's action points at the PSU"


def test_psu_window_is_a_threshold_and_a_whole_rail_needs_no_window():
    events = [xid(79, 4, 0.0), xid(79, 5, 30.0)]
    assert codes(judge(events, gpufleet_psu_rails=RAILS)[0])[0][0] == "GPU_LOST"
    assert codes(judge(events, gpufleet_psu_rails=RAILS, gpufleet_psu_loss_window_s=30.0)[0])[0][0] == \
        "PSU_RAIL_LOSS"
    whole = [xid(79, i, 100.0 * i) for i in (4, 5, 6, 7)]
    rail = judge(whole, gpufleet_psu_rails=RAILS)[0][0]
    assert rail["code"] == "PSU_RAIL_LOSS" and "the whole rail" in rail["message"]


def test_without_a_rail_map_gpus_lost_together_are_a_group():
    findings, _ = judge([xid(79, 4, 0.0), xid(79, 6, 0.002)])
    f = findings[0]
    assert f["code"] == "GPU_GROUP_LOST" and "2 GPUs fell off the bus within 0.002 s" in f["message"]
    assert "gpufleet_psu_rails" in f["action"]
    assert "GPU_GROUP_LOST" not in [c for c, _ in codes(judge([xid(79, 4, 0.0), xid(79, 6, 9.0)])[0])]


@pytest.mark.parametrize("code", [48, 63, 64])
def test_rma_xids(code):
    f = only(judge([xid(code, 1)])[0], "XID_RMA")
    assert (f["severity"], f["gpu"]) == ("fail", 1) and "replace the card (RMA)" in f["action"]


def test_rma_and_leak_xids_are_thresholds_and_grouped_per_gpu():
    assert codes(judge([xid(63, 1)], gpufleet_rma_xids=[48])[0]) == [("XID_CRITICAL", 1)]
    f = only(judge([xid(92, 3, 1.0), xid(92, 3, 2.0)])[0], "ECC_LEAK")
    assert (f["severity"], f["gpu"]) == ("warn", 3) and "2 single-bit ECC XID(s) 92" in f["message"]
    assert codes(judge([xid(92, 3)], gpufleet_ecc_leak_xids=[])[0]) == [("XID_WARNING", 3)]


@pytest.mark.parametrize("event, code, severity", [
    (xid(95, 0), "XID_CRITICAL", "fail"), (xid(13, 0), "XID_WARNING", "warn"), (xid(9999, 0), "XID_WARNING", "warn")])
def test_other_catalogued_xids_by_catalog_severity(event, code, severity):
    f = only(judge([event])[0], code)
    assert f["severity"] == severity and "NVIDIA XID catalog, XID %d" % event["xid"] in f["action"]


@pytest.mark.parametrize("status, code, severity", [("Nonfatal", "XID_WARNING", "warn"),
                                                    ("Fatal", "XID_CRITICAL", "fail")])
def test_xid_145_follows_the_line_s_own_severity(status, code, severity):
    """XID 145 is critical in the catalog and refined per line: a Nonfatal NVLink5 error warns (and tickets), a Fatal
    one fails (and pages); the policy, not the code, decides."""
    event = xid(145, 0, details={"nvlink": {"unit": "RLW_REMAP", "fatal": status == "Fatal"}})
    f = only(judge([event])[0], code)
    assert f["severity"] == severity and ("severity %s" % ("critical" if severity == "fail" else "warning")) in f["message"]


def test_a_site_override_moves_a_listed_code_to_the_finding_of_its_severity():
    """A site that rates XID 63 a warning gets a warning, not XID_RMA's fail; one that pages on XID 92 gets a fail."""
    assert codes(judge([xid(63, 1)], gpufleet_xid_severity_overrides={"63": "warning"})[0]) == [("XID_WARNING", 1)]
    assert codes(judge([xid(92, 1)], gpufleet_xid_severity_overrides={"92": "critical"})[0]) == [("XID_CRITICAL", 1)]
    assert judge([xid(48, 1)], gpufleet_xid_severity_overrides={"48": "info"})[0] == []


def test_info_xids_and_consequences_are_timeline_only():
    follow = xid(45, 0, 1.0, correlated_with={"xid": 79}, counted=False)
    findings, timeline = judge([xid(79, 0, 0.0), follow])
    assert codes(findings) == [("GPU_LOST", 0)]
    assert [e["xid"] for e in timeline] == [79, 45]
    # a 45 that follows another XID is info: no finding, even when counted
    assert judge([xid(45, 0, correlated_with={"xid": 13})])[0] == []


def test_site_severity_overrides():
    assert judge([xid(13, 0)], gpufleet_xid_severity_overrides={"13": "info"})[0] == []
    f = only(judge([xid(13, 0)], gpufleet_xid_severity_overrides={13: "critical"})[0], "XID_CRITICAL")
    assert f["severity"] == "fail"


def test_timeline_is_in_time_order():
    _, timeline = judge([xid(13, 0, 9.0), xid(31, 1, 1.0), {"xid": 13, "pci": PCI[2], "line": "no time"}])
    assert [e["gpu"] for e in timeline] == [1, 0, 2]


def test_gpu_init_failed():
    failures = [{"pci": "0000:3A:00.0", "code": "0x11:0x45:2525", "count": 3,
                 "evidence": ["NVRM: GPU 0000:3a:00.0: RmInitAdapter failed! (0x11:0x45:2525)"]},
                {"minor": 0, "code": "0x30:0xffff:660", "line": "NVRM: RmInitAdapter failed! (0x30:0xffff:660)"}]
    findings = check_shape(judge_xid.judge_init_failures(failures, HOST, GPUS))
    assert codes(findings) == [("GPU_INIT_FAILED", 2), ("GPU_INIT_FAILED", None)]
    assert "3 attempt(s)" in findings[0]["message"] and "GPU minor 0" in findings[1]["message"]
    assert judge_xid.judge_init_failures([], HOST) == [] and judge_xid.judge_init_failures(None, HOST) == []


@pytest.mark.parametrize("bad", BAD_TOP)
def test_bad_input_never_raises(bad):
    findings, timeline = judge_xid.judge(bad, [], {}, HOST)
    check_shape(findings)
    findings, timeline = judge_xid.judge([], bad, {}, HOST)
    check_shape(findings)
    check_shape(judge_xid.judge_init_failures(bad, HOST))


@pytest.mark.parametrize("event", [
    None, "x", {}, {"xid": "79"}, {"xid": None, "pci": 5}, {"xid": 79, "pci": "garbage", "time": 12},
    {"xid": 154, "pci": PCI[0], "details": {"recovery_action_to": None}}, {"xid": 13, "details": "x"},
    {"xid": 79, "time": "not a time"},
])
def test_events_of_the_wrong_shape_are_refused_at_the_door_or_judged(event):
    """An XID read whose events do not match xid_facts' schema is refused (RESULT_INVALID) before the judge; one the
    schema accepts is judged beside the others, never raising."""
    read = {"events": [event, xid(79, 1)], "lost_gpus": []}
    found = door("xid_facts", read, lambda data: codes(judge_xid.judge(data["events"], [lost(2)], thresholds(),
                                                                        HOST, GPUS)[0]))
    assert found is None or (("GPU_LOST", 1) in found and ("GPU_LOST", 2) in found)


def test_lost_entries_that_are_not_mappings_are_said_and_the_others_judged():
    findings, _ = judge_xid.judge([xid(79, 1)], [None, lost(2)], thresholds(), HOST, GPUS)
    assert ("GPU_LOST", 1) in codes(findings) and ("GPU_LOST", 2) in codes(findings)
    assert "lost GPU None is not a mapping" in " ".join(only(findings, "CHECK_ERROR")["evidence"])


def test_overrides_of_the_wrong_type_are_refused_with_the_thresholds():
    """The inventory's overrides are checked where every threshold is (thresholds.resolve: the run guard refuses
    them before the run, the report says CONFIG_INVALID): the judge never sees them."""
    _t, _sources, errors = resolve({"gpufleet_xid_severity_overrides": {"x": "info"}}, HOST)
    assert errors and "gpufleet_xid_severity_overrides" in errors[0]
    _t, _sources, errors = resolve({"gpufleet_xid_severity_overrides": {"13": "fatal"}}, HOST)
    assert errors
    t, _sources, errors = resolve({"gpufleet_xid_severity_overrides": {"13": "critical"}}, HOST)
    assert not errors and t["gpufleet_xid_severity_overrides"] == {"13": "critical"}


@settings(max_examples=200, deadline=None)
@given(GARBAGE)
def test_fuzz_is_refused_or_judged(events):
    door("xid_facts", {"events": events, "lost_gpus": []},
         lambda data: (check_shape(judge_xid.judge(data["events"], [], thresholds(), HOST, GPUS)[0]),
                       check_shape(judge_xid.judge_init_failures(data.get("init_failures"), HOST, GPUS))))
