# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""NVMe health parsers: `nvme smart-log <dev> -o json` and `smartctl -j -a <dev>` (stdlib only: runs on the node).

Both are normalised to one health dict so the checkpoint check judges a drive the same way whichever tool exists.
Traps (docs/signals.md section 7 and the tools' sources):
- nvme-cli temperature is KELVIN; smartctl's is Celsius.
- nvme-cli 1.x prints 128-bit counters as floats (`2838307.000000`); 2.x as integers or decimal strings;
  `-H`/verbose turns critical_warning into an object {"value": n, "ro": 0/1, ...}; some builds spell "Temperature".
- data_units_written counts units of 1000 * 512 bytes (512,000), not 512 bytes and not MiB.
- smartctl names the wear key `percentage_used` (nvme-cli: `percent_used`); its exit status is a bitmask.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import decimal
import json
import re

DATA_UNIT_BYTES = 512000

CRITICAL_WARNING_BITS = (
    (0, "spare_below_threshold", "available spare capacity has fallen below the threshold"),
    (1, "temperature", "temperature is above or below a critical threshold"),
    (2, "reliability_degraded", "NVM subsystem reliability is degraded by media or internal errors"),
    (3, "read_only", "media has been placed in read-only mode"),
    (4, "volatile_backup_failed", "volatile memory backup device has failed"),
    (5, "pmr_read_only", "persistent memory region has become read-only"),
)

# smartctl(8) EXIT STATUS: bits, not a plain pass/fail. Bits 0-2 mean the tool could not read the device.
SMARTCTL_EXIT_BITS = (
    (0, "command_line_error", "smartctl did not parse its command line"),
    (1, "device_open_failed", "the device could not be opened (permissions? low-power mode?)"),
    (2, "smart_command_failed", "a SMART/health command failed or returned a checksum error"),
    (3, "disk_failing", "SMART status says the disk is FAILING"),
    (4, "prefail_below_threshold", "pre-fail attributes are at or below threshold"),
    (5, "attributes_below_threshold_past", "attributes were at or below threshold in the past"),
    (6, "error_log_has_errors", "the device error log contains records"),
    (7, "self_test_log_has_errors", "the self-test log contains errors"),
)

_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _empty_health(source):
    return {
        "source": source,
        "device": None,
        "model": None,
        "serial": None,
        "critical_warning": None,
        "critical_warning_flags": [],
        "temperature_c": None,
        "available_spare_pct": None,
        "available_spare_threshold_pct": None,
        "percent_used": None,
        "data_units_written": None,
        "data_written_tb": None,
        "media_errors": None,
        "error_log_entries": None,
        "unsafe_shutdowns": None,
        "power_on_hours": None,
        "problems": [],
    }


def _problem(result, kind, message, line=None):
    result["problems"].append({"kind": kind, "message": message, "line": (line or "")[:300]})


def _to_number(value):
    """int/float/Decimal/numeric string (with thousands separators or a unit suffix) -> int or float; else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, decimal.Decimal):
        # A 128-bit counter has at most 39 digits; anything larger is garbage (and int() of 1e999999 would hang).
        if not value.is_finite() or value.adjusted() > 40:
            return None
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return int(value) if value.is_integer() else value
    if isinstance(value, str):
        match = _NUMBER_RE.search(value)
        if not match:
            return None
        try:
            return _to_number(decimal.Decimal(match.group(0).replace(",", "")))
        except decimal.InvalidOperation:
            return None
    return None


def _load_json(text, result):
    """JSON object from tool output that may carry a non-JSON preamble (warnings). None on failure."""
    if not isinstance(text, str) or not text.strip():
        _problem(result, "empty", "the tool printed nothing")
        return None
    start = text.find("{")
    if start < 0:
        _problem(result, "not_json", "no JSON object in the output", text.strip().splitlines()[0])
        return None
    try:
        # Decimal keeps 128-bit counters exact instead of rounding them through a double.
        data, _end = json.JSONDecoder(parse_float=decimal.Decimal).raw_decode(text[start:])
    except ValueError as exc:
        _problem(result, "not_json", "output is not valid JSON: %s" % exc, text[start:start + 300])
        return None
    if not isinstance(data, dict):
        _problem(result, "not_json", "JSON output is not an object", text[start:start + 300])
        return None
    return data


def decode_critical_warning(value):
    """Bitmask -> list of flag names (bits 0-5)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return []
    return [name for bit, name, _text in CRITICAL_WARNING_BITS if value & (1 << bit)]


def critical_warning_text(name):
    for _bit, flag, text in CRITICAL_WARNING_BITS:
        if flag == name:
            return text
    return name


def decode_smartctl_exit(rc):
    """smartctl exit status -> list of {bit, name, meaning}. Empty for 0 or a non-integer."""
    if not isinstance(rc, int) or isinstance(rc, bool) or rc <= 0:
        return []
    return [{"bit": bit, "name": name, "meaning": text} for bit, name, text in SMARTCTL_EXIT_BITS if rc & (1 << bit)]


def _get(data, *names):
    for name in names:
        if name in data:
            return data[name]
    return None


def _set_number(result, key, raw, field):
    number = _to_number(raw)
    if raw is not None and number is None:
        _problem(result, "bad_value", "%s is not a number: %r" % (field, raw), "%s: %r" % (field, raw))
    result[key] = number
    return number


def _finish(result):
    cw = result["critical_warning"]
    result["critical_warning_flags"] = decode_critical_warning(cw) if isinstance(cw, int) else []
    duw = result["data_units_written"]
    if isinstance(duw, (int, float)) and duw >= 0:
        result["data_written_tb"] = round(duw * DATA_UNIT_BYTES / 1e12, 3)
    return result


def _nvme_cli_temperature_c(raw, result):
    """nvme-cli temperature (Kelvin number; some human builds print "311 K" or "38 °C (311 K)") -> Celsius."""
    if raw is None:
        return None
    kelvin = None
    if isinstance(raw, str):
        k_match = re.search(r"(\d+(?:\.\d+)?)\s*K\b", raw)
        c_match = re.search(r"(-?\d+(?:\.\d+)?)\s*\u00b0?\s*C\b", raw)
        if k_match:
            kelvin = float(k_match.group(1))
        elif c_match:
            return float(c_match.group(1))
        else:
            kelvin = _to_number(raw)
    else:
        kelvin = _to_number(raw)
    if not isinstance(kelvin, (int, float)) or kelvin <= 0:
        _problem(result, "bad_value", "temperature is not a positive Kelvin value: %r" % (raw,), repr(raw))
        return None
    return round(kelvin - 273.15, 1)


def parse_nvme_smart_log(text):
    """Parse `nvme smart-log <dev> -o json` (nvme-cli 1.x and 2.x). Never raises.

    Returns the normalised health dict (see _empty_health); problems list what could not be read.
    """
    result = _empty_health("nvme-cli")
    data = _load_json(text, result)
    if data is None:
        return result
    cw = data.get("critical_warning")
    if isinstance(cw, dict):
        cw = _get(cw, "value", "Value")
    _set_number(result, "critical_warning", cw, "critical_warning")
    if isinstance(result["critical_warning"], float):
        _problem(result, "bad_value", "critical_warning is not an integer bitmask", repr(cw))
        result["critical_warning"] = None
    result["temperature_c"] = _nvme_cli_temperature_c(_get(data, "temperature", "Temperature"), result)
    _set_number(result, "available_spare_pct", _get(data, "avail_spare", "available_spare"), "avail_spare")
    _set_number(result, "available_spare_threshold_pct", _get(data, "spare_thresh", "available_spare_threshold"),
                "spare_thresh")
    _set_number(result, "percent_used", _get(data, "percent_used", "percentage_used"), "percent_used")
    _set_number(result, "data_units_written", data.get("data_units_written"), "data_units_written")
    _set_number(result, "media_errors", data.get("media_errors"), "media_errors")
    _set_number(result, "error_log_entries", data.get("num_err_log_entries"), "num_err_log_entries")
    _set_number(result, "unsafe_shutdowns", data.get("unsafe_shutdowns"), "unsafe_shutdowns")
    _set_number(result, "power_on_hours", data.get("power_on_hours"), "power_on_hours")
    if result["critical_warning"] is None and result["percent_used"] is None:
        _problem(result, "missing", "neither critical_warning nor percent_used found: not a smart-log document")
    return _finish(result)


def parse_smartctl_json(text, rc=None):
    """Parse `smartctl -j -a <dev>` (NVMe or ATA). rc: smartctl's exit status, decoded as a bitmask. Never raises.

    Adds smart_passed (bool or None), exit_status, exit_bits to the normalised health dict.
    """
    result = _empty_health("smartctl")
    result["smart_passed"] = None
    data = _load_json(text, result)
    exit_status = rc
    if data is not None:
        meta = data.get("smartctl") if isinstance(data.get("smartctl"), dict) else {}
        if exit_status is None and isinstance(meta.get("exit_status"), int):
            exit_status = meta["exit_status"]
        for msg in meta.get("messages") or []:
            if isinstance(msg, dict) and msg.get("severity") == "error" and msg.get("string"):
                _problem(result, "tool_error", "smartctl: %s" % msg["string"], msg["string"])
        device = data.get("device") if isinstance(data.get("device"), dict) else {}
        result["device"] = device.get("name") if isinstance(device.get("name"), str) else None
        result["model"] = data.get("model_name") if isinstance(data.get("model_name"), str) else None
        result["serial"] = data.get("serial_number") if isinstance(data.get("serial_number"), str) else None
        status = data.get("smart_status")
        if isinstance(status, dict) and isinstance(status.get("passed"), bool):
            result["smart_passed"] = status["passed"]
        log = data.get("nvme_smart_health_information_log")
        if isinstance(log, dict):
            _set_number(result, "critical_warning", log.get("critical_warning"), "critical_warning")
            _set_number(result, "temperature_c", log.get("temperature"), "temperature")
            _set_number(result, "available_spare_pct", log.get("available_spare"), "available_spare")
            _set_number(result, "available_spare_threshold_pct", log.get("available_spare_threshold"),
                        "available_spare_threshold")
            _set_number(result, "percent_used", log.get("percentage_used"), "percentage_used")
            _set_number(result, "data_units_written", log.get("data_units_written"), "data_units_written")
            _set_number(result, "media_errors", log.get("media_errors"), "media_errors")
            _set_number(result, "error_log_entries", log.get("num_err_log_entries"), "num_err_log_entries")
            _set_number(result, "unsafe_shutdowns", log.get("unsafe_shutdowns"), "unsafe_shutdowns")
            _set_number(result, "power_on_hours", log.get("power_on_hours"), "power_on_hours")
        if result["temperature_c"] is None:
            temp = data.get("temperature")
            if isinstance(temp, dict):
                _set_number(result, "temperature_c", temp.get("current"), "temperature.current")
        if result["power_on_hours"] is None:
            pot = data.get("power_on_time")
            if isinstance(pot, dict):
                result["power_on_hours"] = _to_number(pot.get("hours"))
        if not isinstance(log, dict) and result["smart_passed"] is None:
            _problem(result, "missing", "no smart_status and no nvme_smart_health_information_log in the output")
    result["exit_status"] = exit_status if isinstance(exit_status, int) else None
    result["exit_bits"] = decode_smartctl_exit(exit_status)
    return _finish(result)


def assess_health(health, wear_warn_pct=80, spare_margin_pct=10):
    """Findings for a normalised health dict: [{severity: fail|warn, kind, message}].

    read-only media or reliability degraded fail (the drive is refusing or about to refuse writes); wear, spare near
    threshold, media errors and a FAILING SMART status are judged here so that both tools give the same answer.
    """
    findings = []
    device = health.get("device") or "the NVMe drive"

    def add(severity, kind, message):
        findings.append({"severity": severity, "kind": kind, "message": message})

    flags = health.get("critical_warning_flags") or []
    for flag in flags:
        severity = "fail" if flag in ("read_only", "reliability_degraded", "pmr_read_only",
                                       "volatile_backup_failed") else "warn"
        add(severity, "critical_warning_" + flag, "%s critical warning: %s" % (device, critical_warning_text(flag)))
    if health.get("smart_passed") is False:
        add("fail", "smart_failing", "%s: SMART overall health self-assessment FAILED" % device)
    used = health.get("percent_used")
    if isinstance(used, (int, float)) and used >= wear_warn_pct:
        add("warn", "wear", "%s has used %s%% of its rated endurance (warn at %s%%): plan a replacement"
            % (device, used, wear_warn_pct))
    spare, thresh = health.get("available_spare_pct"), health.get("available_spare_threshold_pct")
    if isinstance(spare, (int, float)) and isinstance(thresh, (int, float)) and "spare_below_threshold" not in flags:
        if spare < thresh:
            add("warn", "spare_below_threshold", "%s available spare %s%% is below its threshold %s%%"
                % (device, spare, thresh))
        elif spare <= thresh + spare_margin_pct:
            add("warn", "spare_near_threshold", "%s available spare %s%% is within %s points of its threshold %s%%"
                % (device, spare, spare_margin_pct, thresh))
    media = health.get("media_errors")
    if isinstance(media, (int, float)) and media > 0:
        add("warn", "media_errors", "%s reports %s media/data integrity errors" % (device, media))
    return findings
