"""judge_nvlink: the fabric manager, the fabric state, links down or slow, the error counters' rise; bad input."""

import copy

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_nvlink
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import schema_errors
from hypothesis import given, settings
from hypothesis import strategies as st
from judgelib import HOST, check_shape, codes, door, only, thresholds

DRIVER = "570.172.08"


def hgx(gpus=8, links=18, speed=26.562, driver=DRIVER, fm_version=DRIVER, active="active", enabled="enabled",
        fm_installed=True, read_at=1000.0, nvswitch=True, fabric=("completed", "Success")):
    """An nvlink_facts read of a healthy HGX H100 (what the module returns), to be spoiled by each test."""
    out = {"read_at": read_at, "gathered": ["platform", "fabric_manager", "gpus", "fabric", "nvlink", "counters",
                                            "topology"],
           "driver_version": driver, "interconnect": "nvswitch" if nvswitch else "pcie",
           "platform": {"nvswitch": nvswitch, "nvlink5": False, "generation": "nvswitch" if nvswitch else None,
                        "nvswitch_pci": ["0000:05:00.0"] if nvswitch else [], "nvswitch_driver_devices": None,
                        "nvlink5_bridges": [], "evidence": []},
           "fabric_manager": {"service": "nvidia-fabricmanager", "load_state": "loaded" if fm_installed else "not-found",
                              "active_state": active, "sub_state": "running" if active == "active" else "dead",
                              "unit_file_state": enabled if fm_installed else None, "exec_main_status": "0",
                              "package": "nvidia-fabricmanager-570" if fm_installed else None,
                              "version": fm_version + "-1" if fm_installed else None,
                              "upstream_version": fm_version if fm_installed else None,
                              "nscq_package": "libnvidia-nscq-570" if fm_installed else None,
                              "nscq_version": fm_version + "-1" if fm_installed else None,
                              "packages": [], "errors": []},
           "gpus": [], "topology": None, "baseline": None, "problems": [], "unparsed": {}}
    names = ["GPU%d" % i for i in range(gpus)]
    out["topology"] = {"devices": names, "gpus": list(range(gpus)), "pairs": [], "nics": {}, "interconnect": "nvlink",
                       "affinity": {},
                       "matrix": dict((a, dict((b, "X" if a == b else "NV%d" % links) for b in names)) for a in names)}
    for i in range(gpus):
        out["gpus"].append({
            "index": i, "pci": "0000:%02x:00" % (0x18 + i), "uuid": "GPU-%04d" % i, "name": "NVIDIA H100 80GB HBM3",
            "fabric_state": fabric[0] if nvswitch else None, "fabric_status": fabric[1] if nvswitch else None,
            "fabric_clique_id": None, "fabric_cluster_uuid": None, "fabric_health_summary": None,
            "fabric_health_bandwidth": None, "nvlink_present": links > 0, "nvlink_all_inactive": False,
            "nvlink_links_total": links or None, "nvlink_links_up": links or None,
            "nvlink_links": [{"link": n, "up": True, "speed_gbps": speed} for n in range(links)] if links else None,
            "nvlink_counters": [{"link": n, "crc_errors": 0, "replay_errors": 0, "recovery_errors": 0,
                                 "counters": {"crc_errors": 0, "replay_errors": 0, "recovery_errors": 0}}
                                for n in range(links)] if links else None,
            "nvlink_crc_errors_total": 0 if links else None, "nvlink_replay_errors_total": 0 if links else None,
            "nvlink_recovery_errors_total": 0 if links else None, "evidence": ["GPU %d: NVIDIA H100 80GB HBM3" % i]})
    return out


def judge(read, **t):
    assert schema_errors("nvlink_facts", read) == []
    return check_shape(judge_nvlink.judge(read, thresholds(**t), HOST))


def test_a_healthy_hgx_passes_with_its_figures():
    read = hgx()
    assert judge(read) == []
    fig = judge_nvlink.figures(read, thresholds())
    assert fig["interconnect"] == "nvswitch" and fig["fabric_complete"] == "8/8"
    assert fig["links_up"] == fig["links_total"] == 144
    assert fig["fabric_manager"] == "nvidia-fabricmanager-570 570.172.08 (active)"
    assert fig["topology"].splitlines()[1].split()[:3] == ["GPU0", "X", "NV18"]


