"""kentino.gpufleet.gpu_sample against a stand-in nvidia-smi serving a time series, and the per-GPU figures its judge
(module_utils/judge_samples.py) computes from the samples."""

from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import gpu_sampling, judge_samples
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULTS
from helpers.module_runner import run_module

FAST = {"duration": 1.0, "interval": 0.2}
# The module's option defaults, under the inventory's names: what the re-judge uses.
T = dict(DEFAULTS)


def _run(standin, scenario, **args):
    stand = standin(scenario)
    result = run_module("gpu_sample", args=dict(FAST, **args), env=stand.env, path_prepend=[stand.bin_dir])
    assert not result.get("failed"), result
    return result, stand.calls


def _codes(findings):
    return sorted((f["code"], f["gpu"]) for f in findings)


def test_load_series_summary(standin, contract):
    result, calls = _run(standin, "load")
    assert result["stopped_early"] is False and result["problems"] == []
    assert len(result["samples"]) == 5 and len(calls) == 5
    assert [s["t_s"] for s in result["samples"]] == sorted(s["t_s"] for s in result["samples"])
    first = result["samples"][0]["gpus"][0]
    assert set(first) == {"index", "pci", "temperature_c", "power_w", "pcie_gen_current", "pcie_width_current",
                          "utilization_gpu_pct", "throttle_reasons", "memory_used_mib", "pcie_gen_max",
                          "pcie_width_max", "ecc_volatile_corrected"}
    assert first["pcie_gen_current"] == 1 and first["throttle_reasons"] == ["gpu_idle"]
    assert (first["pcie_gen_max"], first["pcie_width_max"], first["ecc_volatile_corrected"]) == (5, 16, 0)
    per = {g["pci"]: g for g in result["per_gpu"]}
    # The idle first sample (gen 1) does not count: the best link seen under load is compared with the rated one.
    assert per["0000:18:00"]["pcie_gen_under_load"] == 5 and per["0000:18:00"]["loaded_samples"] == 4
    assert per["0000:3a:00"]["pcie_gen_under_load"] == 3  # degraded link under load
    assert per["0000:2a:00"]["pcie_width_under_load"] == 8
    hot = per["0000:5d:00"]
    assert hot["max_temperature_c"] == 94 and hot["seconds_above_limit_s"] > 0
    assert hot["throttle_reasons_seen"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert per["0000:18:00"]["seconds_above_limit_s"] == 0 and per["0000:18:00"]["throttle_reasons_seen"] == []
    assert all(g["samples"] == 5 for g in result["per_gpu"])
    assert result["per_gpu"] == judge_samples.figures(result, T)[0], "per_gpu is the judge's figures"
    findings = contract("gpu_sample", result, judge_samples.judge, T)
    assert _codes(findings) == [("PCIE_DEGRADED", 1), ("PCIE_DEGRADED", 2), ("THERMAL_THROTTLE", 3)]
    assert result["verdict"] == "fail"
    degraded = [f for f in findings if f["gpu"] == 2][0]
    assert "gen 3 x16, max gen 5 x16" in degraded["message"] and degraded["pci"] == "0000:3a:00"
    assert "riser" in degraded["action"]


def test_thresholds_are_options(standin, contract):
    # The old option names are aliases; 60 C for 0.5 s makes every GPU fail for heat, no sample counts as loaded.
    result, _calls = _run(standin, "load", temperature_threshold_c=60, load_threshold_pct=101, temp_sustained_s=0.5)
    per = {g["pci"]: g for g in result["per_gpu"]}
    assert per["0000:18:00"]["seconds_above_limit_s"] > 0.5 and per["0000:18:00"]["temperature_limit_c"] == 60
    assert all(g["pcie_gen_under_load"] is None and g["loaded_samples"] == 0 for g in result["per_gpu"])
    t = dict(T, gpufleet_temp_max_c=60.0, gpufleet_load_util_min_pct=101.0, gpufleet_temp_sustained_s=0.5)
    findings = contract("gpu_sample", result, judge_samples.judge, t)
    assert [c for c in _codes(findings) if c[0] == "THERMAL_SUSTAINED"] == [("THERMAL_SUSTAINED", i) for i in range(4)]
    assert "PCIE_DEGRADED" not in [f["code"] for f in findings], "no loaded sample: the link is not judged"
    # The fleet report re-judges the same samples with the inventory's thresholds: the defaults give another answer.
    assert "THERMAL_SUSTAINED" not in [f["code"] for f in judge_samples.judge(result, T, "vm")]


def test_lost_gpu_keeps_sampling_the_others(standin, contract):
    # From the 4th sample on GPU 0000:3A:00.0 is lost: its samples so far are kept and the other three are sampled
    # for the whole duration (a lost GPU is judged with the XIDs, from `problems`).
    result, calls = _run(standin, "load_lost", duration=1.6)
    assert result["stopped_early"] is False and result["stop_reason"] is None
    assert [(p["kind"], p["pci"]) for p in result["problems"]] == [("lost", "0000:3a:00")]
    assert "GPU is lost" in result["problems"][0]["message"]
    assert len(calls) == 8 and len(result["samples"]) == 8
    assert [len(s["gpus"]) for s in result["samples"]] == [4, 4, 4, 3, 3, 3, 3, 3]
    per = {g["pci"]: g for g in result["per_gpu"]}
    assert per["0000:3a:00"]["samples"] == 3 and per["0000:18:00"]["samples"] == 8
    contract("gpu_sample", result, judge_samples.judge, T)


def test_old_driver_probes_fields_once(standin):
    result, calls = _run(standin, "v100_r418")
    assert result["nvidia_smi"]["rejected_fields"] == ["pcie.link.gen.gpucurrent"]
    assert sum(1 for c in calls if "--help-query-gpu" in c) == 1
    assert len(calls) == len(result["samples"]) + 2
    assert result["samples"][0]["gpus"][0]["pcie_gen_current"] == 3


def test_missing_tool_returns_a_problem(empty_path, contract):
    result = run_module("gpu_sample", args=FAST, env=empty_path)
    assert not result.get("failed") and result["samples"] == []
    assert [p["kind"] for p in result["problems"]] == ["tool_missing"]
    findings = contract("gpu_sample", result, judge_samples.judge, T)
    assert result["verdict"] == "error" and _codes(findings) == [("SAMPLES_MISSING", None)]
    assert "nvidia-smi not found" in result["reasons"][0]


def test_driver_not_loaded_stops_after_three_empty_samples(standin, contract):
    # Nothing readable three times in a row ends the sampling (one failed call could be a transient hiccup).
    result, calls = _run(standin, "driver_not_loaded", duration=30.0)
    assert result["stopped_early"] and result["samples"] == [] and len(calls) == 3
    assert result["duration_s"] < 5
    assert "couldn't communicate" in result["stop_reason"]
    findings = contract("gpu_sample", result, judge_samples.judge, T)
    assert result["verdict"] == "error" and _codes(findings) == [("SAMPLES_MISSING", None)]


@pytest.mark.parametrize("bad", [{"interval": 0}, {"duration": -1}, {"timeout": 0}])
def test_invalid_options_fail(bad):
    result = run_module("gpu_sample", args=dict(FAST, **bad))
    assert result["failed"] and list(bad)[0] in result["msg"]


def _gpu(temp, util, gen, width=16, reasons=(), ecc=None):
    return {"index": 0, "pci": "0000:18:00", "temperature_c": temp, "power_w": 100.0, "pcie_gen_current": gen,
            "pcie_width_current": width, "utilization_gpu_pct": util, "throttle_reasons": list(reasons),
            "memory_used_mib": 1, "pcie_gen_max": 5, "pcie_width_max": 16, "ecc_volatile_corrected": ecc}


def _figures(samples, interval=5.0, limit=85, load=50):
    t = dict(T, gpufleet_temp_max_c=limit, gpufleet_load_util_min_pct=load)
    return judge_samples.figures({"samples": samples, "interval_s": interval}, t)


def test_figures_count_time_above_the_limit_by_sample_spacing():
    samples = [
        {"t_s": 0.0, "gpus": [_gpu(80, 0, 1, reasons=["gpu_idle"], ecc=3)]},
        {"t_s": 5.0, "gpus": [_gpu(86, 100, 4, width=8)]},
        {"t_s": 11.0, "gpus": [_gpu(90, 100, 5, reasons=["sw_thermal_slowdown"], ecc=5)]},
        {"t_s": 15.0, "gpus": [_gpu(85, 30, 2)]},
    ]
    (entry,), series = _figures(samples)
    assert entry["seconds_above_limit_s"] == 10.0  # 86 for 6 s, 90 for 4 s; 85 is not above 85
    assert entry["max_temperature_c"] == 90
    # The best link seen under load: one loaded sample at gen 5 x16 proves the riser can hold it (the former
    # summary reported the worst, gen 4 x8, which a momentary dip under load also produces).
    assert (entry["pcie_gen_under_load"], entry["pcie_width_under_load"]) == (5, 16)
    assert entry["loaded_samples"] == 2 and entry["samples"] == 4
    assert entry["throttle_reasons_seen"] == ["sw_thermal_slowdown"]
    assert (entry["ecc_corrected_first"], entry["ecc_corrected_last"]) == (3, 5)
    assert series == {"0": [[0.0, 80], [5.0, 86], [11.0, 90], [15.0, 85]]}


def test_figures_handle_unreadable_values():
    (entry,), series = _figures([{"t_s": 0.0, "gpus": [_gpu(None, None, None)]}])
    assert entry["max_temperature_c"] is None and entry["pcie_gen_under_load"] is None and entry["samples"] == 1
    assert entry["seconds_above_limit_s"] == 0.0 and series == {}


def test_stop_file_ends_sampling_normally(standin, tmp_path):
    stop = tmp_path / "burn.stop"
    stop.write_text("")
    result, calls = _run(standin, "load", duration=30.0, interval=0.2, stop_file=str(stop))
    # One sample is always taken; the existing stop mark ends the run long before the 30 s duration.
    assert len(result["samples"]) == 1 and len(calls) == 1
    assert result["stopped_early"] is False and result["duration_s"] < 5
    # The mark is only read: it lives in the run's directory, which goes with the run (the burn stage's contract).
    assert stop.exists()


def test_stop_file_absent_samples_for_the_duration(standin, tmp_path):
    result, calls = _run(standin, "load", stop_file=str(tmp_path / "never"))
    assert len(result["samples"]) == 5 and len(calls) == 5


def test_junk_output_stops_with_the_reason(tmp_path, contract):
    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia_smi" / "csv" / "junk_exit0.txt"
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncat '%s'\nexit 0\n" % fixture)
    smi.chmod(0o755)
    result = run_module("gpu_sample", args=dict(FAST, executable=str(smi)))
    assert not result.get("failed"), result
    assert result["samples"] == [] and result["per_gpu"] == []
    assert result["stopped_early"] is True and "is not a GPU row" in result["stop_reason"]
    assert {p["kind"] for p in result["problems"]} == {"unparsable_output"}
    assert result["verdict"] == "error"
    contract("gpu_sample", result, judge_samples.judge, T)


def test_a_long_sampling_returns_the_compact_result(standin, monkeypatch):
    """The sampler itself returns judge_samples.compact's result: past the limit (3 here instead of 720), per_gpu
    over every sample, fewer samples, and the same findings as the whole run would give."""
    stand = standin("load")
    for key, value in stand.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(judge_samples, "MAX_RETURNED_SAMPLES", 3)
    result = gpu_sampling.sample(str(stand.path), 30, 0.1, 3.0, T)
    assert result["samples_thinned"] is True and result["samples_total"] == len(stand.calls) == 30
    assert len(result["samples"]) < 20
    assert all(g["samples"] == 30 for g in result["per_gpu"]), "the figures count every sample"
    assert _codes(judge_samples.judge(result, T, "node")) == [("PCIE_DEGRADED", 1), ("PCIE_DEGRADED", 2),
                                                              ("THERMAL_THROTTLE", 3)]
