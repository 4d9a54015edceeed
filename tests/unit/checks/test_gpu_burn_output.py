"""gpu_burn parser and judgement against recorded shapes (tests/fixtures/gpu_burn/README.md).

The judge reads what the gpu_burn module returns: the parser's output plus the tool section, with each GPU's
nvidia-smi index and PCI address from the module's map (here, without nvidia-smi: gpu_burn's own device numbers).
"""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_gpu_burn
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import module_fields
from ansible_collections.kentino.gpufleet.plugins.module_utils.gpu_burn_output import parse_gpu_burn, start_missing
from hypothesis import given, settings
from hypothesis import strategies as st

HOST = "node01"


def observations(parsed, rc=0):
    """The gpu_burn module's result for a parsed run (no nvidia-smi map: index = gpu_burn's device)."""
    for entry in parsed["gpus"]:
        entry.update(index=entry["cuda_index"], pci=None, uuid=None)
    return {
        "tool": {"argv": ["gpu_burn", "60"], "rc": rc, "timed_out": False, "duration_s": 61.0, "error": None},
        "output_tail": [], "gpu_map": None, "gpu_map_problem": "nvidia-smi not found", "gpus": parsed["gpus"],
        "initialised_gpus": len([g for g in parsed["gpus"] if g["initialised"]]), "frames": parsed["frames"],
        "summaries": parsed["summaries"], "burn_s": parsed["burn_seconds"], "tested_gpus": parsed["tested_gpus"],
        "last_percent": parsed["last_percent"], "init_failures": parsed["init_failures"],
        "compute_failures": parsed["compute_failures"], "cuda_failures": parsed["cuda_failures"],
        "aborted": parsed["aborted"], "unparsed": parsed["unparsed"], "problems": parsed["problems"],
        "start_missing": start_missing(parsed), "cuda_errors": parsed.get("cuda_errors", []),
        "terminated": parsed.get("terminated", []),
    }


def judge(parsed, expected_gpus=None, rc=0):
    """(findings, {verdict, reasons, evidence}) as the module and the report compute them."""
    findings = judge_gpu_burn.judge(observations(parsed, rc), {}, HOST, expected_gpus=expected_gpus)
    return findings, module_fields(findings)


def _run(fixture_text, name, expected_gpus=None, rc=0):
    parsed = parse_gpu_burn(fixture_text("gpu_burn", name))
    findings, judged = judge(parsed, expected_gpus=expected_gpus, rc=rc)
    return parsed, findings, judged


def _codes(findings):
    return [(f["code"], f["gpu"]) for f in findings]


def _by_index(parsed):
    return {g["index"]: g for g in parsed["gpus"]}


def test_healthy_run_passes_with_figures(fixture_text):
    parsed, findings, judged = _run(fixture_text, "healthy_2gpu.log", expected_gpus=2)
    assert judged["verdict"] == "pass" and findings == [], judged["reasons"]
    assert parsed["frames"] == 10 and parsed["summaries"] == 3 and parsed["tested_gpus"] == 2
    assert parsed["burn_seconds"] == 60 and parsed["compare_file"] == "compare.ptx"
    assert parsed["unparsed"]["count"] == 0
    gpu0, gpu1 = parsed["gpus"]
    assert gpu0["status"] == gpu1["status"] == "ok"
    assert gpu0["processed"] == 2670 and gpu0["gflops_max"] == 7122.0
    assert 7100 <= gpu0["gflops_mean"] <= 7122
    assert gpu1["max_temperature_c"] == 67 and gpu0["precision"] == "float"
    # A pass has no findings; the figures the report shows come from judge_gpu_burn.figures().
    assert any(line.startswith("Tested 2 GPUs") for line in parsed["evidence"])
    per, series = judge_gpu_burn.figures(observations(parsed))
    assert per[0] == {"index": 0, "pci": None, "burn_gflops": gpu0["gflops_mean"], "burn_gflops_max": 7122.0,
                      "burn_errors": 0, "burn_temperature_max_c": gpu0["max_temperature_c"]}
    assert sorted(series) == ["0", "1"] and len(series["0"]) == 10


