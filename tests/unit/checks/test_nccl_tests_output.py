"""nccl-tests parser and judgement against recorded shapes (tests/fixtures/nccl/README.md).

The judge reads what the nccl_test module returns: the parser's output plus the tool section. Thresholds are the
inventory's names (module_utils/thresholds.py); without gpufleet_nccl_min_busbw_gbps the floor is the GPU model's
reference busbw x gpufleet_nccl_min_busbw_fraction.
"""

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_nccl
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import module_fields
from ansible_collections.kentino.gpufleet.plugins.module_utils.nccl_tests_output import parse_nccl_tests
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULTS
from hypothesis import given, settings
from hypothesis import strategies as st

HOST = "node01"


def observations(parsed, rc=0):
    result = dict(parsed)
    result.update(tool={"argv": ["all_reduce_perf", "-b", "8", "-e", "1G", "-f", "2", "-g", "8"], "rc": rc,
                        "timed_out": False, "duration_s": 30.0, "error": None}, output_tail=[])
    return result


def judge(parsed, rc=0, min_busbw_gbps=None, **t):
    thresholds = dict(DEFAULTS, gpufleet_nccl_min_busbw_gbps=min_busbw_gbps, **t)
    findings = judge_nccl.judge(observations(parsed, rc), thresholds, HOST)
    return findings, module_fields(findings)


def _run(fixture_text, name, rc=0, min_busbw_gbps=None, **t):
    parsed = parse_nccl_tests(fixture_text("nccl", name))
    findings, judged = judge(parsed, rc=rc, min_busbw_gbps=min_busbw_gbps, **t)
    return parsed, findings, judged


def _codes(findings):
    return [f["code"] for f in findings]


def test_healthy_h100_run(fixture_text):
    parsed, findings, judged = _run(fixture_text, "h100_8gpu_ok.txt", min_busbw_gbps=300)
    assert judged["verdict"] == "pass" and findings == [], judged["reasons"]
    rows = parsed["rows"]
    assert len(rows) == 28 and rows[0]["size_bytes"] == 8 and rows[-1]["size_bytes"] == 1 << 30
    last = dict(rows[-1])
    assert "377.71" in last.pop("line"), "each row keeps its raw line: the evidence a finding quotes"
    assert last == {"size_bytes": 1073741824, "count": 268435456, "type": "float", "redop": "sum", "root": -1,
                    "oop_time_us": 4974.86, "oop_algbw_gbps": 215.83, "oop_busbw_gbps": 377.71, "oop_wrong": 0,
                    "ip_time_us": 4974.86, "ip_algbw_gbps": 215.83, "ip_busbw_gbps": 377.71, "ip_wrong": 0}
    assert parsed["peak_busbw_gbps"] == 377.71 and parsed["largest_size_bytes"] == 1 << 30
    assert parsed["avg_busbw_gbps"] == 106.819 and parsed["avg_busbw_check"] is None
    assert parsed["out_of_bounds"] == 0 and parsed["wrong_values"] == 0 and parsed["concluded"]
    assert parsed["header"]["ngpus"] == 8 and parsed["header"]["max_bytes"] == 1 << 30
    assert parsed["header"]["iters"] == 20 and parsed["header"]["warmup_iters"] == 5
    assert parsed["nccl_tests_version"] == "2.17.1" and parsed["test_name"] == "all_reduce_perf"
    assert parsed["gpus"][7] == {"rank": 7, "group": 0, "pid": 41230, "host": "gpu-node-01", "device": 7,
                                 "pci": "0000:db:00", "bus_id": "0000:db:00", "name": "NVIDIA H100 80GB HBM3"}
    # A pass has no findings: the measured figure and its floor come from judge_nccl.figures().
    figures = judge_nccl.figures(observations(parsed), dict(DEFAULTS, gpufleet_nccl_min_busbw_gbps=300.0))
    assert figures["busbw_gbps"] == 377.71 and figures["min_busbw_gbps"] == 300.0
    assert figures["threshold_source"] == "gpufleet_nccl_min_busbw_gbps"


def test_peak_not_average_is_gated(fixture_text):
    # The average (106.8) is far below 300 while the real bandwidth at 1 GiB is 377.7: must pass.
    parsed, _findings, judged = _run(fixture_text, "h100_8gpu_ok.txt", min_busbw_gbps=300)
    assert parsed["avg_busbw_gbps"] < 300 < parsed["peak_busbw_gbps"] and judged["verdict"] == "pass"
    _, findings, judged = _run(fixture_text, "h100_8gpu_ok.txt", min_busbw_gbps=400)
    assert judged["verdict"] == "fail" and _codes(findings) == ["NCCL_BUSBW_LOW"]
    assert "NCCL busbw 377.7 GB/s < 400.0 GB/s at 1 GiB" in judged["reasons"][0]
    assert any(line.split()[0] == "1073741824" for line in findings[0]["evidence"]), "the row at the largest size"


