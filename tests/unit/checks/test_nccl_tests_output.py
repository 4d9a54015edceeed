"""nccl-tests parser and judgement against recorded shapes (tests/fixtures/nccl/README.md)."""

from ansible_collections.kentino.gpufleet.plugins.module_utils.nccl_tests_output import evaluate, parse_nccl_tests
from hypothesis import given, settings
from hypothesis import strategies as st


def _run(fixture_text, name, rc=0, min_busbw_gbps=None):
    parsed = parse_nccl_tests(fixture_text("nccl", name))
    return parsed, evaluate(parsed, rc=rc, min_busbw_gbps=min_busbw_gbps)


def test_healthy_h100_run(fixture_text):
    parsed, judged = _run(fixture_text, "h100_8gpu_ok.txt", min_busbw_gbps=300)
    assert judged["verdict"] == "pass", judged["reasons"]
    rows = parsed["rows"]
    assert len(rows) == 28 and rows[0]["size_bytes"] == 8 and rows[-1]["size_bytes"] == 1 << 30
    last = rows[-1]
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
    assert "377.71" in judged["evidence"][0]


def test_peak_not_average_is_gated(fixture_text):
    # The average (106.8) is far below 300 while the real bandwidth at 1 GiB is 377.7: must pass.
    parsed, judged = _run(fixture_text, "h100_8gpu_ok.txt", min_busbw_gbps=300)
    assert parsed["avg_busbw_gbps"] < 300 < parsed["peak_busbw_gbps"] and judged["verdict"] == "pass"
    _, judged = _run(fixture_text, "h100_8gpu_ok.txt", min_busbw_gbps=400)
    assert judged["verdict"] == "fail" and "377.71 GB/s at 1 GiB is below the minimum 400.00" in judged["reasons"][0]


def test_pcie_mpirun_foreign_lines_big_times_and_tool_check(fixture_text):
    parsed, judged = _run(fixture_text, "rtx5090_pcie_mpirun.txt")
    assert len(parsed["rows"]) == 30 and parsed["foreign_lines_in_table"] == 4
    assert parsed["rows"][-1]["oop_time_us"] == 268480.0, "times without decimals"
    assert parsed["peak_busbw_gbps"] == 28.0 and parsed["avg_busbw_check"] == "FAILED"
    assert parsed["gpus"][3]["bus_id"] == "0x5d" and parsed["gpus"][3]["pci"] is None
    assert parsed["gpus"][3]["name"] == "NVIDIA GeForce RTX 5090"
    assert judged["verdict"] == "warn", "no floor given: bandwidth is reported, the tool's own avg check warns"
    _, judged = _run(fixture_text, "rtx5090_pcie_mpirun.txt", min_busbw_gbps=50)
    assert judged["verdict"] == "fail"


def test_wrong_values_fail(fixture_text):
    parsed, judged = _run(fixture_text, "wrong_values.txt")
    assert parsed["wrong_values"] == 36 and parsed["out_of_bounds"] == 12
    assert parsed["out_of_bounds_status"] == "FAILED"
    assert judged["verdict"] == "fail" and judged["reasons"][0].startswith("36 wrong values")
    assert any(line.split()[0] == "268435456" for line in judged["evidence"])


def test_validation_off_is_warn(fixture_text):
    parsed, judged = _run(fixture_text, "validation_off.txt")
    assert all(r["oop_wrong"] is None and r["ip_wrong"] is None for r in parsed["rows"])
    assert judged["verdict"] == "warn" and "validation was off" in judged["reasons"][0]


def test_cuda_failure_fails(fixture_text):
    parsed, judged = _run(fixture_text, "cuda_failure.txt", rc=1)
    assert not parsed["rows"] and len(parsed["gpus"]) == 8
    assert judged["verdict"] == "fail" and "Test CUDA failure" in judged["reasons"][0]


def test_nccl_failure_under_mpirun(fixture_text):
    parsed, judged = _run(fixture_text, "nccl_failure_mpirun.txt", rc=3, min_busbw_gbps=20)
    assert len(parsed["rows"]) == 10
    assert judged["verdict"] == "fail"
    assert "Test NCCL failure" in judged["reasons"][0]
    assert not any("below the minimum" in r for r in judged["reasons"]), "bandwidth of a failed run is not judged"


def test_nonzero_exit_after_results_fails(fixture_text):
    _, judged = _run(fixture_text, "h100_8gpu_ok.txt", rc=1)
    assert judged["verdict"] == "fail" and "rc=1" in judged["reasons"][0]


def test_truncated_run_warns(fixture_text):
    parsed, judged = _run(fixture_text, "truncated.txt")
    assert parsed["largest_size_bytes"] == 64 << 20 and parsed["out_of_bounds"] is None
    assert judged["verdict"] == "warn" and "stop at 64 MiB" in judged["reasons"][0]


def test_v1_layout_without_root_column(fixture_text):
    parsed, judged = _run(fixture_text, "v1_no_root_column.txt")
    assert len(parsed["rows"]) == 18 and parsed["rows"][0]["root"] is None
    assert parsed["rows"][-1]["oop_wrong"] == 0 and parsed["gpus"][0]["group"] is None
    assert judged["verdict"] == "pass", judged["reasons"]


def test_garbage_is_error(fixture_text):
    parsed, judged = _run(fixture_text, "garbage.txt", rc=126)
    assert judged["verdict"] == "error" and parsed["unparsed"]["count"] == 2
    assert any("Exec format error" in line for line in judged["evidence"])


def test_a_numbers_only_line_is_not_a_row():
    parsed = parse_nccl_tests("1 2 3 4 5 6 7 8 9 10 11 12 13\n")
    assert not parsed["rows"] and parsed["unparsed"]["count"] == 1


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_fuzz_random_text_never_raises(text):
    evaluate(parse_nccl_tests(text), rc=0, min_busbw_gbps=10.0)


TOKENS = st.sampled_from(["8", "1073741824", "-1", "float", "sum", "N/A", "12.5", "1.2e+04", "nan", "0", "#",
                          "size", "count", "type", "root", "time", "algbw", "busbw", "#wrong", "Rank", "Out of bounds "
                          "values :", "Avg bus bandwidth :", "FAILED", "OK", "Test NCCL failure", "\n", "  ", "[0x1f]"])


@settings(max_examples=300, deadline=None)
@given(st.lists(TOKENS, max_size=60))
def test_fuzz_table_fragments_never_raise(tokens):
    parsed = parse_nccl_tests(" ".join(tokens))
    judged = evaluate(parsed, rc=0, min_busbw_gbps=1.0)
    if judged["verdict"] == "pass":
        assert parsed["rows"] and parsed["wrong_values"] == 0 and not parsed["failures"]
        assert parsed["peak_busbw_gbps"] >= 1.0