def test_errors_counted_once_per_summary_window(fixture_text):
    # GPU 1 shows 3 then 5 (cumulative) before the first summary, then 1, 1 after it: 5 + 1 real errors, not 10.
    parsed, findings, judged = _run(fixture_text, "faulty_errors_reset.log")
    gpu1 = _by_index(parsed)[1]
    assert gpu1["status"] == "faulty" and gpu1["errors"] == 6 and gpu1["error_frames"] == 4
    assert gpu1["warning_frames"] == 4 and gpu1["final"] == "FAULTY"
    assert _by_index(parsed)[0]["status"] == "ok"
    assert judged["verdict"] == "fail" and _codes(findings) == [("BURN_FAULTY", 1)]
    assert findings[0]["message"].startswith("node01 GPU 1 produced wrong results") and "6 calculation errors" in \
        findings[0]["message"]
    assert "RMA" in findings[0]["action"]
    assert any("(WARNING!)" in line for line in judged["evidence"])


def test_negative_error_count_is_a_failure(fixture_text):
    parsed, findings, judged = _run(fixture_text, "negative_overflow.log")
    gpu0 = _by_index(parsed)[0]
    assert gpu0["status"] == "faulty" and gpu0["errors"] == 2147483000 and gpu0["negative_error_frames"] == 1
    assert judged["verdict"] == "fail" and any("overflowed" in r for r in judged["reasons"])
    assert _codes(findings) == [("BURN_FAULTY", 0)]


def test_died_worker_fails_even_though_final_says_ok(fixture_text):
    parsed, findings, judged = _run(fixture_text, "died.log")
    gpu1 = _by_index(parsed)[1]
    assert gpu1["final"] == "OK" and gpu1["status"] == "died"
    assert gpu1["errors"] == 0, "the -1 a dying worker reports is not a calculation error"
    assert judged["verdict"] == "fail"
    assert any("GPU 1" in r and "DIED" in r for r in judged["reasons"])
    # The node-level "Failure during compute" line names no GPU: it is evidence of GPU 1's finding, not a second
    # failure of its own (the former judgement listed it as a separate reason).
    assert _codes(findings) == [("BURN_FAULTY", 1)]
    assert any("Failure during compute" in line for line in findings[0]["evidence"])


def test_unknown_temperature_and_power_columns(fixture_text):
    parsed, _findings, judged = _run(fixture_text, "unknown_temp_power.log", expected_gpus=3)
    assert judged["verdict"] == "pass", judged["reasons"]
    gpus = _by_index(parsed)
    assert gpus[0]["max_temperature_c"] is None and gpus[1]["max_temperature_c"] == 61
    assert gpus[2]["max_power_w"] == 590.0


def test_ok_after_init_failure_is_not_trusted(fixture_text):
    parsed, findings, judged = _run(fixture_text, "init_failure_then_ok.log", expected_gpus=2)
    gpu1 = _by_index(parsed)[1]
    assert gpu1["final"] == "OK" and gpu1["status"] == "not_initialised"
    assert judged["verdict"] == "fail"
    assert _codes(findings) == [("BURN_FAULTY", 1), ("BURN_GPU_MISSING", None)]
    assert any("only 1 of 2 expected GPUs" in r for r in judged["reasons"])
    assert any("Couldn't init a GPU test" in line for line in findings[0]["evidence"])


def test_no_progress_frames_is_error_not_pass(fixture_text):
    parsed, findings, judged = _run(fixture_text, "no_frames.log")
    assert parsed["frames"] == 0 and parsed["tested_gpus"] == 2
    assert [g["final"] for g in parsed["gpus"]] == ["OK", "OK"]
    assert judged["verdict"] == "error" and _codes(findings) == [("BURN_NOT_RUN", None)]
    assert any("no progress frames" in r for r in judged["reasons"])


