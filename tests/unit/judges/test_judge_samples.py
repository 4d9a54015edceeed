"""judge_samples: sustained heat, throttling, the PCIe link under load, corrected ECC rising, no samples; bad input."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_samples
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import schema_errors
from hypothesis import given, settings
from hypothesis import strategies as st
from judgelib import BAD_TOP, GARBAGE, HOST, assert_schema, check_shape, codes, door, only, set_path, thresholds


def _row(index=0, temp=70, util=100, gen=5, width=16, reasons=(), ecc=0):
    return {"index": index, "pci": "0000:%02x:00" % (0x18 + index), "temperature_c": temp, "power_w": 300.0,
            "pcie_gen_current": gen, "pcie_width_current": width, "utilization_gpu_pct": util,
            "throttle_reasons": list(reasons), "memory_used_mib": 1000, "pcie_gen_max": 5, "pcie_width_max": 16,
            "ecc_volatile_corrected": ecc}


def series(rows, interval=10.0):
    """One sample every `interval` s: rows[i] is the list of GPU rows of sample i."""
    return {"samples": [{"t_s": i * interval, "gpus": gpus} for i, gpus in enumerate(rows)], "per_gpu": [],
            "problems": [], "stopped_early": False, "stop_reason": None, "duration_s": len(rows) * interval,
            "interval_s": interval, "nvidia_smi": {}}


def healthy():
    # sample 0 idle at gen 1 (the downclock the judge must ignore), then 9 samples under load
    return series([[_row(util=0, gen=1, reasons=["gpu_idle"])]] + [[_row()] for _ in range(9)])


def judge(result, **t):
    return judge_samples.judge(result, thresholds(**t), HOST)


def test_healthy_load_has_no_finding_and_matches_the_schema():
    result = healthy()
    assert judge(result) == []
    assert_schema("gpu_sample", result, [])


def _hot(seconds, temp=90, interval=10.0):
    n = int(seconds / interval)
    return series([[_row(temp=temp)] for _ in range(n)] + [[_row(temp=80)]], interval)


@pytest.mark.parametrize("seconds, expected", [(290, []), (300, [("THERMAL_SUSTAINED", 0)])])
def test_sustained_heat_fails_at_the_duration(seconds, expected):
    # 30 samples at 90 C, 10 s apart = 300 s above 85 C; 29 = 290 s
    findings = judge(_hot(seconds))
    assert codes(findings) == expected
    if findings:
        f = findings[0]
        assert f["pci"] == "0000:18:00" and "above 85 C for 300 s" in f["message"] and "airflow" in f["action"]


def test_heat_thresholds_change_the_answer():
    result = _hot(100)
    assert judge(result) == []
    assert codes(judge(result, gpufleet_temp_sustained_s=100.0)) == [("THERMAL_SUSTAINED", 0)]
    assert judge(result, gpufleet_temp_sustained_s=100.0, gpufleet_temp_max_c=90.0) == [], "90 is not above 90"


def test_a_gap_in_sampling_is_not_evidence_of_heat():
    # two hot samples 10 s apart, then a 1000 s gap: the time counted is capped at 3 sampling steps
    result = series([[_row(temp=95)], [_row(temp=95)], [_row(temp=70)]])
    result["samples"][2]["t_s"] = 1010.0
    fig = judge_samples.figures(result, thresholds())[0][0]
    assert fig["seconds_above_limit_s"] == 40.0  # 10 s, then the stall counts for 3 steps of 10 s at most
    assert judge(result, gpufleet_temp_sustained_s=300.0) == []


def test_thermal_throttle_warns():
    result = healthy()
    result["samples"][3]["gpus"][0] = _row(reasons=["hw_thermal_slowdown"])
    f = only(judge(result), "THERMAL_THROTTLE")
    assert f["severity"] == "warn" and "1 of 10 samples" in f["message"] and f["gpu"] == 0
    # one step below: a power cap is a throttle reason, not a thermal one
    result["samples"][3]["gpus"][0] = _row(reasons=["sw_power_cap"])
    assert judge(result) == []


@pytest.mark.parametrize("gen, width, expected", [
    (5, 16, []), (4, 16, [("PCIE_DEGRADED", 0)]), (5, 8, [("PCIE_DEGRADED", 0)])])
def test_pcie_link_under_load_against_the_rated_link(gen, width, expected):
    result = series([[_row(gen=1, util=0)]] + [[_row(gen=gen, width=width)] for _ in range(5)])
    findings = judge(result)
    assert codes(findings) == expected
    if findings:
        assert "gen %d x%d, max gen 5 x16" % (gen, width) in findings[0]["message"]
        assert "riser" in findings[0]["action"]


def test_the_best_link_under_load_counts_and_load_is_a_threshold():
    # a momentary dip to gen 3 under load, gen 5 otherwise: not a degraded riser
    dip = series([[_row()], [_row(gen=3)], [_row()]])
    assert judge(dip) == []
    # gen 3 at 40 % utilisation: below the load threshold the link is not judged, above it it is
    light = series([[_row(gen=3, util=40)] for _ in range(3)])
    assert judge(light) == []
    assert codes(judge(light, gpufleet_load_util_min_pct=40.0)) == [("PCIE_DEGRADED", 0)]


@pytest.mark.parametrize("last, expected", [(0, []), (1, [("ECC_CORRECTED_RISING", 0)])])
def test_corrected_ecc_rising(last, expected):
    result = series([[_row(ecc=0)], [_row(ecc=0)], [_row(ecc=last)]])
    assert codes(judge(result)) == expected
    assert judge(result, gpufleet_ecc_corrected_rise=2) == []


def test_no_sample_is_samples_missing_unless_not_run():
    empty = set_path(series([]), ("stop_reason",), "nvidia-smi failed: couldn't communicate with the driver")
    f = only(judge(empty), "SAMPLES_MISSING")
    assert f["severity"] == "error" and "couldn't communicate" in f["message"]
    assert judge(set_path(series([]), ("not_run",), "check mode")) == []


def test_gpus_are_known_by_pci_address_not_position():
    # GPU 1 vanishes after the first sample: GPU 2's rows never mix with GPU 1's
    result = series([[_row(0), _row(1), _row(2, gen=3)], [_row(0), _row(2, gen=3)], [_row(0), _row(2, gen=3)]])
    per = {g["pci"]: g for g in judge_samples.figures(result, thresholds())[0]}
    assert per["0000:19:00"]["samples"] == 1 and per["0000:1a:00"]["samples"] == 3
    assert codes(judge(result)) == [("PCIE_DEGRADED", 2)]


@pytest.mark.parametrize("bad", BAD_TOP)
def test_bad_input_is_refused_at_the_door(bad):
    findings = door("gpu_sample", bad, lambda data: check_shape(judge_samples.judge(data, {}, HOST)))
    assert findings is None or (findings and all(f["severity"] == "error" for f in findings)), "no data is no claim"
    if not isinstance(bad, dict):
        assert judge_samples.figures(bad, {}) == ([], {})


@pytest.mark.parametrize("path, value", [
    (("samples", 1), None), (("samples", 1, "gpus"), None), (("samples", 1, "gpus", 0), "x"),
    (("samples", 1, "gpus", 0, "temperature_c"), "hot"), (("samples", 1, "t_s"), None),
    (("samples", 1, "gpus", 0, "throttle_reasons"), 5), (("samples", 1, "gpus", 0, "ecc_volatile_corrected"), "3"),
    (("interval_s",), "5"),
])
def test_values_of_the_wrong_type_are_refused_or_judged(path, value):
    door("gpu_sample", set_path(healthy(), path, value),
         lambda data: (check_shape(judge(data)), judge_samples.figures(data, thresholds())))


@settings(max_examples=200, deadline=None)
@given(GARBAGE)
def test_fuzz_is_refused_or_judged(data):
    door("gpu_sample", data, lambda d: (check_shape(judge_samples.judge(d, thresholds(), HOST)),
                                        judge_samples.figures(d, thresholds())))


def test_a_gpu_never_sampled_loaded_is_unchecked_unless_it_was_lost():
    """Beside a burn that did work, a GPU with only idle samples was not checked under load (an error, not a pass);
    a GPU lost during the run is not: whether a sample caught it loaded before it vanished is timing (seen on the
    test fleet: the same node's report differed between two runs), and its loss is the finding."""
    idle = series([[_row(0, util=0), _row(1, util=0)] for _ in range(5)])
    t = thresholds()
    unchecked = judge_samples.coverage(idle, t, HOST)
    assert [(f["code"], f["gpu"]) for f in unchecked] == [("SAMPLES_NOT_UNDER_LOAD", 0), ("SAMPLES_NOT_UNDER_LOAD", 1)]
    assert judge_samples.judge(idle, t, HOST) == []  # the sampler alone cannot know a load ran: the report checks
    by_pci = judge_samples.coverage(idle, t, HOST, lost=["0000:19:00.0"])
    assert [(f["code"], f["gpu"]) for f in by_pci] == [("SAMPLES_NOT_UNDER_LOAD", 0)]
    by_index = judge_samples.coverage(idle, t, HOST, lost=[0])
    assert [(f["code"], f["gpu"]) for f in by_index] == [("SAMPLES_NOT_UNDER_LOAD", 1)]


def _long_run(n=2000, interval=5.0):
    """n samples of three GPUs: GPU 0 healthy, GPU 1 hot for 400 s with thermal throttling in spells and its corrected
    ECC rising, GPU 2 on a degraded link; every 100th sample idle (util 0, gen 1)."""
    rows = []
    for i in range(n):
        idle = i % 100 == 0
        util = 0 if idle else 100
        hot = 1200 <= i < 1280
        throttled = hot and i % 3 == 0
        rows.append([_row(0, util=util, gen=1 if idle else 5),
                     _row(1, temp=91 if hot else 70 + i % 7, util=util, reasons=["sw_thermal_slowdown"] if throttled
                          else [], ecc=i // 500),
                     _row(2, util=util, gen=1 if idle else 3)])
    return series(rows, interval)


def test_a_long_run_returns_a_bounded_result_that_judges_the_same():
    """A burn of hours returns at most MAX_RETURNED_SAMPLES samples (per_gpu from all of them, the rows the findings
    quote kept), and every judge of the sampling gives the same findings, evidence and figures for it as for the whole."""
    whole = _long_run()
    t = thresholds()
    small = judge_samples.compact(whole, t)
    assert small["samples_thinned"] is True and small["samples_total"] == 2000
    assert len(small["samples"]) <= judge_samples.MAX_RETURNED_SAMPLES < len(whole["samples"])
    assert [s["t_s"] for s in small["samples"]] == sorted(s["t_s"] for s in small["samples"])
    findings = judge(whole)
    assert codes(findings) == [("THERMAL_SUSTAINED", 1), ("THERMAL_THROTTLE", 1), ("ECC_CORRECTED_RISING", 1),
                               ("PCIE_DEGRADED", 2)]
    assert judge(small) == findings
    assert judge_samples.coverage(small, t, HOST) == judge_samples.coverage(whole, t, HOST)
    assert judge_samples.figures(small, t)[0] == judge_samples.figures(whole, t)[0]
    throttle = [f for f in findings if f["code"] == "THERMAL_THROTTLE"][0]
    assert "in 27 of 2000 samples" in throttle["message"], "counted over every sample, not those returned"
    chart = judge_samples.figures(small, t)[1]["1"]
    assert len(chart) == judge_samples.MAX_SERIES_POINTS and max(v for _t, v in chart) == 91
    assert_schema("gpu_sample", small, findings)
    assert judge_samples.compact(healthy(), t) == healthy(), "a short run is returned whole"


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=1, max_value=60), st.integers(min_value=1, max_value=30),
       st.lists(st.tuples(st.integers(60, 95), st.integers(0, 100), st.integers(1, 5), st.booleans(),
                          st.integers(0, 3)), min_size=1, max_size=120))