def test_default_floor_is_the_model_reference(fixture_text):
    # No floor in the inventory: the H100 reference 370 GB/s x 0.7 = 259 GB/s; the fraction and a site reference
    # change the answer.
    parsed, findings, _judged = _run(fixture_text, "h100_8gpu_ok.txt")
    assert findings == []
    assert judge_nccl.figures(observations(parsed), DEFAULTS)["min_busbw_gbps"] == 259.0
    findings, _judged = judge(parsed, gpufleet_nccl_min_busbw_fraction=1.0, gpufleet_nccl_reference_busbw_gbps={
        "H100": 400.0})
    assert _codes(findings) == ["NCCL_BUSBW_LOW"] and "gpufleet_nccl_reference_busbw_gbps reference for H100" in \
        findings[0]["message"]


def test_pcie_mpirun_foreign_lines_big_times_and_tool_check(fixture_text):
    parsed, findings, judged = _run(fixture_text, "rtx5090_pcie_mpirun.txt")
    assert len(parsed["rows"]) == 30 and parsed["foreign_lines_in_table"] == 4
    assert parsed["rows"][-1]["oop_time_us"] == 268480.0, "times without decimals"
    assert parsed["peak_busbw_gbps"] == 28.0 and parsed["avg_busbw_check"] == "FAILED"
    assert parsed["gpus"][3]["bus_id"] == "0x5d" and parsed["gpus"][3]["pci"] is None
    assert parsed["gpus"][3]["name"] == "NVIDIA GeForce RTX 5090"
    # No floor given: the RTX 5090 reference (50 GB/s) x 0.7 = 35 GB/s is the floor, and 28 GB/s fails it. (Before
    # the model references this warned, on nccl-tests' own average check alone.)
    assert judged["verdict"] == "fail" and _codes(findings) == ["NCCL_BUSBW_LOW"]
    assert "28.0 GB/s < 35.0 GB/s at 4 GiB (built-in reference for RTX 5090 (50 GB/s) x 0.7)" in judged["reasons"][0]
    _, findings, judged = _run(fixture_text, "rtx5090_pcie_mpirun.txt", min_busbw_gbps=50)
    assert judged["verdict"] == "fail" and "< 50.0 GB/s" in judged["reasons"][0]
    _, findings, judged = _run(fixture_text, "rtx5090_pcie_mpirun.txt", min_busbw_gbps=25)
    assert judged["verdict"] == "pass", "a measured platform baseline below the reference is the floor"


def test_wrong_values_fail(fixture_text):
    parsed, findings, judged = _run(fixture_text, "wrong_values.txt")
    assert parsed["wrong_values"] == 36 and parsed["out_of_bounds"] == 12
    assert parsed["out_of_bounds_status"] == "FAILED"
    assert judged["verdict"] == "fail" and judged["reasons"][0].startswith("node01: 36 wrong values")
    assert _codes(findings) == ["NCCL_WRONG_VALUES", "NCCL_WRONG_VALUES"]
    assert "12 out-of-bounds" in judged["reasons"][1]
    assert any(line.split()[0] == "268435456" for line in judged["evidence"])


def test_validation_off_is_warn(fixture_text):
    parsed, findings, judged = _run(fixture_text, "validation_off.txt")
    assert all(r["oop_wrong"] is None and r["ip_wrong"] is None for r in parsed["rows"])
    assert judged["verdict"] == "warn" and "validation was off" in judged["reasons"][0]
    assert _codes(findings) == ["NCCL_UNVALIDATED"]


def test_cuda_failure_fails(fixture_text):
    parsed, findings, judged = _run(fixture_text, "cuda_failure.txt", rc=1)
    assert not parsed["rows"] and len(parsed["gpus"]) == 8
    assert judged["verdict"] == "fail" and "Test CUDA failure" in judged["reasons"][0]
    assert _codes(findings) == ["NCCL_FAIL"] and findings[0]["evidence"] == parsed["failures"][:10]


