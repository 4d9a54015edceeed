"""NVMe health parsers against fixtures of every nvme-cli/smartctl variant, plus fuzzing (never raise)."""

import json
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils.nvme_smart import (
    assess_health,
    decode_critical_warning,
    decode_smartctl_exit,
    parse_nvme_smart_log,
    parse_smartctl_json,
)
from hypothesis import given, settings
from hypothesis import strategies as st

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "storage"


def fixture(name):
    return (FIX / name).read_text()


def kinds(findings):
    return {f["kind"]: f["severity"] for f in findings}


def test_healthy_nvme_cli_2x():
    h = parse_nvme_smart_log(fixture("nvme_smart_healthy.json"))
    assert h["problems"] == []
    assert h["critical_warning"] == 0 and h["critical_warning_flags"] == []
    assert h["temperature_c"] == 37.9  # 311 K, not 311 C
    assert h["available_spare_pct"] == 100 and h["available_spare_threshold_pct"] == 10
    assert h["percent_used"] == 3
    # 19,397,424 units of 512,000 bytes = 9.931 TB
    assert h["data_units_written"] == 19397424
    assert h["data_written_tb"] == 9.931
    assert h["media_errors"] == 0 and h["error_log_entries"] == 608 and h["unsafe_shutdowns"] == 133
    assert assess_health(h) == []


def test_read_only_critical_warning_fails():
    h = parse_nvme_smart_log(fixture("nvme_smart_readonly.json"))
    assert h["critical_warning"] == 12
    assert h["critical_warning_flags"] == ["reliability_degraded", "read_only"]
    found = kinds(assess_health(h))
    assert found["critical_warning_read_only"] == "fail"
    assert found["critical_warning_reliability_degraded"] == "fail"
    assert found["wear"] == "warn"  # 112 % used
    assert found["media_errors"] == "warn"


def test_nvme_cli_1x_floats_are_exact_integers():
    h = parse_nvme_smart_log(fixture("nvme_smart_v1_floats.json"))
    assert h["problems"] == []
    assert h["data_units_written"] == 987654321012 and isinstance(h["data_units_written"], int)
    assert h["data_written_tb"] == round(987654321012 * 512000 / 1e12, 3)
    assert h["error_log_entries"] == 12 and isinstance(h["error_log_entries"], int)
    assert h["temperature_c"] == 31.9
    assert kinds(assess_health(h)) == {"wear": "warn"}  # 84 % >= 80


def test_verbose_object_capital_temperature_and_string_counters():
    h = parse_nvme_smart_log(fixture("nvme_smart_spare_low.json"))
    assert h["problems"] == []
    assert h["critical_warning"] == 1 and h["critical_warning_flags"] == ["spare_below_threshold"]
    assert h["temperature_c"] == 48.9
    assert h["data_units_written"] == 1899000222
    assert h["media_errors"] == 3
    found = kinds(assess_health(h))
    assert found["critical_warning_spare_below_threshold"] == "warn"
    assert "spare_near_threshold" not in found  # not reported twice


def test_spare_near_threshold_warns_without_the_flag():
    h = parse_nvme_smart_log(json.dumps({"critical_warning": 0, "temperature": 300, "avail_spare": 15,
                                         "spare_thresh": 10, "percent_used": 1}))
    assert kinds(assess_health(h)) == {"spare_near_threshold": "warn"}
    h = parse_nvme_smart_log(json.dumps({"critical_warning": 0, "temperature": 300, "avail_spare": 21,
                                         "spare_thresh": 10, "percent_used": 1}))
    assert assess_health(h) == []


def test_not_json_is_a_problem_not_an_exception():
    h = parse_nvme_smart_log(fixture("nvme_smart_permission_denied.txt"))
    assert h["problems"][0]["kind"] == "not_json"
    assert "Permission denied" in h["problems"][0]["line"]
    assert h["percent_used"] is None
    assert parse_nvme_smart_log("")["problems"][0]["kind"] == "empty"


def test_preamble_before_json_is_skipped():
    text = "Warning: deprecated option\n" + fixture("nvme_smart_healthy.json")
    assert parse_nvme_smart_log(text)["percent_used"] == 3


def test_bad_values_reported():
    h = parse_nvme_smart_log('{"critical_warning": "x", "temperature": 0, "percent_used": "lots", "avail_spare": [1]}')
    bad = [p["kind"] for p in h["problems"]]
    assert bad.count("bad_value") >= 3
    assert h["temperature_c"] is None and h["percent_used"] is None


def test_smartctl_passed():
    h = parse_smartctl_json(fixture("smartctl_nvme_passed.json"))
    assert h["smart_passed"] is True and h["exit_status"] == 0 and h["exit_bits"] == []
    assert h["percent_used"] == 2 and h["temperature_c"] == 41  # Celsius as is
    assert h["model"] == "Samsung SSD 990 PRO 4TB" and h["device"] == "/dev/nvme0"
    assert h["data_written_tb"] == round(35512345 * 512000 / 1e12, 3)
    assert assess_health(h) == []


def test_smartctl_failing_bitmask():
    h = parse_smartctl_json(fixture("smartctl_nvme_failing.json"))
    assert h["exit_status"] == 72
    assert [b["name"] for b in h["exit_bits"]] == ["disk_failing", "error_log_has_errors"]
    found = kinds(assess_health(h))
    assert found["smart_failing"] == "fail" and found["critical_warning_read_only"] == "fail"


def test_smartctl_error_log_bit_alone_is_not_a_failure():
    h = parse_smartctl_json(fixture("smartctl_nvme_errorlog_only.json"))
    assert [b["name"] for b in h["exit_bits"]] == ["error_log_has_errors"]
    assert h["smart_passed"] is True
    assert assess_health(h) == []


def test_smartctl_rc_argument_overrides_json_and_open_failure_is_reported():
    h = parse_smartctl_json(fixture("smartctl_open_failed.json"))
    assert [b["name"] for b in h["exit_bits"]] == ["device_open_failed"]
    assert any("Permission denied" in p["message"] for p in h["problems"])
    assert h["smart_passed"] is None and h["percent_used"] is None
    assert parse_smartctl_json(fixture("smartctl_nvme_passed.json"), rc=8)["exit_bits"][0]["name"] == "disk_failing"


def test_decoders():
    assert decode_critical_warning(0x1F) == ["spare_below_threshold", "temperature", "reliability_degraded",
                                             "read_only", "volatile_backup_failed"]
    assert decode_critical_warning(-1) == [] and decode_critical_warning(None) == []
    assert decode_smartctl_exit(None) == [] and decode_smartctl_exit(0) == []
    assert [b["bit"] for b in decode_smartctl_exit(255)] == list(range(8))


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20)
_keys = st.sampled_from(["critical_warning", "temperature", "Temperature", "avail_spare", "spare_thresh",
                         "percent_used", "data_units_written", "media_errors", "num_err_log_entries",
                         "unsafe_shutdowns", "power_on_hours", "nvme_smart_health_information_log",
                         "smart_status", "smartctl", "device", "temperature_c"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _json_values | st.dictionaries(_keys, _json_values, max_size=6), max_size=10),
       st.integers(min_value=-5, max_value=300) | st.none())
def test_fuzz_structured_never_raises(doc, rc):
    text = json.dumps(doc)
    for health in (parse_nvme_smart_log(text), parse_smartctl_json(text, rc=rc)):
        assert isinstance(health["problems"], list)
        assess_health(health)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_text_never_raises(text):
    for health in (parse_nvme_smart_log(text), parse_smartctl_json(text)):
        assert isinstance(health["problems"], list)
        assess_health(health)