def test_cuda_802_in_terminate_lines_is_the_fabric_not_a_missing_progress(fixture_text):
    """gpu_burn's workers die of an uncaught CUDA error (`terminate called after throwing an instance of
    'std::runtime_error'` / `what():  Error (gpu_burn-drv.cpp:298): system not yet initialized`) and it loops: the
    burn is CUDA error 802, the fabric manager on an NVSwitch machine, not "no progress frames"."""
    parsed, findings, judged = _run(fixture_text, "terminate_802_loop.log", expected_gpus=2)
    errors = {(e["code"], e["name"], e["where"]): e["count"] for e in parsed["cuda_errors"]}
    assert errors == {(802, "CUDA_ERROR_SYSTEM_NOT_READY", "gpu_burn-drv.cpp:298"): 1,
                      (304, "CUDA_ERROR_OPERATING_SYSTEM", "gpu_burn-drv.cpp:298"): 3}
    assert parsed["terminated"] == [{"line": "terminate called after throwing an instance of 'std::runtime_error'",
                                     "count": 4}]
    assert parsed["unparsed"]["count"] == 0
    assert _codes(findings) == [("BURN_FABRIC_NOT_READY", None)] and judged["verdict"] == "fail"
    f = findings[0]
    assert "error 802" in f["message"] and "fabric manager" in f["action"] and "nvidia-fabricmanager" in f["action"]
    assert "what():  Error (gpu_burn-drv.cpp:298): system not yet initialized" in f["evidence"]
    assert not any("no progress frames" in r for r in judged["reasons"])


def test_cuda_802_when_cuda_init_fails_is_the_fabric_too(fixture_text):
    parsed, findings, _judged = _run(fixture_text, "init_cuda_802.log", expected_gpus=2)
    assert [(e["code"], e["where"]) for e in parsed["cuda_errors"]] == [(802, "gpu_burn-drv.cpp:304"),
                                                                        (3, "gpu_burn-drv.cpp:112")]
    assert _codes(findings) == [("BURN_FABRIC_NOT_READY", None)]
    assert "Couldn't init CUDA: Error (gpu_burn-drv.cpp:304): system not yet initialized" in findings[0]["evidence"]


def test_a_real_h200_run_captured_into_a_file_passes(fixture_text):
    """gpu-burn on a real H200, its block-buffered worker lines after the frames (fixtures README)."""
    parsed, findings, judged = _run(fixture_text, "h200_piped_20s.log", expected_gpus=1)
    assert parsed["unparsed"]["count"] == 0 and parsed["cuda_errors"] == []
    assert (parsed["compare_file"], parsed["burn_seconds"], parsed["tested_gpus"]) == ("compare.fatbin", 20, 1)
    (gpu,) = parsed["gpus"]
    assert (gpu["status"], gpu["memory_used_mb"], gpu["processed"], gpu["gflops_max"]) == ("ok", 128305, 998, 51063.0)
    assert findings == [] and judged["verdict"] == "pass"


def test_a_worker_killed_with_sigkill_lost_its_init_line_not_its_work(fixture_text):
    """SIGKILL drops the worker's unflushed "Initialized device" line: the work in its frames still proves the init,
    so a GPU that burnt without an error is not judged never initialised (a good card sent back)."""
    parsed, findings, judged = _run(fixture_text, "h200_worker_sigkilled.log", expected_gpus=1)
    (gpu,) = parsed["gpus"]
    assert gpu["initialised"] and gpu["memory_used_mb"] is None and gpu["status"] == "ok"
    assert findings == [] and judged["verdict"] == "pass"


def test_a_real_missing_compare_kernel_is_named(fixture_text):
    parsed, findings, judged = _run(fixture_text, "h200_no_compare_kernel.log", expected_gpus=1, rc=123)
    assert parsed["unparsed"]["count"] == 0 and parsed["aborted"]
    assert _codes(findings)[0] == ("BURN_NOT_RUN", None) and judged["verdict"] == "error"
    assert "compare.fatbin" in findings[0]["action"]


def test_cuinit_802_is_read_from_its_number_and_names_the_fabric(fixture_text):
    """gpu_burn since November 2025 prints what cuInit returned, the CUresult as a number: 802 is read from it even
    where the text after it is one no table knows."""
    parsed, findings, _judged = _run(fixture_text, "init_cuinit_802.log", expected_gpus=2)
    assert [(e["code"], e["where"]) for e in parsed["cuda_errors"]] == [(802, "cuInit"), (802, "gpu_burn-drv.cpp:317")]
    assert parsed["unparsed"]["count"] == 0
    assert _codes(findings) == [("BURN_FABRIC_NOT_READY", None)]
    assert "cuInit returned 802 (system not yet initialized)" in findings[0]["evidence"]
    reworded = fixture_text("gpu_burn", "init_cuinit_802.log").replace("system not yet initialized", "not ready yet")
    reparsed = parse_gpu_burn(reworded)
    assert [(e["code"], e["where"]) for e in reparsed["cuda_errors"]] == [(802, "cuInit"),
                                                                           (None, "gpu_burn-drv.cpp:317")]
    assert _codes(judge(reparsed, expected_gpus=2)[0]) == [("BURN_FABRIC_NOT_READY", None)]


