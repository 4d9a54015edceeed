"""dcgmi diag -j parser and judgement against recorded shapes (tests/fixtures/dcgm/README.md).

The judge reads what the dcgm_diag module returns: the parser's output, the level asked for and the tool section.
"""

import json

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_dcgm
from ansible_collections.kentino.gpufleet.plugins.module_utils.dcgm_diag_json import level_run, parse_dcgm_diag
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import module_fields
from hypothesis import given, settings
from hypothesis import strategies as st

HOST = "node01"


def observations(parsed, level=3, rc=0):
    result = dict(parsed)
    result.update(tool={"argv": ["dcgmi", "diag", "-r", str(level), "-j"], "rc": rc, "timed_out": False,
                        "duration_s": 5.0, "error": None}, output_tail=[], level_requested=level,
                  level_reason="requested", level_run=level_run(parsed))
    return result


def judge(parsed, level=3, rc=0, pci_of=None):
    findings = judge_dcgm.judge(observations(parsed, level, rc), {}, HOST, pci_of=pci_of)
    return findings, module_fields(findings)


def _run(fixture_text, name, level=3, rc=0):
    parsed = parse_dcgm_diag(fixture_text("dcgm", name))
    findings, judged = judge(parsed, level, rc)
    return parsed, findings, judged


def _codes(findings):
    return [(f["code"], f["gpu"]) for f in findings]


def _gpu(parsed, index):
    return [g for g in parsed["gpus"] if g["index"] == index][0]


def _test(parsed, key):
    return [t for t in parsed["tests"] if t["key"] == key][0]


def test_dcgm4_level3_pass(fixture_text):
    parsed, findings, judged = _run(fixture_text, "dcgm4_l3_pass.json")
    assert judged["verdict"] == "pass" and findings == [], judged["reasons"]
    assert parsed["format"] == "dcgm4" and parsed["dcgm_version"] == "4.2.3"
    assert parsed["driver_version"] == "570.124.06" and level_run(parsed) == 3
    assert [g["status"] for g in parsed["gpus"]] == ["pass", "pass"]
    assert _gpu(parsed, 1)["serial"] == "1651230000001"
    assert _gpu(parsed, 0)["skipped_tests"] == ["nvbandwidth"], "a skipped optional test is listed, not hidden"
    pcie = _test(parsed, "pcie")
    assert pcie["category"] == "Integration" and pcie["gpus"][0]["info"]


def test_dcgm4_gpu_failure_names_gpu_test_and_message(fixture_text):
    parsed, findings, judged = _run(fixture_text, "dcgm4_l3_gpu1_fail.json", rc=226)
    assert judged["verdict"] == "fail"
    assert _gpu(parsed, 1)["failed_tests"] == ["diagnostic"] and _gpu(parsed, 0)["status"] == "pass"
    reason = judged["reasons"][0]
    assert reason.startswith("node01 GPU 1: dcgmi diag fail in diagnostic") and "double bit ECC" in reason
    assert "severity isolate" in reason
    # rc 226 is the diag failure the results already show: no second finding
    assert _codes(findings) == [("DCGM_FAIL", 1)] and "RMA" in findings[0]["action"]
    named, _judged = judge(parsed, rc=226, pci_of={0: "0000:18:00", 1: "0000:2a:00"})
    assert named[0]["pci"] == "0000:2a:00" and named[0]["message"].startswith("node01 GPU 1 (0000:2a:00): ")
    warning = _test(parsed, "diagnostic")["gpus"][1]["warnings"][0]
    assert warning["error_id"] == 4 and warning["severity"] == 2


def test_dcgm4_warning_serialised_as_fail_is_warn(fixture_text):
    parsed, findings, judged = _run(fixture_text, "dcgm4_warn_serialised_as_fail.json")
    assert _test(parsed, "targeted_power")["gpus"][0]["status"] == "warn"
    assert judged["verdict"] == "warn" and "GPU 0: dcgmi diag warn in targeted_power" in judged["reasons"][0]
    assert _codes(findings) == [("DCGM_WARN", 0)]


