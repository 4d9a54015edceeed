"""kentino.gpufleet.gpu_sample against a stand-in nvidia-smi serving a time series, and its summary function."""

import importlib
from pathlib import Path

import pytest
from helpers.module_runner import run_module

sample_mod = importlib.import_module("ansible_collections.kentino.gpufleet.plugins.modules.gpu_sample")

FAST = {"duration": 1.0, "interval": 0.2}


def _run(standin, scenario, **args):
    stand = standin(scenario)
    result = run_module("gpu_sample", args=dict(FAST, **args), env=stand.env, path_prepend=[stand.bin_dir])
    assert not result.get("failed"), result
    return result, stand.calls


def test_load_series_summary(standin):
    result, calls = _run(standin, "load")
    assert result["stopped_early"] is False and result["problems"] == []
    assert len(result["samples"]) == 5 and len(calls) == 5
    assert [s["t_s"] for s in result["samples"]] == sorted(s["t_s"] for s in result["samples"])
    first = result["samples"][0]["gpus"][0]
    assert set(first) == {"index", "pci", "temperature_c", "power_w", "pcie_gen_current", "pcie_width_current",
                          "utilization_gpu_pct", "throttle_reasons", "memory_used_mib"}
    assert first["pcie_gen_current"] == 1 and first["throttle_reasons"] == ["gpu_idle"]
    per = {g["pci"]: g for g in result["per_gpu"]}
    # the idle first sample (gen 1) does not count: only loaded samples judge the link
    assert per["0000:18:00"]["min_pcie_gen_under_load"] == 5 and per["0000:18:00"]["loaded_samples"] == 4
    assert per["0000:3a:00"]["min_pcie_gen_under_load"] == 3  # degraded link under load
    assert per["0000:2a:00"]["min_pcie_width_under_load"] == 8
    hot = per["0000:5d:00"]
    assert hot["max_temperature_c"] == 94 and hot["seconds_above_threshold_s"] > 0
    assert hot["throttle_reasons_seen"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert per["0000:18:00"]["seconds_above_threshold_s"] == 0 and per["0000:18:00"]["throttle_reasons_seen"] == []
    assert all(g["samples"] == 5 for g in result["per_gpu"])


def test_thresholds_are_options(standin):
    result, _calls = _run(standin, "load", temperature_threshold_c=60, load_threshold_pct=101)
    per = {g["pci"]: g for g in result["per_gpu"]}
    assert per["0000:18:00"]["seconds_above_threshold_s"] > 0 and per["0000:18:00"]["temperature_threshold_c"] == 60
    assert all(g["min_pcie_gen_under_load"] is None and g["loaded_samples"] == 0 for g in result["per_gpu"])


def test_lost_gpu_stops_early_and_keeps_what_it_has(standin):
    result, calls = _run(standin, "load_lost", duration=5.0)
    assert result["stopped_early"] is True
    assert "0000:3a:00" in result["stop_reason"] and "lost" in result["stop_reason"]
    assert [(p["kind"], p["pci"]) for p in result["problems"]] == [("lost", "0000:3a:00")]
    assert len(calls) == 4 and len(result["samples"]) == 4  # the partial sample of the 3 others is kept
    assert len(result["samples"][-1]["gpus"]) == 3
    assert result["duration_s"] < 3  # did not sit out the 5 s


def test_old_driver_probes_fields_once(standin):
    result, calls = _run(standin, "v100_r418")
    assert result["nvidia_smi"]["rejected_fields"] == ["pcie.link.gen.gpucurrent"]
    assert sum(1 for c in calls if "--help-query-gpu" in c) == 1
    assert len(calls) == len(result["samples"]) + 2
    assert result["samples"][0]["gpus"][0]["pcie_gen_current"] == 3


def test_missing_tool_returns_a_problem(empty_path):
    result = run_module("gpu_sample", args=FAST, env=empty_path)
    assert not result.get("failed") and result["samples"] == []
    assert [p["kind"] for p in result["problems"]] == ["tool_missing"]


def test_driver_not_loaded_stops_at_once(standin):
    result, calls = _run(standin, "driver_not_loaded")
    assert result["stopped_early"] and result["samples"] == [] and len(calls) == 1
    assert "couldn't communicate" in result["stop_reason"]


@pytest.mark.parametrize("bad", [{"interval": 0}, {"duration": -1}, {"timeout": 0}])
def test_invalid_options_fail(bad):
    result = run_module("gpu_sample", args=dict(FAST, **bad))
    assert result["failed"] and list(bad)[0] in result["msg"]


def _gpu(temp, util, gen, width=16, reasons=()):
    return {"index": 0, "pci": "0000:18:00", "temperature_c": temp, "power_w": 100.0, "pcie_gen_current": gen,
            "pcie_width_current": width, "utilization_gpu_pct": util, "throttle_reasons": list(reasons),
            "memory_used_mib": 1}


def test_summarize_counts_time_above_threshold_by_sample_spacing():
    samples = [
        {"t_s": 0.0, "gpus": [_gpu(80, 0, 1, reasons=["gpu_idle"])]},
        {"t_s": 5.0, "gpus": [_gpu(86, 100, 4, width=8)]},
        {"t_s": 11.0, "gpus": [_gpu(90, 100, 5, reasons=["sw_thermal_slowdown"])]},
        {"t_s": 15.0, "gpus": [_gpu(85, 30, 2)]},
    ]
    (entry,) = sample_mod.summarize(samples, 5.0, 85, 50)
    assert entry["seconds_above_threshold_s"] == 10.0  # 86 for 6 s, 90 for 4 s; 85 is not above 85
    assert entry["max_temperature_c"] == 90
    assert (entry["min_pcie_gen_under_load"], entry["min_pcie_width_under_load"]) == (4, 8)
    assert entry["loaded_samples"] == 2 and entry["samples"] == 4
    assert entry["throttle_reasons_seen"] == ["sw_thermal_slowdown"]


def test_summarize_handles_unreadable_values():
    samples = [{"t_s": 0.0, "gpus": [_gpu(None, None, None)]}]
    (entry,) = sample_mod.summarize(samples, 5.0, 85, 50)
    assert entry["max_temperature_c"] is None and entry["min_pcie_gen_under_load"] is None and entry["samples"] == 1


def test_stop_file_ends_sampling_normally(standin, tmp_path):
    stop = tmp_path / "burn.stop"
    stop.write_text("")
    result, calls = _run(standin, "load", duration=30.0, interval=0.2, stop_file=str(stop))
    # One sample is always taken; the existing stop mark ends the run long before the 30 s duration.
    assert len(result["samples"]) == 1 and len(calls) == 1
    assert result["stopped_early"] is False and result["duration_s"] < 5
    assert not stop.exists(), "the stop mark is consumed"


def test_stop_file_absent_samples_for_the_duration(standin, tmp_path):
    result, calls = _run(standin, "load", stop_file=str(tmp_path / "never"))
    assert len(result["samples"]) == 5


def test_junk_output_stops_with_the_reason(tmp_path):
    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia_smi" / "csv" / "junk_exit0.txt"
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncat '%s'\nexit 0\n" % fixture)
    smi.chmod(0o755)
    result = run_module("gpu_sample", args=dict(FAST, executable=str(smi)))
    assert not result.get("failed"), result
    assert result["samples"] == [] and result["per_gpu"] == []
    assert result["stopped_early"] is True and "not rows of the query" in result["stop_reason"]
    assert {p["kind"] for p in result["problems"]} == {"unparsable_output"}