def test_cuinit_returning_0_is_a_start_line_not_a_failure():
    parsed = parse_gpu_burn("cuInit returned 0 (no error)\nBurning for 10 seconds.\n")
    assert parsed["cuda_errors"] == [] and parsed["unparsed"]["count"] == 0


def test_a_burn_hung_in_its_802_loop_and_killed_still_names_the_fabric(fixture_text):
    """gpu_burn loops after its workers die of error 802 (wilicc/gpu-burn#92): the module kills it at its timeout,
    and the lines it printed until then still say why."""
    obs = observations(parse_gpu_burn(fixture_text("gpu_burn", "terminate_802_loop.log")))
    obs["tool"].update(timed_out=True, rc=None, duration_s=725.0)
    findings = judge_gpu_burn.judge(obs, {}, HOST, expected_gpus=2)
    assert _codes(findings) == [("BURN_FABRIC_NOT_READY", None)]
    assert "killed at its timeout" in findings[0]["message"]


def test_an_uncaught_string_exception_is_a_crash_not_a_missing_progress(fixture_text):
    parsed, findings, judged = _run(fixture_text, "terminate_std_string.log", expected_gpus=1)
    assert [t["line"].split("'")[1][:10] for t in parsed["terminated"]] == ["std::__cxx", "std::strin"]
    assert parsed["unparsed"]["count"] == 0
    assert _codes(findings) == [("BURN_NOT_RUN", None)] and judged["verdict"] == "error"
    assert "gpu_burn crashed" in findings[0]["message"] and "std::string" in " ".join(findings[0]["evidence"])


def test_all_workers_dead_aborts(fixture_text):
    parsed, findings, judged = _run(fixture_text, "aborted.log")
    assert parsed["aborted"] and all(g["status"] == "died" for g in parsed["gpus"])
    assert judged["verdict"] == "fail" and _codes(findings) == [("BURN_FAULTY", 0), ("BURN_FAULTY", 1)]
    assert any("No clients are alive" in line for line in judged["evidence"])


def test_frames_split_on_lines_and_space_indented_summary(fixture_text):
    parsed, _findings, judged = _run(fixture_text, "split_frames_spaces.log")
    assert parsed["frames"] == 7 and parsed["summaries"] == 2
    assert _by_index(parsed)[0]["errors"] == 1 and judged["verdict"] == "fail"


def test_frames_glued_without_separator(fixture_text):
    parsed, _findings, judged = _run(fixture_text, "concatenated_frames.log")
    assert parsed["frames"] == 8 and judged["verdict"] == "pass"
    assert _by_index(parsed)[1]["processed"] == 2136


@pytest.mark.parametrize("log, kernel", [("compare_kernel_missing.log", "compare.ptx"),
                                         ("compare_kernel_missing_fatbin.log", "compare.fatbin")])
def test_missing_compare_kernel_is_a_setup_error(fixture_text, log, kernel):
    parsed, findings, judged = _run(fixture_text, log, expected_gpus=2)
    assert judged["verdict"] == "error", "a missing compare kernel is not a GPU fault"
    # gpu_burn prints the line once per GPU: one finding, and the set-up error alone (no "only 0 of 2 GPUs").
    assert len(parsed["init_failures"]) == 2 and _codes(findings) == [("BURN_NOT_RUN", None)]
    assert "compare kernel" in findings[0]["message"] and kernel in findings[0]["action"]
    assert "chdir" in findings[0]["action"]


def test_gpu_that_did_no_work_fails(fixture_text):
    parsed, findings, judged = _run(fixture_text, "no_work_gpu.log")
    assert _by_index(parsed)[1]["status"] == "no_work"
    assert judged["verdict"] == "fail" and any("did no work" in r for r in judged["reasons"])
    assert _codes(findings) == [("BURN_FAULTY", 1)]
    assert findings[0]["evidence"] == ["GPU 1: OK"], "the final line it rests on, even though it says OK"


