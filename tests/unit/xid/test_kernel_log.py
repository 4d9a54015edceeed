"""The XID parser against every variant and trap of docs/signals.md section 1 (fixtures in tests/fixtures/kernel_log)."""

import datetime
import gzip
import io
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import (
    XidScanner,
    parse_journal_json,
    parse_kernel_log,
    parse_xid_line,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import (
    journal_record,
    open_log,
    split_prefix,
    syslog_year,
)

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_log"


def parse(name, **kw):
    return parse_kernel_log((FIX / name).read_text(), **kw)


def counted(result):
    return [e for e in result["events"] if e["counted"]]


def test_pci_forms_are_normalised():
    res = parse("xid_pci_forms.log")
    assert [e["pci"] for e in res["events"]] == ["0000:3b:00", "0000:01:00", "000a:c1:00"]
    assert res["unparsed"]["count"] == 0


def test_pid_and_name_forms():
    res = parse("xid_pid_forms.log")
    got = [(e["xid"], e["pid"], e["process"]) for e in res["events"]]
    assert got == [(31, 1234, "python3"), (64, 57530, None), (79, None, None), (48, None, None)]
    # the body survives whatever pid/name form preceded it
    assert res["events"][1]["message"].startswith("Row Remapper Error: (0x00000005d28c03a0)")
    assert res["events"][3]["message"].startswith("An uncorrectable double bit error")


def test_mig_instances():
    res = parse("xid_mig.log")
    assert [(e["gpu_instance"], e["compute_instance"]) for e in res["events"]] == [(1, None), (2, 0)]
    assert all(e["pci"] == "0000:3b:00" for e in res["events"])


def test_channel_tokens_old_and_new():
    res = parse("xid_channel.log")
    assert [e["channel"] for e in res["events"]] == [12, 12]


def test_long_bodies_are_kept_whole():
    res = parse("xid_long_body.log")
    first = res["events"][0]
    assert first["xid"] == 109
    assert first["message"].endswith("(context switch timeout, engine GRAPHICS (GR0), chid 32, tsg 7)")
    assert "Info 0x3c008  (context" in first["message"]  # double space kept
    assert [e["xid"] for e in res["events"]] == [109, 94, 95]
    assert [e["severity"] for e in res["events"]] == ["critical", "warning", "critical"]


def test_nvlink5_unit_status_link_subcode():
    res = parse("xid_nvlink5.log")
    links = [e["details"]["nvlink"] for e in res["events"]]
    assert [(n["unit"], n["fatal"], n["link"]) for n in links] == [
        ("RLW_REMAP", False, 5), ("NETIR_LINK_EVT", True, 17), ("NETIR_LINK_EVT", False, 3), ("MSE_WATCHDOG", True, 0)]
    # bits 20-25 of the first value
    assert [n["subcode"] for n in links] == [(0x004F8000 >> 20) & 0x3F, (0x02A10000 >> 20) & 0x3F,
                                             (0x00100003 >> 20) & 0x3F, (0x0BF00000 >> 20) & 0x3F]
    assert [n["subcode"] for n in links] == [4, 42, 1, 63]
    assert [e["severity"] for e in res["events"]] == ["warning", "critical", "warning", "critical"]


def test_xid_154_recovery_actions():
    res = parse("xid_154.log")
    to = [e["details"]["recovery_action_to"] for e in res["events"]]
    assert [a["code"] for a in to] == [4, 0, 1, 2, 3, 5, 6, 7]
    assert [a["name"] for a in to] == ["drain_and_reset", "none", "gpu_reset", "node_reboot", "drain_p2p",
                                       "recover_imex_domain", "bus_reset", "system_reboot"]
    assert [e["severity"] for e in res["events"]] == ["critical", "info", "critical", "critical", "warning",
                                                      "critical", "critical", "critical"]
    assert res["summary"]["by_code"] == {"154": 8}  # a 154 is never folded into a burst: each change matters


def test_xid_45_correlated_not_double_counted():
    res = parse("xid_45_correlated.log")
    events = res["events"]
    assert [(e["xid"], e["counted"]) for e in events] == [(48, True), (45, False), (45, False), (45, True)]
    assert events[1]["details"]["caused_by_xid"] == 48
    assert events[1]["correlated_with"]["xid"] == 48 and events[2]["correlated_with"]["xid"] == 48
    assert events[1]["severity"] == "info"
    assert events[3]["severity"] == "warning" and events[3]["pci"] == "0000:5e:00"  # solo 45
    assert res["summary"]["by_code"] == {"45": 1, "48": 1}
    assert res["summary"]["correlated"] == 2


def test_xid_13_burst_is_one_event():
    res = parse("xid_13_burst.log")
    assert res["summary"]["by_code"] == {"13": 2}
    first, second = res["events"]
    assert first["line_count"] == 6 and first["pid"] == 28812
    assert len(first["evidence"]) == 5  # capped
    assert second["line_count"] == 2 and second["pid"] == 29001
    assert res["summary"]["burst_lines_folded"] == 5 + 1


def test_xid_119_follow_on_lines_belong_to_the_event():
    res = parse("xid_119_rpc.log")
    assert res["summary"]["by_code"] == {"119": 1}
    event = res["events"][0]
    assert event["line_count"] == 9  # the Xid line + 8 NVRM lines of RPC history; the stack trace has no NVRM
    assert event["severity"] == "critical"
    assert res["unparsed"]["count"] == 0


def test_fallen_off_multiline_without_xid_is_a_lost_gpu():
    res = parse("fallen_off_multiline.log")
    assert res["lost_gpus"] == ["0000:b3:00"]
    (event,) = res["events"]
    assert event["xid"] == 79 and event["synthetic"] and event["severity"] == "critical"
    assert len(event["evidence"]) == 2


def test_fallen_off_single_line_without_xid():
    res = parse("fallen_off_single.log")
    assert res["lost_gpus"] == ["0000:29:00"]
    assert res["summary"]["by_code"] == {"79": 1}


def test_xid79_with_its_fallen_off_line_counts_once_and_maps_identity():
    res = parse("xid79_and_fallen_off.log")
    assert res["lost_gpus"] == ["0000:86:00"]
    assert res["summary"]["by_code"] == {"79": 1, "154": 1}
    assert not any(e["synthetic"] for e in res["events"])
    assert res["events"][0]["uuid"] == "GPU-5a1c7e2b-3f4d-4e21-9c0a-6b7d8e9f0a1b"
    assert res["events"][0]["serial"] == "1652123456789"


def test_identity_lines_are_a_map_not_events():
    res = parse("gpu_identity.log")
    assert res["summary"]["events"] == 1
    assert res["gpu_ids"] == {
        "0000:07:00": {"uuid": "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "serial": "1321019000321"},
        "0000:0a:00": {"uuid": "GPU-11111111-2222-3333-4444-555555555555", "serial": "1321019000999"},
    }


def test_unparseable_lines_are_counted_with_samples_and_unknown_codes_kept():
    res = parse("xid_unparseable.log")
    assert res["unparsed"]["count"] == 3
    assert res["unparsed"]["by_reason"] == {"xid_line": 3}
    assert "NVRM: Xid (PCI:0000:3b:0" in res["unparsed"]["samples"][0]["line"]
    unknown = [e for e in res["events"] if e["xid"] == 200]
    assert unknown and unknown[0]["severity"] == "unknown" and unknown[0]["mnemonic"] is None
    assert res["highest_severity"] == "unknown"  # an unknown code outranks the warning of the 31


def test_events_carry_catalog_fields():
    res = parse("xid_pid_forms.log")
    e79 = [e for e in res["events"] if e["xid"] == 79][0]
    assert e79["mnemonic"] == "GPU_HAS_FALLEN_OFF_THE_BUS"
    assert e79["action"] == {"immediate": "RESTART_BM", "investigatory": "CONTACT_SUPPORT"}
    assert e79["uptime_s"] == pytest.approx(1201.000001)
    assert e79["line"].startswith("[ 1201.000001] NVRM: Xid (PCI:0000:86:00): 79")


def test_severity_overrides_win():
    res = parse("xid_pid_forms.log", severity_overrides={"79": "warning", 64: "info"})
    sev = {e["xid"]: e["severity"] for e in res["events"]}
    assert sev[79] == "warning" and sev[64] == "info" and sev[48] == "critical"
    res = parse("fallen_off_single.log", severity_overrides={79: "info"})
    assert res["events"][0]["severity"] == "info"


EXPECTED_MIXED = [(79, "0000:86:00", False, 1), (13, "0000:3b:00", False, 2), (79, "0000:b3:00", True, 2),
                  (145, "0008:01:00", False, 1)]


@pytest.mark.parametrize("name", ["mixed.dmesg.log", "mixed.dmesg_T.log", "mixed.dmesg_iso.log", "mixed.dmesg_x.log",
                                  "mixed.syslog.log", "mixed.syslog_iso.log"])
def test_every_prefix_gives_the_same_events(name):
    res = parse(name, reference=datetime.datetime(2024, 12, 31, tzinfo=datetime.UTC))
    got = [(e["xid"], e["pci"], e["synthetic"], e["line_count"]) for e in res["events"]]
    assert got == EXPECTED_MIXED
    assert res["lost_gpus"] == ["0000:86:00", "0000:b3:00"]
    first = res["events"][0]
    if "dmesg_T" in name or "dmesg_iso" in name:
        assert first["uptime_s"] is None
    else:
        assert first["uptime_s"] == pytest.approx(1843.308145)
    if name in ("mixed.dmesg.log", "mixed.dmesg_x.log"):
        assert first["time"] is None  # uptime only: the module dates these from the boot time
    else:
        assert first["time"].startswith("2024-08-09T13:30:43")


def test_gzip_stream_equals_plain_stream():
    with open_log(FIX / "mixed.syslog.log.gz") as fh:
        scanner = XidScanner()
        scanner.scan_binary(fh)
    gz = scanner.result()
    plain = parse("mixed.syslog.log")
    assert [(e["xid"], e["pci"]) for e in gz["events"]] == [(e["xid"], e["pci"]) for e in plain["events"]]


def test_binary_scan_with_tiny_chunks_matches_line_parsing():
    data = (FIX / "xid_13_burst.log").read_bytes() + (FIX / "xid_119_rpc.log").read_bytes()
    for chunk in (1, 7, 64, 4096):
        scanner = XidScanner()
        consumed = scanner.scan_binary(io.BytesIO(data), chunk_bytes=chunk)
        res = scanner.result()
        assert consumed == len(data)
        assert res["summary"]["by_code"] == {"13": 2, "119": 1}, chunk


def test_binary_scan_leaves_an_unterminated_tail_for_the_next_read():
    data = b"[ 1.0] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, Ch 00000001\n[ 2.0] NVRM: Xid (PCI:0000:3b:00): 4"
    scanner = XidScanner()
    consumed = scanner.scan_binary(io.BytesIO(data), consume_partial_tail=False)
    assert consumed == data.index(b"\n") + 1
    assert scanner.result()["summary"]["xid_lines"] == 1


def test_journal_fixture_traps():
    res = parse_journal_json((FIX / "journal_two_boots.json").read_text())
    by_code = res["summary"]["by_code"]
    assert by_code == {"13": 1, "31": 1, "48": 1, "79": 2, "94": 1, "145": 1}
    e31 = [e for e in res["events"] if e["xid"] == 31][0]
    assert e31["process"] == "caf\ufffd"  # non-UTF-8 byte array decoded with a replacement
    assert res["unparsed"]["by_reason"] == {"journal_message_null": 1}
    e48 = [e for e in res["events"] if e["xid"] == 48][0]
    assert e48["boot_id"] == "0f9e8d7c6b5a49382716f5e4d3c2b1a0"
    assert e48["uptime_s"] == pytest.approx(620.25)
    assert e48["time"] == "2024-08-09T15:40:14.750000+00:00"


def test_journal_record_fields():
    rec = journal_record('{ "__CURSOR" : "s=1;i=2", "__REALTIME_TIMESTAMP" : "1723210243308145", '
                         '"__MONOTONIC_TIMESTAMP" : "1843309645", "_BOOT_ID" : ["b1", "b2"], "MESSAGE" : ["one", "two"] }')
    assert rec.cursor == "s=1;i=2" and rec.boot_id == "b1" and rec.messages == ["one", "two"]
    assert rec.uptime_s == pytest.approx(1843.309645)
    assert journal_record("not json").problem == "json"
    assert journal_record("[1, 2]").problem == "json"


def test_split_prefix_forms():
    assert split_prefix("[ 1843.308145] NVRM: x").uptime_s == pytest.approx(1843.308145)
    p = split_prefix("kern  :warn  : [ 1843.308145] NVRM: x")
    assert (p.kind, p.message) == ("dmesg_x", "NVRM: x")
    p = split_prefix("[Fri Aug  9 13:32:56 2024] NVRM: x")
    assert p.kind == "dmesg_t" and p.time.day == 9 and p.message == "NVRM: x"
    p = split_prefix("2024-08-09T13:32:56,123456+00:00 NVRM: x")
    assert p.time.microsecond == 123456 and p.message == "NVRM: x"
    p = split_prefix("Dec  2 11:38:47 host kernel: [  219.470994] NVRM: x",
                     reference=datetime.datetime(2025, 1, 3, tzinfo=datetime.UTC))
    assert (p.time.year, p.time.month, p.time.day) == (2024, 12, 2)  # December seen in January: last year
    assert p.uptime_s == pytest.approx(219.470994) and p.message == "NVRM: x"
    assert split_prefix("no prefix at all").message == "no prefix at all"


def test_syslog_year_inference():
    ref = datetime.datetime(2025, 3, 1)
    assert syslog_year(12, ref) == 2024 and syslog_year(3, ref) == 2025 and syslog_year(1, ref) == 2025


def test_since_skips_older_events():
    since = datetime.datetime(2024, 8, 9, 13, 33, 0, tzinfo=datetime.UTC)
    res = parse("mixed.syslog_iso.log", since=since)
    assert [e["xid"] for e in res["events"]] == [79, 145]  # the 3-line lost GPU at 13:33:21 and the 145
    assert res["summary"]["skipped_before_since"] == 4  # the 79, its fallen-off line, two lines of the 13


def test_max_events_keeps_the_newest_and_counts_all():
    text = "".join("[ %d.0] NVRM: Xid (PCI:0000:3b:00): 31, pid=%d, name=p, Ch 00000001\n" % (i * 10, i)
                   for i in range(1, 21))
    res = parse_kernel_log(text, max_events=5)
    assert len(res["events"]) == 5 and res["events"][-1]["pid"] == 20
    assert res["summary"]["by_code"] == {"31": 20} and res["summary"]["events_dropped"] == 15


def test_parse_xid_line_rejects_non_xid():
    assert parse_xid_line("NVRM: GPU at PCI:0000:07:00: GPU-abc") is None
    assert parse_xid_line("NVRM: Xid (PCI:0000:07:00): 79")["xid"] == 79


def test_gzip_detection_by_magic_not_name(tmp_path):
    fake = tmp_path / "kern.log"  # gzip content without .gz
    fake.write_bytes(gzip.compress((FIX / "fallen_off_single.log").read_bytes()))
    with open_log(fake) as fh:
        scanner = XidScanner()
        scanner.scan_binary(fh)
    assert scanner.result()["lost_gpus"] == ["0000:29:00"]


def test_result_is_stable_when_asked_twice():
    scanner = XidScanner()
    for line in (FIX / "fallen_off_single.log").read_text().splitlines():
        scanner.feed_line(line)
    assert scanner.result() == scanner.result()
    assert scanner.result()["summary"]["by_code"] == {"79": 1}


# ---------------------------------------------------------------- follow-on lines belong to the SAME GPU only


def test_init_failure_of_another_gpu_is_not_swallowed_by_an_xid_119():
    res = parse("xid_119_other_gpu_init_failed.log")
    event = res["events"][0]
    assert res["summary"]["by_code"] == {"119": 1}
    # Xid + 4 RPC-history lines of GPU2 + the table row after the foreign lines; not the 3b GPU's lines, not GPU5's
    assert event["line_count"] == 6
    assert not any("RmInitAdapter" in line or "rm_init_adapter" in line or "GPU5" in line for line in event["evidence"])
    failures = res["init_failures"]
    assert [(f["kind"], f["pci"], f["minor"], f["code"], f["count"]) for f in failures] == [
        ("init_failed", "0000:3b:00", 1, "0x26:0x56:1474", 2)]
    first = failures[0]
    assert first["line"].endswith("NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x56:1474)")
    assert first["uptime_s"] == pytest.approx(8120.901114)
    assert any("device minor number 1" in line for line in first["evidence"])
    assert res["summary"]["init_failures"] == 1


def test_init_failure_wordings_old_and_new():
    res = parse("init_failed_forms.log", reference=datetime.datetime(2024, 12, 1, tzinfo=datetime.UTC))
    got = [(f["pci"], f["minor"], f["code"], f["count"]) for f in res["init_failures"]]
    assert got == [
        (None, 0, "0x30:0xffff:660", 2),  # "for device bearing minor number 0", retried once
        (None, 2, "0x30:0xffffffff:858", 1),  # "rm_init_adapter(2) failed" (oldest drivers)
        ("0000:04:01", 3, "0x11:0x45:2525", 1),  # "GPU 0000:04:01.0: ... device minor number 3"
    ]
    assert res["events"] == [] and res["unparsed"]["count"] == 0
    assert res["init_failures"][0]["time"].startswith("2024-11-24T22:40:32")


def test_same_gpu_follow_ons_fold_and_another_gpus_do_not():
    res = parse("xid79_same_gpu_follow_on.log")
    event = res["events"][0]
    assert event["xid"] == 79 and event["pci"] == "0000:05:00"
    # Xid line + its serial-number line + 3 crash-dump lines; the 06 GPU's line is not part of the 05 GPU's event
    assert event["line_count"] == 5
    assert not any("0000:06:00.0" in line for line in event["evidence"])


def test_init_failure_is_found_by_the_binary_scan_too():
    data = (FIX / "xid_119_other_gpu_init_failed.log").read_bytes()
    scanner = XidScanner()
    scanner.scan_binary(io.BytesIO(data), chunk_bytes=64)
    assert [(f["pci"], f["count"]) for f in scanner.result()["init_failures"]] == [("0000:3b:00", 2)]


# ---------------------------------------------------------------- channel tokens


def test_channel_id_chid_and_channel_forms():
    res = parse("xid_channel_forms.log")
    assert [(e["xid"], e["channel"]) for e in res["events"]] == [
        (32, 0x1), (32, 0x18), (8, 0x28), (109, 0xA), (69, 0x10), (13, None)]  # "Subchannel 0x0" is not a channel


def test_burst_takes_its_channel_from_a_later_line():
    res = parse("xid_13_burst.log")
    assert [e["channel"] for e in res["events"]] == [0x10, 0x12]  # "ChID 0010" on the burst's last line


# ---------------------------------------------------------------- one severity policy


@pytest.mark.parametrize("overrides", [{}, {45: "critical", 79: "warning", 154: "info", 145: "info"}])
def test_every_event_carries_the_policy_severity_the_report_recomputes(overrides):
    """The node labels events with xid_policy.severity, the function the fleet report calls again: same answer."""
    from ansible_collections.kentino.gpufleet.plugins.module_utils import xid_policy

    seen = set()
    for path in sorted(FIX.glob("*.log")):
        for event in parse(path.name, severity_overrides=overrides)["events"]:
            expected = xid_policy.severity(event["xid"], event["details"], event["correlated_with"], overrides,
                                           synthetic=event["synthetic"])
            assert (event["severity"], event["severity_basis"]) == expected, (path.name, event["line"])
            seen.add((event["xid"], event["synthetic"], bool(event["correlated_with"])))
    # the cases that refine the catalog's default are all among the fixtures
    assert {(45, False, True), (45, False, False), (79, True, False), (154, False, False),
            (145, False, False)} <= seen


# ---------------------------------------------------------------- take_new (the watcher's way in)


def _xid_line(uptime, code=13, bus="3b", body="Graphics Exception"):
    return "[%12.6f] NVRM: Xid (PCI:0000:%s:00): %d, pid=42, name=python3, %s" % (uptime, bus, code, body)


def test_take_new_hands_out_each_event_once_and_forgets_it():
    scanner = XidScanner(max_events=10)
    scanner.feed_line(_xid_line(100.0))
    scanner.feed_line("[ 100.100000] NVRM: Xid (PCI:0000:3b:00) 13")  # an Xid line the parser cannot read
    first = scanner.take_new()
    assert [(e["xid"], e["pci"], e["counted"]) for e in first["events"]] == [(13, "0000:3b:00", True)]
    assert first["events"][0]["epoch_s"] is None and "_seq" not in first["events"][0]
    assert first["unparsed"] == {"xid_line": 1} and first["lost"] == []
    # the burst goes on in the next read: folded into the event already handed out, not a new one
    scanner.feed_line(_xid_line(100.5))
    assert scanner.take_new()["events"] == []
    # a GPU that falls off the bus without an Xid line, then an XID 45 caused by an earlier 79 on another GPU
    scanner.feed_line("[ 200.000000] NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.")
    scanner.feed_line(_xid_line(300.0, 79, "86", "GPU has fallen off the bus."))
    scanner.feed_line(_xid_line(300.2, 45, "86", "Preemptive Cleanup, due to previous errors."))
    new = scanner.take_new()
    assert [(e["xid"], e["counted"], e["severity"]) for e in new["events"]] == [(79, True, "critical"),
                                                                               (45, False, "info")]
    assert [(lost["pci"], lost["line"]) for lost in new["lost"]] == [
        ("0000:29:00", "[ 200.000000] NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.")]
    assert new["unparsed"] == {} and new["events_dropped"] == 0
    assert scanner.take_new() == {"events": [], "lost": [], "unparsed": {}, "events_dropped": 0}


def test_take_new_keeps_memory_bounded_over_a_long_follow():
    scanner = XidScanner(max_events=100)
    taken = dropped = 0
    for n in range(20000):
        scanner.feed_line(_xid_line(10.0 + n * 10, 31 + n % 2, "%02x" % (n % 200)))
        if n % 150 == 149:  # more than max_events between two takes: the oldest are dropped, and said so
            new = scanner.take_new()
            taken, dropped = taken + len(new["events"]), dropped + new["events_dropped"]
    taken += len(scanner.take_new()["events"])
    assert (taken, dropped) == (20000 - 133 * 50, 133 * 50)
    assert scanner.events == [] and scanner.counts_by_pci == {} and scanner.counts_by_code == {}
    assert len(scanner._recent_by_pci) <= 256 and len(scanner.unparsed_samples) <= 5