def test_runtime_error_is_error(fixture_text):
    _, findings, judged = _run(fixture_text, "dcgm4_runtime_error.json")
    assert judged["verdict"] == "error" and "could not run" in judged["reasons"][0]
    assert _codes(findings) == [("DCGM_NOT_RUN", None)]


def test_level3_with_every_hardware_test_skipped_is_not_a_pass(fixture_text):
    parsed, findings, judged = _run(fixture_text, "dcgm4_l3_heavy_all_skipped.json", level=3)
    assert level_run(parsed) == 1
    assert judged["verdict"] == "error" and _codes(findings) == [("DCGM_NOT_RUN", None)]
    assert "level 3 requested but none of its hardware tests ran" in judged["reasons"][0]


def test_all_tests_skipped_is_error(fixture_text):
    _, findings, judged = _run(fixture_text, "dcgm4_all_skipped.json", level=1)
    assert judged["verdict"] == "error" and "skipped every test" in judged["reasons"][0]
    assert _codes(findings) == [("DCGM_NOT_RUN", None)]
    assert any("in use by other processes" in line for line in judged["evidence"])


def test_level1_software_only_passes_when_level1_was_asked(fixture_text):
    _, findings, judged = _run(fixture_text, "dcgm4_l1_consumer.json", level=1)
    assert judged["verdict"] == "pass" and findings == []
    _, findings, judged = _run(fixture_text, "dcgm4_l1_consumer.json", level=2)
    assert judged["verdict"] == "error" and _codes(findings) == [("DCGM_NOT_RUN", None)]


def test_dcgm3_gpu_ids_string_and_mixed_case(fixture_text):
    parsed, findings, judged = _run(fixture_text, "dcgm3_l2_gpu2_memory_fail.json", level=2)
    assert parsed["format"] == "dcgm3" and parsed["dcgm_version"] == "3.3.9"
    assert [g["index"] for g in parsed["gpus"]] == [0, 1, 2, 3]
    assert _test(parsed, "denylist")["gpus"][3]["status"] == "pass"
    assert _gpu(parsed, 2)["failed_tests"] == ["GPU Memory"] and _gpu(parsed, 1)["status"] == "pass"
    assert level_run(parsed) == 2
    assert judged["verdict"] == "fail" and "GPU 2" in judged["reasons"][0]
    assert _codes(findings) == [("DCGM_FAIL", 2)]


def test_iterations_worst_run_counts(fixture_text):
    parsed, findings, judged = _run(fixture_text, "dcgm3_iterations.json", level=2)
    assert parsed["iterations"] == 2 and parsed["overall_result"] == "fail"
    assert _gpu(parsed, 0)["status"] == "fail" and _gpu(parsed, 1)["status"] == "pass"
    assert judged["verdict"] == "fail" and any("PCIe link width" in line for line in judged["evidence"])
    # the overall Fail is GPU 0's failure, not a second finding
    assert _codes(findings) == [("DCGM_FAIL", 0)]


def test_host_engine_down(fixture_text):
    parsed, findings, judged = _run(fixture_text, "hostengine_down.txt", rc=255)
    assert parsed["hostengine_down"]
    # the fix is the finding's action now, the reason says what is wrong
    assert judged["verdict"] == "error" and "cannot reach the DCGM host engine" in judged["reasons"][0]
    assert _codes(findings) == [("DCGM_NOT_RUN", None)]
    assert "start nvidia-dcgm (nv-hostengine)" in findings[0]["action"]
    assert any("unable to establish a connection" in line for line in judged["evidence"])


def test_json_after_a_preamble_line(fixture_text):
    parsed, _findings, judged = _run(fixture_text, "json_with_preamble.txt")
    assert judged["verdict"] == "pass" and parsed["messages"] == ["Warning: the diag is running as root"]


