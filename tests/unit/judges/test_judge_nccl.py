"""judge_nccl: every finding code, the bandwidth floor and where it comes from, bad input."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_nccl
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

GIB = 1 << 30


def _row(size, busbw, wrong=0):
    return {"size_bytes": size, "count": size // 4, "type": "float", "redop": "sum", "root": -1,
            "oop_time_us": 10.0, "oop_algbw_gbps": busbw / 1.75, "oop_busbw_gbps": busbw, "oop_wrong": wrong,
            "ip_time_us": 10.0, "ip_algbw_gbps": busbw / 1.75, "ip_busbw_gbps": busbw - 1.0, "ip_wrong": wrong,
            "line": "%12d %10d float sum -1 10.0 0.0 %.2f %s" % (size, size // 4, busbw, wrong)}


def healthy(peak=300.0, name="NVIDIA H100 80GB HBM3"):
    """A clean 8-byte..1 GiB sweep, validated, footer printed; busbw `peak` at 1 GiB."""
    rows = [_row(8, 0.01), _row(1 << 20, 40.0), _row(GIB, peak)]
    return {"tool": dict(TOOL_OK), "output_tail": [], "rows": rows, "failures": [], "gpus": [
        {"rank": r, "group": 0, "pid": 100 + r, "host": HOST, "device": r, "pci": None, "bus_id": "0x%02x" % r,
         "name": name} for r in range(8)],
        "header": {"ngpus": 8, "min_bytes": 8, "max_bytes": GIB, "step_factor": 2, "validation": 1},
        "peak_busbw_gbps": peak, "largest_size_bytes": GIB, "avg_busbw_gbps": 90.0, "concluded": True,
        "out_of_bounds": 0, "out_of_bounds_status": "OK", "bitwise_mismatches": None, "wrong_values": 0,
        "unparsed": {"count": 0, "samples": []}, "problems": []}


def judge(result, **t):
    return judge_nccl.judge(result, thresholds(**t), HOST)


def test_healthy_sweep_has_no_finding_and_matches_the_schema():
    result = healthy()
    findings = judge(result)
    assert findings == []
    assert_schema("nccl_test", result, findings)


@pytest.mark.parametrize("floor, expected", [(299.99, []), (300.0, []), (300.01, [("NCCL_BUSBW_LOW", None)])])
def test_busbw_floor_from_the_inventory(floor, expected):
    findings = judge(healthy(peak=300.0), gpufleet_nccl_min_busbw_gbps=floor)
    assert codes(findings) == expected
    if findings:
        f = only(findings, "NCCL_BUSBW_LOW")
        assert f["severity"] == "fail" and "300.0 GB/s < 300.0 GB/s at 1 GiB" in f["message"]
        assert "gpufleet_nccl_min_busbw_gbps" in f["message"] and "riser" in f["action"]
        assert any(line.startswith("  1073741824") for line in f["evidence"]), "the row at the largest size"


def test_default_floor_is_the_model_reference_times_the_fraction():
    # H100 370 GB/s x 0.7 = 259 GB/s
    assert codes(judge(healthy(peak=259.0))) == []
    f = only(judge(healthy(peak=258.9)), "NCCL_BUSBW_LOW")
    assert "built-in reference for H100 (370 GB/s) x 0.7" in f["message"]
    # the fraction and a site reference change the answer
    assert codes(judge(healthy(peak=259.0), gpufleet_nccl_min_busbw_fraction=0.8)) == [("NCCL_BUSBW_LOW", None)]
    f = only(judge(healthy(peak=300.0), gpufleet_nccl_reference_busbw_gbps={"H100 80GB": 500.0}), "NCCL_BUSBW_LOW")
    assert "gpufleet_nccl_reference_busbw_gbps reference for H100 80GB (500 GB/s)" in f["message"]
    # the longest matching name wins: "RTX 5090" (50) over a site's generic "RTX" (10)
    floor, where = judge_nccl.threshold(["NVIDIA GeForce RTX 5090"], thresholds(
        gpufleet_nccl_reference_busbw_gbps={"RTX": 10.0}))
    assert floor == 35.0 and "RTX 5090" in where


def test_gpu_names_from_the_node_win_over_the_tool_header():
    result = healthy(peak=30.0, name="NVIDIA GeForce RTX 4090")  # 25 x 0.7 = 17.5: passes
    assert judge(result) == []
    findings = judge_nccl.judge(result, thresholds(), HOST, gpu_names=["NVIDIA GeForce RTX 5090"])  # 35: fails
    assert codes(findings) == [("NCCL_BUSBW_LOW", None)]


def test_no_baseline_warns_with_the_figure():
    findings = judge(healthy(peak=42.0, name="Tesla V100-SXM2-16GB"))
    f = only(findings, "NCCL_NO_BASELINE")
    assert f["severity"] == "warn" and "42.0 GB/s" in f["message"] and "Tesla V100" in f["message"]
    assert judge(healthy(peak=42.0, name="Tesla V100-SXM2-16GB"), gpufleet_nccl_min_busbw_gbps=42.0) == []
    assert judge(healthy(peak=42.0, name="Tesla V100-SXM2-16GB"),
                 gpufleet_nccl_reference_busbw_gbps={"V100": 60.0}) == []  # 60 x 0.7 = 42


def test_nothing_moved_is_busbw_low_even_without_a_floor():
    result = healthy(peak=0.0, name="Tesla V100-SXM2-16GB")
    result["rows"][-1] = _row(GIB, 0.0)
    f = only(judge(result), "NCCL_BUSBW_LOW")
    assert "nothing moved" in f["message"]


def test_failure_lines_and_exit_code():
    result = healthy()
    result["failures"] = ["node01: Test NCCL failure common.cu:1006 'unhandled system error'"]
    result["tool"]["rc"] = 3
    findings = judge(result)
    assert codes(findings) == [("NCCL_FAIL", None), ("NCCL_FAIL", None)]
    assert "Test NCCL failure" in findings[0]["message"] and "rc=3" in findings[1]["message"]
    assert codes(judge(healthy(), gpufleet_nccl_min_busbw_gbps=1.0)) == []  # rc 0, no failure line
    # a failed run's bandwidth is a consequence: never a second finding
    low = set_path(result, ("peak_busbw_gbps",), 1.0)
    assert "NCCL_BUSBW_LOW" not in [c for c, _ in codes(judge(low))]


def test_wrong_values_out_of_bounds_and_bitwise_mismatches():
    bad = healthy()
    bad["rows"][1] = _row(1 << 20, 40.0, wrong=3)
    bad["wrong_values"] = 6
    f = only(judge(bad), "NCCL_WRONG_VALUES")
    assert "6 wrong values" in f["message"] and "1 MiB" in f["message"] and f["evidence"] == [bad["rows"][1]["line"]]
    assert codes(judge(set_path(healthy(), ("out_of_bounds",), 2))) == [("NCCL_WRONG_VALUES", None)]
    assert codes(judge(set_path(healthy(), ("bitwise_mismatches",), 1))) == [("NCCL_WRONG_VALUES", None)]
    assert codes(judge(set_path(healthy(), ("bitwise_mismatches",), 0))) == []


def test_no_rows_is_no_figure():
    empty = set_path(healthy(), ("rows",), [])
    empty["unparsed"] = {"count": 1, "samples": ["bash: all_reduce_perf: cannot execute binary file"]}
    f = only(judge(empty), "NCCL_NO_FIGURE")
    assert f["severity"] == "error" and f["evidence"] == empty["unparsed"]["samples"]
    f = only(judge(set_path(healthy(), ("peak_busbw_gbps",), None)), "NCCL_NO_FIGURE")
    assert "no bus bandwidth could be read" in f["message"]


def test_incomplete_runs_warn():
    # results stop at 64 MiB although maxBytes is 1 GiB
    short = set_path(healthy(), ("largest_size_bytes",), 64 << 20)
    assert codes(judge(short)) == [("NCCL_INCOMPLETE", None)]
    # when the next step would pass maxBytes, a last size below it is the legitimate end of the sweep
    step3 = set_path(set_path(short, ("header", "step_factor"), 32), ("rows",), short["rows"])
    assert codes(judge(step3)) == []
    # no footer at all
    no_footer = set_path(set_path(healthy(), ("concluded",), False), ("avg_busbw_gbps",), None)
    assert codes(judge(no_footer)) == [("NCCL_INCOMPLETE", None)]
    assert codes(judge(set_path(healthy(), ("concluded",), False))) == [], "old nccl-tests: the footer is enough"


def test_validation_off_warns():
    off = set_path(healthy(), ("header", "validation"), 0)
    assert codes(judge(off)) == [("NCCL_UNVALIDATED", None)]
    na = healthy()
    for row in na["rows"]:
        row["oop_wrong"] = row["ip_wrong"] = None
    assert codes(judge(na)) == [("NCCL_UNVALIDATED", None)]


def test_tool_that_could_not_run_or_timed_out_is_check_error():
    missing = {"tool": dict(TOOL_OK, rc=None, error="all_reduce_perf not found: install it")}
    f = only(judge(missing), "CHECK_ERROR")
    assert f["severity"] == "error" and "nccl_test could not run: all_reduce_perf not found" in f["message"]
    hung = {"tool": dict(TOOL_OK, rc=None, timed_out=True, duration_s=605.2), "output_tail": ["# nThread 1"]}
    f = only(judge(hung), "CHECK_ERROR")
    assert "timed out" in f["message"] and "605.2" in f["message"] and "# nThread 1" in f["evidence"]
    assert judge({"tool": dict(TOOL_OK, rc=None), "not_run": "check mode"}) == []


def test_figures_show_the_measured_figure_and_the_floor():
    fig = judge_nccl.figures(healthy(), thresholds())
    assert fig == {"busbw_gbps": 300.0, "min_busbw_gbps": 259.0,
                   "threshold_source": "built-in reference for H100 (370 GB/s) x 0.7", "avg_busbw_gbps": 90.0,
                   "largest_size_bytes": GIB}
    assert judge_nccl.figures(None, thresholds())["busbw_gbps"] is None


@pytest.mark.parametrize("bad", BAD_TOP)
def test_bad_input_is_refused_at_the_door(bad):
    findings = door("nccl_test", bad, lambda data: check_shape(judge_nccl.judge(data, thresholds(), HOST)))
    assert findings is None or (findings and all(f["severity"] == "error" for f in findings)), "no data is no claim"
    if findings is not None:
        assert judge_nccl.judge(bad, {}, HOST) == findings, "missing thresholds fall back to the defaults"
        judge_nccl.figures(bad, {})


@pytest.mark.parametrize("path, value", [
    (("rows", 0), None), (("rows", 2, "size_bytes"), None), (("rows",), "x"), (("gpus",), 5), (("gpus", 0), "x"),
    (("header",), []), (("peak_busbw_gbps",), "fast"), (("failures",), 3), (("tool",), None), (("tool", "rc"), "0"),
])
def test_values_of_the_wrong_type_are_refused_or_judged(path, value):
    door("nccl_test", set_path(healthy(), path, value), lambda data: check_shape(judge(data)))


@settings(max_examples=200, deadline=None)
@given(GARBAGE)
def test_fuzz_is_refused_or_judged(data):
    door("nccl_test", data, lambda d: (check_shape(judge_nccl.judge(d, thresholds(), HOST)),
                                       judge_nccl.figures(d, thresholds())))


def test_the_reference_applies_to_the_interconnect_it_was_measured_on():
    # H100's 370 GB/s is an NVSwitch (SXM) figure: on an NVSwitch node it is the floor, naming the interconnect.
    f = only(judge_nccl.judge(healthy(peak=200.0), thresholds(), HOST, topology="nvswitch"), "NCCL_BUSBW_LOW")
    assert "built-in reference for H100 on nvswitch (370 GB/s) x 0.7" in f["message"]
    # The same model over PCIe (H100 PCIe cards, or an HGX whose fabric is down): no reference, a warning saying how.
    w = only(judge_nccl.judge(healthy(peak=40.0), thresholds(), HOST, topology="pcie"), "NCCL_NO_BASELINE")
    assert "the H100 reference (370 GB/s) is for nvswitch machines, this node's GPUs talk over pcie" in w["message"]
    assert "{'H100@pcie': <GB/s>}" in w["message"]
    # A site's reference for that interconnect applies; an unqualified one applies to any.
    t = thresholds(gpufleet_nccl_reference_busbw_gbps={"H100@pcie": 50.0})
    assert codes(judge_nccl.judge(healthy(peak=36.0), t, HOST, topology="pcie")) == []
    f = only(judge_nccl.judge(healthy(peak=34.0), t, HOST, topology="pcie"), "NCCL_BUSBW_LOW")
    assert "gpufleet_nccl_reference_busbw_gbps reference for H100 on pcie (50 GB/s) x 0.7" in f["message"]
    assert judge_nccl.threshold(["NVIDIA H100 80GB HBM3"], thresholds(gpufleet_nccl_reference_busbw_gbps={
        "H100": 100.0}), topology="pcie")[0] == 70.0
    # A PCIe card's figure is not applied to an NVSwitch machine either; unknown topology keeps the model's figure.
    assert judge_nccl.threshold(["NVIDIA GeForce RTX 5090"], thresholds(), topology="nvswitch")[0] is None
    assert judge_nccl.threshold(["NVIDIA GeForce RTX 5090"], thresholds())[0] == 35.0
    assert judge_nccl.figures(healthy(), thresholds(), topology="pcie")["interconnect"] == "pcie"