def test_a_pcie_node_is_not_judged():
    read = hgx(links=0, nvswitch=False)
    read["fabric_manager"] = None
    assert judge_nvlink.not_applicable(read).startswith("no NVLink and no NVSwitch")
    assert judge(read) == []


def test_fabric_manager_missing():
    read = hgx(fm_installed=False, active="inactive", fabric=("in_progress", None))
    found = codes(judge(read))
    assert found[0] == ("FABRIC_MANAGER_MISSING", None)
    assert set(found[1:]) == {("FABRIC_STATE_INCOMPLETE", i) for i in range(8)}
    f = only(judge(read), "FABRIC_MANAGER_MISSING")
    assert "error 802" in f["message"] and "kentino.gpufleet.fabric_manager" in f["action"] and DRIVER in f["action"]


def test_fabric_manager_stopped_explains_the_fabric_and_the_links():
    read = hgx(active="inactive", enabled="disabled", fabric=("in_progress", None))
    for gpu in read["gpus"]:  # without the fabric manager no link trains: they are a consequence, not findings
        gpu["nvlink_links"] = [dict(link, up=False, speed_gbps=None) for link in gpu["nvlink_links"]]
        gpu["nvlink_links_up"] = 0
    findings = judge(read)
    assert [c for c, _g in codes(findings)] == ["FABRIC_MANAGER_STOPPED"] + ["FABRIC_STATE_INCOMPLETE"] * 8
    stopped = only(findings, "FABRIC_MANAGER_STOPPED")
    assert "systemctl enable --now nvidia-fabricmanager" in stopped["action"]
    assert "every NVLink stays down until it runs" in stopped["message"]
    assert "fix the fabric manager first" in findings[1]["action"]


def test_fabric_manager_at_another_version():
    read = hgx(fm_version="570.148.08", active="failed")
    found = judge(read)
    mismatch = only(found, "FABRIC_MANAGER_VERSION_MISMATCH")
    assert "570.148.08 does not match the driver 570.172.08" in mismatch["message"]
    assert "nvidia-fabricmanager-570=570.172.08-*" in mismatch["action"]
    assert only(found, "FABRIC_NSCQ_VERSION_MISMATCH")["severity"] == "warn"
    assert only(found, "FABRIC_MANAGER_STOPPED")


def test_running_but_not_enabled_warns():
    assert codes(judge(hgx(enabled="disabled"))) == [("FABRIC_MANAGER_NOT_ENABLED", None)]


def test_a_gpu_that_did_not_register_while_the_fabric_manager_runs():
    read = hgx()
    read["gpus"][6]["fabric_status"] = "Insufficient Resources"
    f = only(judge(read), "FABRIC_STATE_INCOMPLETE")
    assert f["gpu"] == 6 and f["pci"] == "0000:1e:00" and "status Insufficient Resources" in f["message"]
    assert "journalctl -u nvidia-fabricmanager" in f["action"]


HEALTHY = {"fabric_health_summary": "Healthy", "fabric_health_bandwidth": "Full",
           "fabric_health_route_recovery": "False", "fabric_health_route_unhealthy": "False",
           "fabric_health_access_timeout_recovery": "False", "fabric_health_incorrect_configuration": "None"}


def test_a_registered_gpu_whose_fabric_health_is_unhealthy_fails():
    """State Completed and Status Success, but the driver's fabric health says Unhealthy (a route is unhealthy):
    the GPU is on the fabric and still cannot be trusted with NVLink traffic."""
    read = hgx()
    for gpu in read["gpus"]:
        gpu.update(HEALTHY)
    read["gpus"][5].update({"fabric_health_summary": "Unhealthy", "fabric_health_route_unhealthy": "True"})
    found = judge(read)
    assert codes(found) == [("FABRIC_HEALTH_UNHEALTHY", 5)]
    f = found[0]
    assert f["severity"] == "fail" and f["pci"] == "0000:1d:00"
    assert "fabric health is Unhealthy" in f["message"] and "route unhealthy" in f["message"]
    assert "Summary=Unhealthy" in " ".join(f["evidence"]) and "nvidia-smi nvlink" in f["action"]