def test_run_killed_mid_frame_is_incomplete(fixture_text):
    parsed, findings, judged = _run(fixture_text, "truncated_killed.log")
    assert parsed["problems"] and parsed["problems"][0]["kind"] == "partial_frame"
    assert judged["verdict"] == "error" and any("did not finish" in r for r in judged["reasons"])
    assert _codes(findings) == [("BURN_NOT_RUN", None)]


def test_garbage_is_error_with_samples(fixture_text):
    parsed, findings, judged = _run(fixture_text, "garbage.txt")
    assert judged["verdict"] == "error" and _codes(findings) == [("BURN_NOT_RUN", None)]
    assert parsed["unparsed"]["count"] == 3 and judged["evidence"] == parsed["unparsed"]["samples"]


def test_expected_gpus_more_than_initialised_fails(fixture_text):
    _, findings, judged = _run(fixture_text, "healthy_2gpu.log", expected_gpus=8)
    assert judged["verdict"] == "fail" and any("only 2 of 8" in r for r in judged["reasons"])
    assert _codes(findings) == [("BURN_GPU_MISSING", None)]


def test_nonzero_exit_with_clean_output_is_error(fixture_text):
    _, findings, judged = _run(fixture_text, "healthy_2gpu.log", rc=2)
    assert judged["verdict"] == "error" and "rc=2" in judged["reasons"][0]
    assert _codes(findings) == [("BURN_NOT_RUN", None)]


def test_empty_and_non_string_input():
    for text in ("", None, b"bytes"):
        parsed = parse_gpu_burn(text)
        assert judge(parsed)[1]["verdict"] == "error"


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_fuzz_random_text_never_raises(text):
    judge(parse_gpu_burn(text))


