"""judge_dcgm: every finding code, each way a diag "passes" without having run, the exit codes, bad input."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_dcgm
from hypothesis import given, settings
from judgelib import (
    BAD_TOP,
    GARBAGE,
    HOST,
    TOOL_OK,
    assert_schema,
    check_shape,
    codes,
    door,
    only,
    set_path,
    thresholds,
)


def _test(key, statuses, category="Hardware", warnings=None):
    gpus = []
    for index, status in enumerate(statuses):
        gpus.append({"index": index, "status": status, "info": [],
                     "warnings": (warnings or {}).get(index, [])})
    overall = "fail" if "fail" in statuses else ("warn" if "warn" in statuses else "pass")
    return {"category": category, "name": key, "key": key, "status": overall, "gpus": gpus, "entities": []}


def healthy(level=3):
    tests = [_test("software", ["pass", "pass"], "Deployment"), _test("memory", ["pass", "pass"]),
             _test("pcie", ["pass", "pass"], "Integration"), _test("diagnostic", ["pass", "pass"])]
    return {"tool": dict(TOOL_OK), "output_tail": [], "level_requested": level, "level_reason": "requested",
            "level_run": 3, "format": "dcgm4", "dcgm_version": "4.2.3", "driver_version": "570.124.06",
            "runtime_error": None, "iterations": None, "overall_result": None, "hostengine_down": False,
            "messages": [], "tests": tests,
            "gpus": [{"index": i, "serial": None, "status": "pass", "failed_tests": [], "warned_tests": [],
                      "passed_tests": [t["name"] for t in tests], "skipped_tests": []} for i in (0, 1)],
            "unparsed": {"count": 0, "samples": []}, "problems": []}


def judge(result, pci_of=None, **t):
    return judge_dcgm.judge(result, thresholds(**t), HOST, pci_of=pci_of)


ECC = {"message": "GPU 1 Detected 4 double bit ECC error(s) in volatile memory.", "error_id": 4, "severity": 2}
POWER = {"message": "Clocks are being throttled for GPU 0 because of clock_event_sw_power_cap.", "error_id": 37,
         "severity": 1}


def test_healthy_diag_has_no_finding_and_matches_the_schema():
    result = healthy()
    assert judge(result) == []
    assert_schema("dcgm_diag", result, [])


def test_failing_gpu_is_dcgm_fail_naming_gpu_pci_test_and_message():
    result = healthy()
    result["tests"][3] = _test("diagnostic", ["pass", "fail"], warnings={1: [ECC]})
    findings = judge(result, pci_of={0: "0000:18:00", 1: "0000:2a:00"})
    f = only(findings, "DCGM_FAIL")
    assert (f["severity"], f["gpu"], f["pci"]) == ("fail", 1, "0000:2a:00")
    assert f["message"].startswith("node01 GPU 1 (0000:2a:00): dcgmi diag fail in diagnostic")
    assert "(error_id 4, severity isolate)" in f["message"] and "RMA" in f["action"]
    assert f["evidence"] == [ECC["message"] + " (error_id 4, severity isolate)"]
    assert_schema("dcgm_diag", result, findings)


def test_warning_is_dcgm_warn_and_error_status_is_dcgm_error():
    result = healthy()
    result["tests"][2] = _test("targeted_power", ["warn", "pass"], warnings={0: [POWER]})
    f = only(judge(result), "DCGM_WARN")
    assert (f["severity"], f["gpu"]) == ("warn", 0) and "severity monitor" in f["message"]
    result["tests"][2] = _test("targeted_power", ["error", "pass"])
    f = only(judge(result), "DCGM_ERROR")
    assert (f["severity"], f["gpu"]) == ("error", 0) and "no detail" not in f["message"]
    assert f["evidence"] == ["dcgm_diag GPU 0: error in targeted_power"]


def test_one_finding_per_gpu_with_its_worst_status():
    result = healthy()
    result["tests"][2] = _test("pcie", ["warn", "pass"], warnings={0: [POWER]})
    result["tests"][3] = _test("diagnostic", ["fail", "pass"], warnings={0: [ECC]})
    f = only(judge(result), "DCGM_FAIL")
    assert f["gpu"] == 0 and "pcie, diagnostic" in f["message"]


def test_non_gpu_entity_failure():
    result = healthy()
    result["tests"].append({"category": "Hardware", "name": "cpu_eud", "key": "cpu_eud", "status": "fail",
                            "gpus": [], "entities": [{"entity_group": "CPU", "entity_ids": [0], "status": "fail",
                                                      "warnings": [{"message": "CPU 0 failed", "error_id": None,
                                                                    "severity": None}], "info": []}]})
    f = only(judge(result), "DCGM_FAIL")
    assert f["gpu"] is None and "cpu_eud test fail on CPU 0: CPU 0 failed" in f["message"]


@pytest.mark.parametrize("change, words", [
    ({"level_requested": None, "level_reason": "level=auto found no GPU names"}, "dcgmi diag not run: level=auto"),
    ({"hostengine_down": True, "messages": ["Error: unable to establish a connection"]}, "host engine"),
    ({"format": None, "messages": ["Error: bad option"]}, "dcgmi diag failed (rc=0): Error: bad option"),
    ({"format": None, "problems": [{"kind": "json", "message": "truncated JSON"}]}, "no JSON results (rc=0); truncated"),
    ({"runtime_error": "nvvs failed to start"}, "could not run: nvvs failed to start"),
    ({"tests": []}, "holds no test results"),
])
def test_every_way_a_diag_did_not_run_is_dcgm_not_run(change, words):
    result = healthy()
    result.update(change)
    f = only(judge(result), "DCGM_NOT_RUN")
    assert f["severity"] == "error" and words in f["message"]


def test_all_skipped_and_level_without_its_hardware_tests():
    skipped = healthy()
    for t in skipped["tests"]:
        t["status"] = "skipped"
    assert codes(judge(skipped)) == [("DCGM_NOT_RUN", None)]
    software_only = set_path(healthy(level=3), ("tests",), [_test("software", ["pass", "pass"], "Deployment"),
                                                             _test("memory", ["skipped", "skipped"])])
    software_only["tests"][1]["status"] = "skipped"
    f = only(judge(software_only), "DCGM_NOT_RUN")
    assert "level 3 requested but none of its hardware tests ran (memory skipped)" in f["message"]
    # one step below: level 1 asks for the software checks only
    assert judge(set_path(software_only, ("level_requested",), 1)) == []


@pytest.mark.parametrize("rc, expected", [
    (0, []), (205, [("DCGM_FAIL", None)]), (226, [("DCGM_FAIL", None)]), (1, [("DCGM_NOT_RUN", None)]),
])
def test_exit_codes_of_a_clean_json(rc, expected):
    result = set_path(healthy(), ("tool", "rc"), rc)
    assert codes(judge(result)) == expected


def test_iterations_overall_fail_without_a_failing_result():
    result = set_path(healthy(), ("overall_result",), "fail")
    f = only(judge(result), "DCGM_FAIL")
    assert "overall Fail" in f["message"]
    assert judge(set_path(healthy(), ("overall_result",), "pass")) == []


def test_no_thresholds_apply():
    result = healthy()
    result["tests"][3] = _test("diagnostic", ["pass", "fail"], warnings={1: [ECC]})
    assert judge(result) == judge(result, gpufleet_temp_max_c=1.0, gpufleet_nccl_min_busbw_gbps=1e9)


def test_tool_that_could_not_run_is_check_error():
    f = only(judge({"tool": dict(TOOL_OK, rc=None, error="dcgmi not found")}), "CHECK_ERROR")
    assert "dcgm_diag could not run: dcgmi not found" in f["message"]
    assert judge({"tool": dict(TOOL_OK, rc=None), "not_run": "check mode"}) == []


@pytest.mark.parametrize("bad", BAD_TOP)
def test_bad_input_is_refused_at_the_door(bad):
    findings = door("dcgm_diag", bad, lambda data: check_shape(judge_dcgm.judge(data, {}, HOST)))
    assert findings is None or (findings and all(f["severity"] == "error" for f in findings))


@pytest.mark.parametrize("path, value", [
    (("tests", 0), None), (("tests", 0, "gpus", 0), "x"), (("tests", 0, "gpus", 0, "index"), None),
    (("tests", 3, "name"), None), (("messages",), {"a": 1}), (("problems",), [{"kind": "json"}]),
    (("tests", 0, "gpus", 0, "warnings"), 5), (("tool", "rc"), "205"),
])
def test_values_of_the_wrong_type_are_refused_or_judged(path, value):
    result = healthy()
    result["tests"][3] = _test("diagnostic", ["fail", "fail"], warnings={0: [ECC]})
    result["format"] = None if path[0] in ("messages", "problems") else result["format"]
    door("dcgm_diag", set_path(result, path, value), lambda data: check_shape(judge(data)))


@settings(max_examples=200, deadline=None)
@given(GARBAGE)
def test_fuzz_is_refused_or_judged(data):
    door("dcgm_diag", data, lambda d: check_shape(judge_dcgm.judge(d, thresholds(), HOST)))