def test_fabric_health_of_older_drivers_summary_only_and_a_degraded_bandwidth():
    read = hgx()
    read["gpus"][0].update({"fabric_health_summary": "Unhealthy", "fabric_health_bandwidth": "Full"})
    read["gpus"][3].update(dict(HEALTHY, fabric_health_summary="Limited Capacity",
                                fabric_health_bandwidth="Degraded"))
    read["gpus"][4].update(dict(HEALTHY, fabric_health_summary="Unhealthy", fabric_health_route_recovery="True"))
    read["gpus"][6].update(dict(HEALTHY, fabric_health_summary=None,
                                fabric_health_incorrect_configuration="Insufficient Nvlinks"))
    found = judge(read)
    assert codes(found) == [("FABRIC_HEALTH_UNHEALTHY", 0), ("FABRIC_BANDWIDTH_DEGRADED", 3),
                            ("FABRIC_HEALTH_UNHEALTHY", 4), ("FABRIC_HEALTH_UNHEALTHY", 6)]
    assert "rerun" in found[2]["action"] and "route recovery in progress" in found[2]["message"]
    assert "incorrect configuration Insufficient Nvlinks" in found[3]["message"]
    assert "Limited Capacity" in found[1]["message"]
    # A GPU that did not register at all is said once, as not registered: its health is evidence of that.
    read = hgx()
    read["gpus"][2].update({"fabric_status": "Insufficient Resources", "fabric_health_summary": "Unhealthy",
                            "fabric_health_bandwidth": "Degraded"})
    assert codes(judge(read)) == [("FABRIC_STATE_INCOMPLETE", 2)]


MISMATCH_LINE = ("fabric manager NVIDIA GPU driver interface version 570.148.08 don't match with driver version "
                 "570.172.08. Please update with matching NVIDIA driver package.")
NOTHING_TO_DO_LINE = ("request to query NVSwitch device information from NVSwitch driver failed with error:WARNING "
                      "Nothing to do [NV_WARN_NOTHING_TO_DO]")


def journal(*events):
    return {"read": True, "error": None, "lines": 5, "events": list(events)}


def test_the_fabric_managers_journal_names_a_version_mismatch_the_packages_do_not_show():
    """A fabric manager that is no dpkg package (an RPM machine, a driver container): its own journal line says it
    exited for a version mismatch, with both versions, and the fix follows from them exactly."""
    read = hgx(active="failed", fabric=("in_progress", None))
    fm = read["fabric_manager"]
    fm.update({"package": None, "version": None, "upstream_version": None, "nscq_package": None, "nscq_version": None,
               "errors": ["dpkg-query not found: the installed package versions are unknown"],
               "journal": journal({"kind": "driver_version_mismatch", "fabric_manager_version": "570.148.08",
                                   "driver_version": DRIVER, "line": MISMATCH_LINE, "at": 1000.0})})
    found = judge(read)
    mismatch = only(found, "FABRIC_MANAGER_VERSION_MISMATCH")
    assert "570.148.08" in mismatch["message"] and "570.172.08" in mismatch["message"]
    assert "at exactly the driver's version 570.172.08" in mismatch["action"]
    assert MISMATCH_LINE in mismatch["evidence"]
    assert only(found, "FABRIC_MANAGER_STOPPED") and not [f for f in found if f["code"] == "FABRIC_MANAGER_MISSING"]


def test_a_mismatch_the_fabric_manager_logged_before_it_was_fixed_is_no_finding():
    read = hgx()  # active now, at the driver's version: the journal's older mismatch line is history
    read["fabric_manager"]["journal"] = journal({"kind": "driver_version_mismatch", "fabric_manager_version":
                                                 "570.148.08", "driver_version": DRIVER, "line": MISMATCH_LINE,
                                                 "at": 900.0})
    assert judge(read) == []


def test_nothing_to_do_on_a_machine_without_nvswitches_is_not_a_fault():
    """An NVLink-bridge (or direct NVLink) machine with the fabric manager installed: it exits with
    NV_WARN_NOTHING_TO_DO because there is no NVSwitch to manage, which is right."""
    read = hgx(nvswitch=False, active="failed")
    read["fabric_manager"]["journal"] = journal({"kind": "no_nvswitch", "line": NOTHING_TO_DO_LINE, "at": 1.0})
    assert judge(read) == []