FRAME_BITS = st.sampled_from([
    "\r", "\n", "12.5%  ", "proc'd: ", "267 (7100 Gflop/s) ", "- ", "-1 ", "(inf Gflop/s)", "  errors: ", "0 ",
    "-2147483000 ", " (WARNING!)", " (DIED!)", "  temps: ", "55 C ", "-- ", "  power: ", "300 W ", "\tSummary at: x\n",
    "Tested 2 GPUs:\n", "GPU 0: OK\n", "GPU 1: FAULTY\n", "Initialized device 0 with 1 MB of memory (1 MB available, "
    "using 1 MB of it), using FLOATS\n", "No clients are alive!  Aborting\n", "Couldn't init a GPU test: x\n",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(FRAME_BITS, max_size=40))
def test_fuzz_shuffled_tool_fragments_never_raise(parts):
    parsed = parse_gpu_burn("".join(parts))
    findings, judged = judge(parsed, expected_gpus=2)
    assert all(f["evidence"] for f in findings if f["gpu"] is not None), "a GPU finding quotes a line"
    assert judged["verdict"] in ("pass", "warn", "fail", "error")
    if judged["verdict"] == "pass":
        # The pass rule of docs/signals.md section 5, whatever the tool printed.
        assert parsed["frames"] and parsed["tested_gpus"] is not None
        for gpu in parsed["gpus"]:
            assert gpu["initialised"] and gpu["processed"] > 0 and gpu["gflops_max"] > 0
            assert gpu["errors"] == 0 and gpu["error_frames"] == 0 and not gpu["died"]
            assert gpu["final"] != "FAULTY"


# ---------------------------------------------------------------- output without "Initialized device" lines


def test_log_tail_statuses_come_from_summary_and_died_markers(fixture_text):
    parsed, findings, judged = _run(fixture_text, "tail_no_init.log", expected_gpus=3)
    gpus = _by_index(parsed)
    assert [gpus[i]["status"] for i in (0, 1, 2)] == ["ok", "faulty", "died"]
    assert parsed["init_lines_seen"] is False and parsed["tested_gpus"] == 3
    assert gpus[1]["final"] == "FAULTY" and gpus[1]["errors"] == 4
    assert judged["verdict"] == "fail"
    assert any("GPU 1" in r and "wrong results" in r for r in judged["reasons"])
    assert any("GPU 2" in r and "DIED" in r for r in judged["reasons"])
    assert not any("never initialised" in r or "expected GPUs initialised" in r for r in judged["reasons"])
    # what the tail cannot prove is said, not assumed
    assert any("Initialized device" in r for r in judged["reasons"])
    assert _codes(findings) == [("BURN_FAULTY", 1), ("BURN_FAULTY", 2), ("BURN_NOT_RUN", None)]


def test_summary_only_output_still_names_the_faulty_gpu(fixture_text):
    parsed, findings, judged = _run(fixture_text, "summary_only.log")
    gpus = _by_index(parsed)
    assert gpus[1]["status"] == "faulty" and gpus[1]["final"] == "FAULTY"
    assert judged["verdict"] == "fail" and any("GPU 1" in r and "FAULTY" in r for r in judged["reasons"])
    assert findings[0]["gpu"] == 1 and findings[0]["evidence"] == ["GPU 1: FAULTY"]


def test_clean_tail_is_not_a_pass(fixture_text):
    text = fixture_text("gpu_burn", "healthy_2gpu.log")
    tail = text[text.index("\r40.0%"):]  # what `tail -c` of a redirected run keeps
    parsed = parse_gpu_burn(tail)
    assert [g["status"] for g in parsed["gpus"]] == ["ok", "ok"]
    judged = judge(parsed, expected_gpus=2)[1]
    assert judged["verdict"] == "error" and any("Initialized device" in r for r in judged["reasons"])
    findings, judged = judge(parse_gpu_burn(tail), expected_gpus=3)  # a GPU missing from the output
    assert judged["verdict"] == "fail" and ("BURN_GPU_MISSING", None) in _codes(findings)


# ---------------------------------------------------------------- Gflop/s series for the report's chart


def test_gflops_series_one_point_per_frame(fixture_text):
    parsed, _findings, _judged = _run(fixture_text, "healthy_2gpu.log")
    gpu0, gpu1 = parsed["gpus"]
    assert gpu0["gflops_series"] == [[10.0, 7100.0], [20.0, 7111.0], [30.0, 7122.0], [40.0, 7100.0], [50.0, 7111.0],
                                     [60.0, 7122.0], [70.0, 7100.0], [80.0, 7111.0], [90.0, 7122.0], [100.0, 7100.0]]
    assert [p[1] for p in gpu1["gflops_series"]][:3] == [7063.0, 7074.0, 7085.0]


def test_gflops_series_of_a_dead_worker_drops_to_zero(fixture_text):
    parsed, _findings, _judged = _run(fixture_text, "tail_no_init.log")
    gpus = _by_index(parsed)
    assert gpus[2]["gflops_series"] == [[70.0, 7090.0], [80.0, 0.0], [90.0, 0.0], [100.0, 0.0]]
    assert gpus[0]["gflops_series"][-1] == [100.0, 7100.0]


def _long_run(frames):
    out = []
    for i in range(1, frames + 1):
        out.append("\r%.1f%%  proc'd: %d (%d Gflop/s) - %d (%d Gflop/s)   errors: 0 - 0   temps: 60 C - 61 C "
                   % (100.0 * i / frames, i, 7000 + i % 50, i, 6900 + i % 40))
    return ("Burning for 3600 seconds.\nInitialized device 0 with 1 MB of memory (1 MB available, using 1 MB of it), "
            "using FLOATS\nInitialized device 1 with 1 MB of memory (1 MB available, using 1 MB of it), using FLOATS\n"
            + "".join(out) + "\nTested 2 GPUs:\n\tGPU 0: OK\n\tGPU 1: OK\n")


def test_gflops_series_is_bounded_and_spans_the_run():
    parsed = parse_gpu_burn(_long_run(5000))
    for gpu in parsed["gpus"]:
        series = gpu["gflops_series"]
        assert 100 <= len(series) <= 240
        assert series[0][0] == 0.0 and series[-1][0] == 100.0  # first ("0.0%": 1 of 5000) and last frame kept
        assert [p[0] for p in series] == sorted(p[0] for p in series)
        gaps = [b[0] - a[0] for a, b in zip(series, series[1:], strict=False)]
        assert max(gaps) <= 2 * (100.0 / len(series)) + 1e-6  # evenly thinned, no hole
    assert parsed["frames"] == 5000