def test_nccl_failure_under_mpirun(fixture_text):
    parsed, findings, judged = _run(fixture_text, "nccl_failure_mpirun.txt", rc=3, min_busbw_gbps=20)
    assert len(parsed["rows"]) == 10
    assert judged["verdict"] == "fail"
    assert "Test NCCL failure" in judged["reasons"][0]
    # bandwidth and truncation of a failed run are consequences, not findings of their own
    assert _codes(findings) == ["NCCL_FAIL", "NCCL_FAIL"] and "rc=3" in judged["reasons"][1]


def test_nonzero_exit_after_results_fails(fixture_text):
    _, findings, judged = _run(fixture_text, "h100_8gpu_ok.txt", rc=1)
    assert judged["verdict"] == "fail" and "rc=1" in judged["reasons"][0] and _codes(findings) == ["NCCL_FAIL"]


def test_truncated_run_warns(fixture_text):
    parsed, findings, judged = _run(fixture_text, "truncated.txt")
    assert parsed["largest_size_bytes"] == 64 << 20 and parsed["out_of_bounds"] is None
    assert judged["verdict"] == "warn" and "stop at 64 MiB" in judged["reasons"][0]
    assert _codes(findings) == ["NCCL_INCOMPLETE"]


def test_v1_layout_without_root_column(fixture_text):
    parsed, findings, judged = _run(fixture_text, "v1_no_root_column.txt")
    assert len(parsed["rows"]) == 18 and parsed["rows"][0]["root"] is None
    assert parsed["rows"][-1]["oop_wrong"] == 0 and parsed["gpus"][0]["group"] is None
    # A V100 has no built-in reference: without a floor the figure is reported as unjudged (it passed before there
    # were references); with the platform's floor it passes.
    assert judged["verdict"] == "warn" and _codes(findings) == ["NCCL_NO_BASELINE"]
    assert "no reference for Tesla V100-SXM2-16GB" in judged["reasons"][0]
    _, findings, judged = _run(fixture_text, "v1_no_root_column.txt", min_busbw_gbps=40)
    assert judged["verdict"] == "pass", judged["reasons"]


def test_a_real_one_gpu_run_measures_nothing(fixture_text):
    """all_reduce_perf on one real H200: every busbw 0, a few in-place algbw figures in %g form (fixtures README)."""
    parsed, findings, judged = _run(fixture_text, "h200_1gpu.txt")
    assert parsed["nccl_tests_version"] == "2.19.6" and parsed["header"]["ngpus"] == 1
    assert len(parsed["rows"]) == 28 and parsed["unparsed"]["count"] == 0 and parsed["concluded"]
    assert [r["ip_algbw_gbps"] for r in parsed["rows"][-2:]] == [2e6, 1e6]
    assert parsed["peak_busbw_gbps"] == 0.0 and parsed["avg_busbw_gbps"] == 0.0
    assert _codes(findings) == ["NCCL_NO_FIGURE"] and "one GPU" in findings[0]["message"]


def test_garbage_is_error(fixture_text):
    parsed, findings, judged = _run(fixture_text, "garbage.txt", rc=126)
    assert judged["verdict"] == "error" and parsed["unparsed"]["count"] == 2
    assert _codes(findings) == ["NCCL_NO_FIGURE"] and "rc=126" in judged["reasons"][0]
    assert any("Exec format error" in line for line in judged["evidence"])


def test_a_numbers_only_line_is_not_a_row():
    parsed = parse_nccl_tests("1 2 3 4 5 6 7 8 9 10 11 12 13\n")
    assert not parsed["rows"] and parsed["unparsed"]["count"] == 1


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_fuzz_random_text_never_raises(text):
    judge(parse_nccl_tests(text), rc=0, min_busbw_gbps=10.0)


TOKENS = st.sampled_from(["8", "1073741824", "-1", "float", "sum", "N/A", "12.5", "1.2e+04", "nan", "0", "#",
                          "size", "count", "type", "root", "time", "algbw", "busbw", "#wrong", "Rank", "Out of bounds "
                          "values :", "Avg bus bandwidth :", "FAILED", "OK", "Test NCCL failure", "\n", "  ", "[0x1f]"])


@settings(max_examples=300, deadline=None)
@given(st.lists(TOKENS, max_size=60))
def test_fuzz_table_fragments_never_raise(tokens):
    parsed = parse_nccl_tests(" ".join(tokens))
    _findings, judged = judge(parsed, rc=0, min_busbw_gbps=1.0)
    if judged["verdict"] == "pass":
        assert parsed["rows"] and parsed["wrong_values"] == 0 and not parsed["failures"]
        assert parsed["peak_busbw_gbps"] >= 1.0