def test_nothing_to_do_on_an_nvswitch_machine_says_why_the_fabric_manager_stopped():
    read = hgx(active="failed", fabric=("in_progress", None))
    read["platform"].update({"nvlink5": True, "generation": "nvlink5"})
    read["fabric_manager"]["journal"] = journal({"kind": "no_nvswitch", "line": NOTHING_TO_DO_LINE, "at": 1.0})
    stopped = only(judge(read), "FABRIC_MANAGER_STOPPED")
    assert "NV_WARN_NOTHING_TO_DO" in stopped["message"] and "NVLSM" in stopped["action"]
    assert NOTHING_TO_DO_LINE in stopped["evidence"]


def test_fabric_manager_state_unreadable_is_an_error_not_a_pass():
    read = hgx(fm_installed=False, active=None)
    read["fabric_manager"].update(load_state=None, errors=["systemctl not found: the service state is unknown"])
    assert codes(judge(read))[0] == ("FABRIC_MANAGER_UNREADABLE", None)


def test_a_link_down_names_the_gpu_the_link_and_the_pairs():
    read = hgx()
    read["gpus"][5]["nvlink_links"][11] = {"link": 11, "up": False, "speed_gbps": None}
    read["gpus"][5]["nvlink_links_up"] = 17
    f = only(judge(read), "NVLINK_LINK_DOWN")
    assert (f["gpu"], f["pci"]) == (5, "0000:1d:00")
    assert "NVLink 11 down (17 of 18 up)" in f["message"]
    assert "every pair GPU 5-GPU x (x = 0,1,2,3,4,6,7)" in f["message"]
    assert "RMA the baseboard" in f["action"] and "Link 11: <inactive>" in f["evidence"]


def test_all_links_inactive_and_a_gpu_listing_fewer_links():
    read = hgx()
    g = read["gpus"][1]
    g.update(nvlink_links=[], nvlink_links_total=None, nvlink_links_up=0, nvlink_all_inactive=True)
    read["gpus"][2]["nvlink_links"] = read["gpus"][2]["nvlink_links"][:16]
    read["gpus"][2]["nvlink_links_total"] = read["gpus"][2]["nvlink_links_up"] = 16
    found = judge(read)
    assert codes(found) == [("NVLINK_LINK_DOWN", 1), ("NVLINK_LINK_DOWN", 2)]
    assert "every NVLink is down" in found[0]["message"]
    assert "only 16 NVLinks listed, 18 expected (the most links a NVIDIA H100 80GB HBM3 of this node shows)" in \
        found[1]["message"]
    # A threshold changes the answer: 16 expected makes GPU 2 fine.
    assert codes(judge(read, gpufleet_nvlink_links_per_gpu=16)) == [("NVLINK_LINK_DOWN", 1)]


def test_a_slow_link_against_the_fastest_or_the_threshold():
    read = hgx()
    read["gpus"][3]["nvlink_links"][4]["speed_gbps"] = 13.281
    f = only(judge(read), "NVLINK_LINK_SLOW")
    assert f["gpu"] == 3 and "NVLink 4 at 13.281 GB/s, below 26.562 GB/s" in f["message"]
    assert judge(read, gpufleet_nvlink_min_link_speed_gbps=13.0) == []
    # A rated speed above every link fails all of them (the threshold wins over the node's own fastest link).
    assert len(judge(hgx(), gpufleet_nvlink_min_link_speed_gbps=30.0)) == 8


def test_direct_nvlink_pairs_name_the_bridge():
    read = hgx(gpus=3, links=4, nvswitch=False)
    read["fabric_manager"] = None
    read["interconnect"] = "mixed"
    m = read["topology"]["matrix"]
    m["GPU0"]["GPU2"] = m["GPU2"]["GPU0"] = m["GPU1"]["GPU2"] = m["GPU2"]["GPU1"] = "NODE"
    m["GPU0"]["GPU1"] = m["GPU1"]["GPU0"] = "NV3"
    read["gpus"][0]["nvlink_links"][2] = {"link": 2, "up": False, "speed_gbps": None}
    f = only(judge(read), "NVLINK_LINK_DOWN")
    assert "the NVLink pair(s) GPU 0-GPU1 (NV3)" in f["message"] and "NVLink bridge of GPU 0-GPU1 (NV3)" in f["action"]


