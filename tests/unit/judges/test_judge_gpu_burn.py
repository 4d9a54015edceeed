"""judge_gpu_burn: every finding code, the pass rule per GPU (never the exit code), expected GPUs, bad input."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_gpu_burn
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

FRAME = "100.0%  proc'd: 2670 (7122 Gflop/s) - 2670 (7085 Gflop/s)   errors: 0 - 0   temps: 63 C - 66 C"
PCI = ["0000:18:00", "0000:2a:00"]


def _gpu(k, **change):
    gpu = {"index": k + 4, "cuda_index": k, "pci": PCI[k], "uuid": "GPU-%d" % k, "status": "ok",
           "initialised": True, "frames": 10, "processed": 2670, "gflops_max": 7122.0, "gflops_mean": 7110.0,
           "errors": 0, "error_frames": 0, "negative_error_frames": 0, "warning_frames": 0, "died": False,
           "max_temperature_c": 66, "max_power_w": None, "final": "OK", "first_error_line": None,
           "died_line": None, "gflops_series": [[10.0, 7100.0], [100.0, 7122.0]]}
    gpu.update(change)
    return gpu


def healthy():
    """gpu_burn devices 0 and 1 are nvidia-smi GPUs 4 and 5 (the module's map)."""
    return {"tool": dict(TOOL_OK), "output_tail": [], "expected_gpus": 2,
            "gpu_map": [{"cuda_index": k, "index": k + 4, "pci": PCI[k], "uuid": "GPU-%d" % k} for k in (0, 1)],
            "gpu_map_problem": None, "gpus": [_gpu(0), _gpu(1)], "initialised_gpus": 2, "frames": 10,
            "summaries": 3, "burn_s": 60, "tested_gpus": 2, "last_percent": 100.0, "init_failures": [],
            "compute_failures": [], "cuda_failures": [], "aborted": [], "start_missing": False,
            "unparsed": {"count": 0, "samples": []}, "problems": []}


def judge(result, expected_gpus=2):
    return judge_gpu_burn.judge(result, thresholds(), HOST, expected_gpus=expected_gpus)


def test_clean_burn_has_no_finding_and_matches_the_schema():
    result = healthy()
    assert judge(result) == []
    assert_schema("gpu_burn", result, [])


@pytest.mark.parametrize("change, words", [
    ({"status": "faulty", "errors": 6, "first_error_line": FRAME}, "produced wrong results under load (6 calculation"),
    ({"status": "faulty", "errors": 2147483000, "negative_error_frames": 1, "first_error_line": FRAME},
     "counter overflowed negative"),
    ({"status": "faulty", "final": "FAULTY"}, "(reported FAULTY)"),
    ({"status": "died", "died": True, "died_line": FRAME}, "worker died during the run (DIED!)"),
    ({"status": "not_initialised", "initialised": False}, "never initialised"),
    ({"status": "no_work", "processed": 0, "gflops_max": None}, "did no work (proc'd 0, Gflop/s None)"),
])
def test_each_failed_gpu_status_is_burn_faulty_naming_the_gpu(change, words):
    result = healthy()
    result["gpus"][1] = _gpu(1, **change)
    findings = judge(result, expected_gpus=None)
    f = only(findings, "BURN_FAULTY")
    assert (f["severity"], f["gpu"], f["pci"]) == ("fail", 5, "0000:2a:00")
    assert f["message"].startswith("node01 GPU 5 (0000:2a:00) (gpu_burn device 1)") and words in f["message"]
    assert f["evidence"] and "RMA" in f["action"]


def test_status_ok_is_no_finding_whatever_else():
    # one step from faulty: status ok with the final line OK
    assert judge(set_path(healthy(), ("gpus", 1, "final"), "OK")) == []


def test_unnamed_failure_lines_are_evidence_of_a_gpu_finding_or_a_finding_of_their_own():
    died = healthy()
    died["gpus"][1] = _gpu(1, status="died", died=True, died_line=FRAME)
    died["compute_failures"] = ["Failure during compute: Error in SGEMM: an illegal memory access"]
    f = only(judge(died), "BURN_FAULTY")
    assert died["compute_failures"][0] in f["evidence"]
    alone = set_path(healthy(), ("aborted",), ["No clients are alive!  Aborting"])
    f = only(judge(alone), "BURN_FAULTY")
    assert f["gpu"] is None and "all gpu_burn workers died" in f["message"]


@pytest.mark.parametrize("expected, found", [(2, []), (3, [("BURN_GPU_MISSING", None)]), (None, [])])
def test_expected_gpus(expected, found):
    findings = judge(healthy(), expected_gpus=expected)
    assert codes(findings) == found
    if found:
        assert "only 2 of 3 expected GPUs initialised" in findings[0]["message"]


@pytest.mark.parametrize("change, words", [
    ({"cuda_failures": ["CUDA error: no CUDA-capable device is detected"]}, "could not use CUDA"),
    ({"init_failures": ["Couldn't init a GPU test: compare.ptx not found"] * 2}, "cannot find its compare kernel"),
    ({"frames": 0}, "no progress frames"),
    ({"tested_gpus": None}, "did not finish"),
    ({"tested_gpus": 3}, "tested 3 GPUs but its output shows 2"),
    ({"tool": dict(TOOL_OK, rc=2)}, "exited with rc=2 although its output looks clean"),
    ({"start_missing": True}, "no 'Initialized device' lines"),
])
def test_every_way_a_burn_proves_nothing_is_burn_not_run(change, words):
    result = healthy()
    result.update(change)
    f = only(judge(result), "BURN_NOT_RUN")
    assert f["severity"] == "error" and words in f["message"]


def test_unrecognised_output_is_burn_not_run_with_samples():
    result = {"tool": dict(TOOL_OK, rc=139), "unparsed": {"count": 1, "samples": ["Segmentation fault"]}}
    f = only(judge(result), "BURN_NOT_RUN")
    assert "not recognised (rc=139)" in f["message"] and f["evidence"] == ["Segmentation fault"]


def test_could_not_run_and_check_mode():
    f = only(judge({"tool": dict(TOOL_OK, rc=None, error="gpu_burn not found")}), "CHECK_ERROR")
    assert "gpu_burn could not run" in f["message"]
    assert judge({"tool": dict(TOOL_OK, rc=None), "not_run": "check mode"}) == []


def test_figures_per_gpu():
    per, series = judge_gpu_burn.figures(healthy())
    assert per[1] == {"index": 5, "pci": "0000:2a:00", "burn_gflops": 7110.0, "burn_gflops_max": 7122.0,
                      "burn_errors": 0, "burn_temperature_max_c": 66}
    assert series == {"4": [[10.0, 7100.0], [100.0, 7122.0]], "5": [[10.0, 7100.0], [100.0, 7122.0]]}
    assert judge_gpu_burn.figures("x") == ([], {})


def test_no_thresholds_apply():
    result = set_path(healthy(), ("gpus", 0, "status"), "faulty")
    assert judge_gpu_burn.judge(result, {}, HOST) == judge_gpu_burn.judge(result, thresholds(
        gpufleet_temp_max_c=1.0), HOST)


@pytest.mark.parametrize("bad", BAD_TOP)
def test_bad_input_is_refused_at_the_door(bad):
    findings = door("gpu_burn", bad, lambda data: check_shape(judge_gpu_burn.judge(data, {}, HOST, expected_gpus=2)))
    assert findings is None or (findings and all(f["severity"] == "error" for f in findings))


@pytest.mark.parametrize("path, value", [
    (("gpus", 0), None), (("gpus", 0, "status"), None), (("gpus",), "x"), (("frames",), "10"),
    (("init_failures",), 7), (("tested_gpus",), "2"), (("gpus", 1, "errors"), None), (("gpus", 1, "cuda_index"), "1"),
])
def test_values_of_the_wrong_type_are_refused_or_judged(path, value):
    result = set_path(healthy(), ("gpus", 1, "status"), "faulty")
    door("gpu_burn", set_path(result, path, value),
         lambda data: (check_shape(judge(data)), judge_gpu_burn.figures(data)))


@settings(max_examples=200, deadline=None)
@given(GARBAGE)
def test_fuzz_is_refused_or_judged(data):
    door("gpu_burn", data, lambda d: (check_shape(judge_gpu_burn.judge(d, thresholds(), HOST, expected_gpus=2)),
                                      judge_gpu_burn.figures(d)))
