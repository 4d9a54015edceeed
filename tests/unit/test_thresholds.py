"""thresholds: inventory values checked by type, numbers written as text read as numbers, anything else refused with a
message naming the host and the variable (the default is used meanwhile)."""

import math

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import (
    DEFAULTS,
    THRESHOLDS,
    check_value,
    expected_words,
    resolve,
)
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.mark.parametrize("kind, raw, value", [
    ("number", 85, 85.0), ("number", 85.5, 85.5), ("number", "85", 85.0), ("number", " 85.5 ", 85.5),
    ("number", "1e3", 1000.0), ("number", 0, 0.0),
    ("int", 8, 8), ("int", "8", 8), ("int", 8.0, 8), ("int", "8.0", 8), ("int", 0, 0),
    ("fraction", 0.7, 0.7), ("fraction", "0.7", 0.7), ("fraction", 1, 1.0), ("fraction", "1", 1.0),
    ("list_int", [48, 63], [48, 63]), ("list_int", [], []), ("list_str", ["Xorg"], ["Xorg"]),
    ("rails", {"A": [0, 1, 2, 3], 2: [4]}, {"A": [0, 1, 2, 3], "2": [4]}),
    ("gbps_map", {"RTX 5090": 50}, {"RTX 5090": 50.0}),
    ("str_map", {"13": "info", "X": 1, "Y": None}, {"13": "info", "X": "1", "Y": None}),
    ("choice:warn|fail", "fail", "fail"),
])
def test_accepted_values_are_normalised(kind, raw, value):
    ok, normalised = check_value(kind, raw)
    assert ok is True and normalised == value and type(normalised) is type(value)


@pytest.mark.parametrize("kind, raw", [
    ("number", "85C"), ("number", "85 C"), ("number", -1), ("number", "-1"), ("number", True), ("number", None),
    ("number", "nan"), ("number", float("nan")), ("number", float("inf")), ("number", "inf"), ("number", [85]),
    ("number", ""), ("number", 10**400), ("fraction", 10**400), ("gbps_map", {"x": 10**400}), ("int", 8.5), ("int", "8.5"), ("int", "eight"), ("int", -2), ("int", False), ("int", "8GPUs"),
    ("fraction", 0), ("fraction", "0"), ("fraction", 1.01), ("fraction", "70%"), ("fraction", -0.5),
    ("list_int", [48, "63"]), ("list_int", "48,63"), ("list_int", [True]), ("list_int", {"a": 1}),
    ("list_str", ["a", 1]), ("list_str", "Xorg"),
    ("rails", {"A": []}), ("rails", {"A": "0,1"}), ("rails", [[0, 1]]), ("rails", {"A": [0, "1"]}),
    ("gbps_map", {"RTX 5090": 0}), ("gbps_map", {"RTX 5090": "50"}), ("gbps_map", {"x": float("nan")}),
    ("gbps_map", ["RTX"]), ("str_map", {"A": True}), ("str_map", {"A": [1]}), ("str_map", "a=b"),
    ("choice:warn|fail", "error"), ("choice:warn|fail", None), ("no-such-kind", 1),
])
def test_refused_values(kind, raw):
    ok, _value = check_value(kind, raw)
    assert ok is False


def test_every_default_passes_its_own_check():
    for name, (default, kind, meaning, source) in THRESHOLDS.items():
        assert meaning and source, name
        assert name.startswith("gpufleet_"), name
        if default is not None:
            ok, value = check_value(kind, default)
            assert ok, (name, default, kind)
            assert value == default, name
    assert DEFAULTS == dict((n, spec[0]) for n, spec in THRESHOLDS.items())


def test_resolve_reads_text_numbers_from_ini_inventories_and_extra_vars():
    t, sources, errors = resolve({"gpufleet_temp_max_c": "83", "gpufleet_expected_gpus": "8",
                                  "gpufleet_nccl_min_busbw_fraction": "0.8"}, host="node03")
    assert errors == []
    assert (t["gpufleet_temp_max_c"], t["gpufleet_expected_gpus"], t["gpufleet_nccl_min_busbw_fraction"]) == \
        (83.0, 8, 0.8)
    assert sources["gpufleet_temp_max_c"] == "inventory gpufleet_temp_max_c"
    assert sources["gpufleet_temp_sustained_s"] == "default" and t["gpufleet_temp_sustained_s"] == 300.0


def test_resolve_refuses_85C_naming_host_variable_type_and_fix():
    t, sources, errors = resolve({"gpufleet_temp_max_c": "85C", "gpufleet_temp_sustained_s": 60}, host="node03")
    (error,) = errors
    assert error.startswith("host node03: gpufleet_temp_max_c must be a number >= 0 (e.g. 85), got str '85C'")
    assert "host_vars/group_vars" in error and "the default 85.0 is used meanwhile" in error
    assert t["gpufleet_temp_max_c"] == 85.0 and sources["gpufleet_temp_max_c"] == "default"
    assert t["gpufleet_temp_sustained_s"] == 60.0, "the other values still apply"


def test_resolve_reports_every_bad_value_and_skips_unset_ones():
    t, _sources, errors = resolve({"gpufleet_psu_rails": {"A": "0-3"}, "gpufleet_busy_gpu_severity": "error",
                                   "gpufleet_nccl_min_busbw_gbps": None, "gpufleet_lost_xids": "79",
                                   "unrelated_var": "x"}, host="node07")
    assert sorted(e.split(":")[1].split()[0] for e in errors) == [
        "gpufleet_busy_gpu_severity", "gpufleet_lost_xids", "gpufleet_psu_rails"]
    assert all(e.startswith("host node07: ") for e in errors)
    assert any("must be one of warn, fail, got str 'error'" in e for e in errors)
    assert t == DEFAULTS, "every bad value keeps its default"


def test_expected_words():
    assert expected_words("number") == "a number >= 0 (e.g. 85)"
    assert expected_words("choice:warn|fail") == "one of warn, fail"


VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.just(10**400) | st.floats() | st.text(max_size=8),
                      lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                      max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(THRESHOLDS)), VALUES, max_size=6))
def test_resolve_never_raises_and_always_returns_checked_values(values):
    t, sources, errors = resolve(values, host="h")
    assert set(t) == set(DEFAULTS)
    for name, value in t.items():
        if sources[name] == "default":
            assert value == DEFAULTS[name]
        else:
            assert check_value(THRESHOLDS[name][1], value)[0], (name, value)
            assert not (isinstance(value, float) and math.isnan(value))
    assert all(e.startswith("host h: gpufleet_") for e in errors)