def counters(read, gpu, link, crc=0, replay=0, recovery=0):
    c = read["gpus"][gpu]["nvlink_counters"][link]
    c.update(crc_errors=crc, replay_errors=replay, recovery_errors=recovery)


def test_counters_rising_warn_below_the_rate_and_fail_above_it_or_on_replays():
    before = hgx(read_at=1000.0)
    counters(before, 6, 3, crc=12)
    counters(before, 2, 9, crc=3)
    after = hgx(read_at=1020.0)
    counters(after, 6, 3, crc=12 + 20 * 150)  # 150 per second: DCGM's limit is 100
    counters(after, 2, 9, crc=13)  # 0.5 per second
    found = check_shape(judge_nvlink.judge(after, thresholds(), HOST, baseline=before))
    assert codes(found) == [("NVLINK_ERRORS_RISING", 2), ("NVLINK_ERRORS_HIGH", 6)]
    assert "link 3: CRC +3000 (150.0/s), replay +0, recovery +0" in found[1]["message"] and " in 20 s" in found[1]["message"]
    assert "link 9: CRC +10 (0.5/s)" in found[0]["message"]
    # The same rise with a laxer limit only warns; any replay fails (DCGM); a higher replay limit warns.
    assert codes(judge_nvlink.judge(after, thresholds(gpufleet_nvlink_crc_fail_per_s=200), HOST, baseline=before)) == [
        ("NVLINK_ERRORS_RISING", 2), ("NVLINK_ERRORS_RISING", 6)]
    counters(after, 2, 9, crc=3, replay=1)
    assert ("NVLINK_ERRORS_HIGH", 2) in codes(judge_nvlink.judge(after, thresholds(), HOST, baseline=before))
    assert ("NVLINK_ERRORS_RISING", 2) in codes(judge_nvlink.judge(
        after, thresholds(gpufleet_nvlink_replay_recovery_fail=2), HOST, baseline=before))
    figures = judge_nvlink.figures(after, thresholds(), baseline=before)
    assert figures["errors_rise"] == 3001 and figures["window_s"] == 20.0


def test_counters_in_the_result_baseline_and_a_reset_counter():
    after = hgx(read_at=1010.0)
    after["baseline"] = {"read_at": 1000.0, "gpus": [
        {"index": g["index"], "pci": g["pci"], "uuid": g["uuid"], "nvlink_counters": copy.deepcopy(g["nvlink_counters"])}
        for g in hgx()["gpus"]]}
    after["baseline"]["gpus"][4]["nvlink_counters"][0]["crc_errors"] = 500  # the driver reloaded: counters went down
    counters(after, 4, 0, crc=2)
    counters(after, 7, 1, recovery=1)
    assert schema_errors("nvlink_facts", after) == []
    assert codes(judge_nvlink.judge(after, thresholds(), HOST)) == [("NVLINK_ERRORS_HIGH", 7)]


def test_no_gpus_on_an_nvswitch_machine_is_an_error():
    read = hgx()
    read["gpus"] = []
    read["problems"] = [{"kind": "tool_error", "message": "nvidia-smi: NVIDIA-SMI has failed", "pci": None,
                         "index": None}]
    assert codes(judge(read))[0] == ("NVLINK_UNREADABLE", None)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20))
def test_garbage_is_refused_or_judged(garbage):
    door("nvlink_facts", garbage, lambda data: (check_shape(judge_nvlink.judge(data, {}, HOST)),
                                                judge_nvlink.figures(data)))


@pytest.mark.parametrize("key,value", [("gpus", "eight"), ("fabric_manager", []), ("gpus", [{"nvlink_links": 3}]),
                                       ("platform", "yes"), ("topology", {"matrix": []})])
def test_a_malformed_read_is_refused_at_the_door(key, value):
    read = hgx()
    read[key] = value
    assert door("nvlink_facts", read, lambda data: judge_nvlink.judge(data, {}, HOST)) is None
