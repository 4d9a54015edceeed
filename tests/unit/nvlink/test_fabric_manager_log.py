"""The fabric manager's own log lines (its journal: `journalctl -u nvidia-fabricmanager -o json`): the driver
interface version mismatch that names the fix, and NV_WARN_NOTHING_TO_DO (no NVSwitch for it to manage)."""

from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.fabric_manager_log import parse_fabric_manager_log
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import journal_record

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvlink"


def journal(name):
    """(message, epoch seconds) of each entry of a journalctl -o json fixture."""
    out = []
    for line in (FIXTURES / name).read_text().splitlines():
        rec = journal_record(line)
        out += [(m, rec.realtime_us / 1e6) for m in rec.messages]
    return out


def test_the_driver_interface_version_mismatch_names_both_versions():
    parsed = parse_fabric_manager_log(journal("fm_journal_version_mismatch.jsonl"))
    assert parsed["lines"] == 5
    (event,) = parsed["events"]
    assert (event["kind"], event["fabric_manager_version"], event["driver_version"]) == (
        "driver_version_mismatch", "570.148.08", "570.172.08")
    assert event["line"].startswith("fabric manager NVIDIA GPU driver interface version 570.148.08 don't match")
    assert event["at"] == pytest.approx(1796100001.000123)


def test_nothing_to_do_is_recognised():
    (event,) = parse_fabric_manager_log(journal("fm_journal_nothing_to_do.jsonl"))["events"]
    assert event["kind"] == "no_nvswitch" and "NV_WARN_NOTHING_TO_DO" in event["line"]


def test_variants_of_the_lines_as_operators_posted_them():
    lines = (FIXTURES / "fm_log_variants.txt").read_text().splitlines()
    parsed = parse_fabric_manager_log(lines)
    found = [(e["kind"], e.get("fabric_manager_version"), e.get("driver_version")) for e in parsed["events"]]
    assert found == [("driver_version_mismatch", "550.127.05", "550.120"),
                     ("driver_version_mismatch", "550.90.07", "550.107.02"),
                     ("driver_version_mismatch", "590.48.01", "580.126.09"),
                     ("no_nvswitch", None, None)]
    assert parsed["events"][0]["at"] is None


@pytest.mark.parametrize("garbage", [None, "", 17, ["\x00\xff", None, 3.5, ("x",)], b"bytes", [("", "not a time")]])
def test_never_raises(garbage):
    parsed = parse_fabric_manager_log(garbage)
    assert parsed["events"] == []