def test_compact_never_changes_a_finding(seed_gpus, limit, rows):
    """Whatever the samples, a result compacted to any limit judges as the whole did (findings, evidence, coverage)."""
    gpus = 1 + seed_gpus % 3
    whole = series([[_row(g, temp=temp - g, util=util, gen=gen, reasons=["hw_thermal_slowdown"] if thermal else [],
                          ecc=ecc + g) for g in range(gpus)] for temp, util, gen, thermal, ecc in rows], 5.0)
    t = thresholds(gpufleet_temp_sustained_s=20.0)
    small = judge_samples.compact(whole, t, limit)
    assert len(small["samples"]) <= max(limit, gpus * 18) and len(small["samples"]) <= len(rows)
    assert judge_samples.judge(small, t, HOST) == judge_samples.judge(whole, t, HOST)
    assert judge_samples.coverage(small, t, HOST) == judge_samples.coverage(whole, t, HOST)


def test_a_thinned_result_without_its_figures_is_invalid():
    """The report judges a thinned result by its per_gpu figures: without them (or of the wrong type) the result does
    not match the schema and is a RESULT_INVALID error, never a pass on the few samples it carries."""
    small = judge_samples.compact(_long_run(), thresholds())
    assert schema_errors("gpu_sample", dict(small, per_gpu=[{"index": 1, "pci": "0000:19:00"}], verdict="pass"))
    assert schema_errors("gpu_sample", set_path(dict(small, verdict="pass"), ["per_gpu", 0, "samples"], "many"))
    assert schema_errors("gpu_sample", {k: v for k, v in dict(small, verdict="pass").items() if k != "samples_total"})