def test_truncated_json_is_error(fixture_text):
    parsed, findings, judged = _run(fixture_text, "truncated.json")
    assert judged["verdict"] == "error" and parsed["problems"][0]["kind"] == "json"
    assert _codes(findings) == [("DCGM_NOT_RUN", None)] and "no JSON results" in judged["reasons"][0]


def test_garbage_is_error(fixture_text):
    parsed, findings, judged = _run(fixture_text, "garbage.txt", rc=127)
    assert judged["verdict"] == "error" and "rc=127" in judged["reasons"][0]
    assert any("symbol lookup error" in line for line in findings[0]["evidence"])


def test_exit_codes_override_a_clean_json(fixture_text):
    for rc, verdict, code, words in ((205, "fail", "DCGM_FAIL", "isolate"), (226, "fail", "DCGM_FAIL", "226"),
                                     (1, "error", "DCGM_NOT_RUN", "rc=1")):
        _parsed, findings, judged = _run(fixture_text, "dcgm4_l3_pass.json", rc=rc)
        assert judged["verdict"] == verdict and _codes(findings) == [(code, None)]
        assert words in judged["reasons"][0]


def test_unknown_status_is_never_pass():
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Maybe"}]}]}]}}
    parsed = parse_dcgm_diag(json.dumps(doc))
    assert parsed["problems"][0]["kind"] == "unknown_status"
    findings, judged = judge(parsed, level=2)
    # the memory test did not give a usable answer: level 2's hardware was not verified, and GPU 0 is unjudged
    assert judged["verdict"] == "error" and _codes(findings) == [("DCGM_NOT_RUN", None), ("DCGM_ERROR", 0)]


def test_non_gpu_entity_failure_is_reported():
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}]},
        {"name": "cpu_eud", "results": [{"entity_group": "CPU", "entity_id": 0, "status": "Fail",
                                         "warnings": [{"warning": "CPU 0 failed", "error_severity": 2}]}]}]}]}}
    findings, judged = judge(parse_dcgm_diag(json.dumps(doc)), level=2)
    assert judged["verdict"] == "fail" and "CPU 0" in judged["reasons"][0]
    assert _codes(findings) == [("DCGM_FAIL", None)] and findings[0]["evidence"] == ["CPU 0 failed"]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_fuzz_random_text_never_raises(text):
    judge(parse_dcgm_diag(text), level=3, rc=0)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    | st.sampled_from(["Pass", "Fail", "Skip", "GPU", "0,1", "DCGM Diagnostic", "DCGM GPU Diagnostic"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["DCGM Diagnostic", "DCGM GPU Diagnostic", "test_categories", "tests", "results", "status",
                         "entity_group", "entity_id", "gpu_id", "gpu_ids", "warnings", "warning", "error_severity",
                         "info", "iterations", "Overall Result", "runtime_error", "metadata", "version", "name",
                         "category", "test_summary", "entity_groups", "entities"]), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_fuzz_dcgm_shaped_json_never_raises(doc):
    parsed = parse_dcgm_diag(json.dumps(doc))
    _findings, judged = judge(parsed, level=3, rc=0)
    if judged["verdict"] == "pass":
        assert any(t["status"] == "pass" for t in parsed["tests"])
        assert not parsed["runtime_error"]


def test_wrong_json_types_are_tolerated():
    for body in ({"test_categories": 5}, {"test_categories": [{"tests": 7}]}, {"test_categories": "x"},
                 {"test_categories": [{"tests": [{"name": "pcie", "results": 3}]}]},
                 {"test_categories": [{"tests": [{"name": "pcie", "results": [{"gpu_ids": 12, "status": 1}]}]}]}):
        parsed = parse_dcgm_diag(json.dumps({"DCGM Diagnostic": body, "entity_groups": 4}))
        assert judge(parsed, level=3)[1]["verdict"] == "error"
