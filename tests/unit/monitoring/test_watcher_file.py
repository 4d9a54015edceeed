"""The XID watcher on a followed log file: counting, restarts, rotation, truncation, reboots, bad input."""

import os
import signal
import subprocess
import sys

import pytest
from watchlib import WATCHER, XID79, WatcherProc, read_metrics, syslog_line, total, value


def append(path, *lines, raw=None):
    with open(path, "ab") as fh:
        for line in lines:
            fh.write(line.encode() + b"\n")
        if raw is not None:
            fh.write(raw)


@pytest.fixture
def kern(tmp_path):
    path = tmp_path / "kern.log"
    append(path, syslog_line("Linux version 6.1.0 (boot noise)"))
    return path


@pytest.fixture
def watcher(tmp_path, kern):
    w = WatcherProc(tmp_path / "w", source="file", log_file=str(kern))
    yield w
    w.stop()


def xid_count(metrics, **labels):
    return total(metrics, "gpufleet_xid_events_total", **labels)


def test_an_xid_line_becomes_a_counter_with_the_catalog_severity_and_a_lost_gpu(watcher, kern):
    watcher.start()
    append(kern, syslog_line("usb 1-4: new high-speed USB device"),
           syslog_line("NVRM: GPU at PCI:0000:c1:00: GPU-5a1c7e2b-3f4d-4e21-9c0a-6b7d8e9f0a1b"),
           syslog_line("NVRM: GPU Board Serial Number: 1652123456789"),
           syslog_line(XID79.format(bus="c1")),
           syslog_line("NVRM: Xid (PCI:0000:3b:00): 13, pid=42, name=python3, Graphics SM Warp Exception"),
           syslog_line("NVRM: Xid (PCI:0000:3b:00): 13, pid=42, name=python3, Graphics SM Global Exception"))
    m = watcher.wait_for(lambda m: xid_count(m) == 2, what="two events")
    assert value(m, "gpufleet_xid_events_total", pci="0000:c1:00", xid="79") == 1
    assert value(m, "gpufleet_xid_events_total", pci="0000:c1:00", severity="critical",
                 uuid="GPU-5a1c7e2b-3f4d-4e21-9c0a-6b7d8e9f0a1b") == 1
    # XID 13 prints one line per SM: one event, with the catalog's severity for 13
    assert value(m, "gpufleet_xid_events_total", pci="0000:3b:00", xid="13", severity="warning") == 1
    assert value(m, "gpufleet_gpu_lost", pci="0000:c1:00") == 1
    assert value(m, "gpufleet_gpu_lost", pci="0000:3b:00") is None
    assert value(m, "gpufleet_xid_last_event_timestamp_seconds", pci="0000:c1:00", xid="79") > 0
    assert value(m, "gpufleet_watcher_bytes_read_total") == kern.stat().st_size  # whole lines, all of them
    assert "GPU 0000:c1:00 fell off the bus" in watcher.log()


def test_the_textfile_passes_promtool_check_metrics(watcher, kern):
    watcher.start()
    append(kern, syslog_line(XID79.format(bus="c1")), syslog_line("NVRM: Xid (PCI:0000:3b:00): 999, pid=1, name=x, ?"))
    watcher.wait_for(lambda m: xid_count(m) == 2)
    res = subprocess.run(["promtool", "check", "metrics"], input=watcher.prom.read_text(), capture_output=True,
                         text=True)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stdout + res.stderr
    # an unknown code is "unknown", never dropped
    assert value(watcher.metrics(), "gpufleet_xid_events_total", xid="999", severity="unknown") == 1


def test_lost_without_xid_line_and_xid_plus_message_count_one_xid_79_each(watcher, kern):
    watcher.start()
    append(kern, syslog_line(XID79.format(bus="c1")),
           syslog_line("NVRM: GPU 0000:c1:00.0: GPU has fallen off the bus."),  # same loss, second message
           syslog_line("NVRM: The NVIDIA GPU 0000:e1:00.0"),
           syslog_line("NVRM: (PCI ID: 10de:2b85) installed in this system has"),
           syslog_line("NVRM: fallen off the bus and is not responding to commands."))
    m = watcher.wait_for(lambda m: value(m, "gpufleet_gpu_lost", pci="0000:e1:00") == 1)
    assert value(m, "gpufleet_xid_events_total", pci="0000:c1:00", xid="79") == 1
    assert value(m, "gpufleet_xid_events_total", pci="0000:e1:00", xid="79") == 1
    # the loss message again later (the driver repeats it): still one loss in this boot
    append(kern, syslog_line("NVRM: GPU 0000:e1:00.0: GPU has fallen off the bus."),
           syslog_line("NVRM: Xid (PCI:0000:e1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
           syslog_line("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE"))
    m = watcher.wait_for(lambda m: value(m, "gpufleet_xid_events_total", xid="48") == 1)
    assert value(m, "gpufleet_xid_events_total", pci="0000:e1:00", xid="79") == 1


def test_xid_45_after_another_xid_is_not_counted_again(watcher, kern):
    watcher.start()
    append(kern, syslog_line("NVRM: Xid (PCI:0000:3b:00): 48, pid=3311, name=python3, DBE", uptime=6001.000001),
           syslog_line("NVRM: Xid (PCI:0000:3b:00): 45, pid=3311, name=python3, Ch 00000010, caused by previous "
                       "Xid 48", uptime=6001.00042),
           syslog_line("NVRM: Xid (PCI:0000:5e:00): 45, pid=4000, name=python3, Ch 00000012", uptime=6301.0))
    m = watcher.wait_for(lambda m: xid_count(m) == 2)
    assert value(m, "gpufleet_xid_events_total", pci="0000:3b:00", xid="45") is None
    assert value(m, "gpufleet_xid_events_total", pci="0000:5e:00", xid="45", severity="warning") == 1  # solo 45


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_restart_counts_nothing_twice(watcher, kern, sig):
    watcher.start()
    append(kern, syslog_line(XID79.format(bus="c1")))
    watcher.wait_for(lambda m: xid_count(m) == 1)
    assert watcher.stop(sig) in (0, -signal.SIGKILL)
    if sig == signal.SIGTERM:
        assert value(watcher.metrics(), "gpufleet_watcher_up") == 0  # a clean stop says so
    append(kern, syslog_line("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, written while the watcher was down"))
    watcher.start()
    m = watcher.wait_for(lambda m: value(m, "gpufleet_xid_events_total", xid="48") == 1)
    assert value(m, "gpufleet_xid_events_total", xid="79") == 1
    assert value(m, "gpufleet_gpu_lost", pci="0000:c1:00") == 1  # same boot: still lost
    watcher.stop()
    watcher.start()
    m = watcher.metrics()
    assert xid_count(m) == 2 and value(m, "gpufleet_watcher_bytes_read_total") == kern.stat().st_size


def test_a_line_is_read_when_it_is_written_not_at_the_next_poll(tmp_path, kern):
    """The watcher blocks on the file (inotify) instead of polling: with a poll interval and heartbeat of a minute,
    an XID still reaches the textfile within seconds."""
    w = WatcherProc(tmp_path / "w", source="file", log_file=str(kern), poll_seconds=60, heartbeat_seconds=60)
    try:
        w.start()
        append(kern, syslog_line(XID79.format(bus="c1")))
        w.wait_for(lambda m: xid_count(m) == 1, timeout=10, what="the XID without a poll")
        assert "polling" not in w.log()
    finally:
        w.stop()


def test_a_crash_between_two_state_saves_never_shows_a_lower_counter(tmp_path, kern):
    """The state (position and counters, fsync'ed) is saved less often than the textfile is written: after a crash
    the new process reads the log from the saved position before its first write, so the textfile goes on from the
    counts it showed, and nothing counts twice."""
    w = WatcherProc(tmp_path / "w", source="file", log_file=str(kern), state_write_seconds=3600)
    try:
        w.start()
        append(kern, syslog_line(XID79.format(bus="c1")), syslog_line("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x"))
        w.wait_for(lambda m: xid_count(m) == 2)
        assert w.state()["counters"] == []  # the state is behind the textfile: the case under test
        started = value(w.metrics(), "gpufleet_watcher_start_time_seconds")
        w.stop(signal.SIGKILL)
        w.start()
        m = w.wait_for(lambda m: value(m, "gpufleet_watcher_start_time_seconds") != started, what="the new process")
        assert xid_count(m) == 2 and value(m, "gpufleet_xid_events_total", xid="79") == 1
    finally:
        w.stop()


def test_rotation_while_running_and_while_stopped(watcher, kern):
    watcher.start()
    append(kern, syslog_line("NVRM: Xid (PCI:0000:01:00): 48, pid=1, name=x, one"))
    watcher.wait_for(lambda m: xid_count(m) == 1)
    os.rename(kern, str(kern) + ".1")  # logrotate: rename, then the writer reopens the path
    append(str(kern) + ".1", syslog_line("NVRM: Xid (PCI:0000:02:00): 48, pid=1, name=x, late line in the old file"))
    append(kern, syslog_line("NVRM: Xid (PCI:0000:03:00): 48, pid=1, name=x, first line of the new file"))
    watcher.wait_for(lambda m: xid_count(m) == 3, what="both files read")
    watcher.stop()
    append(kern, syslog_line("NVRM: Xid (PCI:0000:04:00): 48, pid=1, name=x, before the next rotation"))
    os.rename(str(kern) + ".1", str(kern) + ".2")
    os.rename(kern, str(kern) + ".1")
    append(kern, syslog_line("NVRM: Xid (PCI:0000:05:00): 48, pid=1, name=x, after it"))
    watcher.start()
    m = watcher.wait_for(lambda m: xid_count(m) == 5, what="the rotated file's rest and the new file")
    assert sorted(dict(ls)["pci"] for (n, ls) in m if n == "gpufleet_xid_events_total") == [
        "0000:01:00", "0000:02:00", "0000:03:00", "0000:04:00", "0000:05:00"]
    assert "was rotated to" in watcher.log()


def test_truncation_is_read_from_the_start(watcher, kern):
    watcher.start()
    append(kern, syslog_line("NVRM: Xid (PCI:0000:01:00): 48, pid=1, name=x, before"), syslog_line("x" * 200))
    watcher.wait_for(lambda m: xid_count(m) == 1)
    with open(kern, "wb"):
        pass  # logrotate copytruncate
    append(kern, syslog_line("NVRM: Xid (PCI:0000:02:00): 48, pid=1, name=x, after"))
    m = watcher.wait_for(lambda m: xid_count(m) == 2)
    assert value(m, "gpufleet_xid_events_total", pci="0000:02:00") == 1
    assert "truncated" in watcher.log()


def test_a_reboot_clears_lost_gpus_but_counters_continue(tmp_path, kern):
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("11111111-2222-3333-4444-555555555555\n")
    w = WatcherProc(tmp_path / "w", source="file", log_file=str(kern), boot_id_file=str(boot_id))
    try:
        w.start()
        append(kern, syslog_line(XID79.format(bus="c1")))
        w.wait_for(lambda m: value(m, "gpufleet_gpu_lost", pci="0000:c1:00") == 1)
        w.stop()
        boot_id.write_text("99999999-2222-3333-4444-555555555555\n")  # the node rebooted
        w.start()
        m = w.metrics()
        assert value(m, "gpufleet_gpu_lost", pci="0000:c1:00") == 0
        assert value(m, "gpufleet_xid_events_total", xid="79") == 1
        w.wait_for_log("rebooted since the last run")
        append(kern, syslog_line(XID79.format(bus="c1")))  # lost again in the new boot: a new event
        m = w.wait_for(lambda m: value(m, "gpufleet_gpu_lost", pci="0000:c1:00") == 1)
        assert value(m, "gpufleet_xid_events_total", xid="79") == 2
    finally:
        w.stop()


def test_bad_input_is_counted_never_fatal(watcher, kern):
    watcher.start()
    rnd = os.urandom(300000)
    append(kern, raw=rnd + b"\n")  # random bytes, newlines wherever they fall
    append(kern, raw=b"\xff\xfe invalid utf-8 \xc3\x28 NVRM: Xid (PCI:0000:aa:00): not-a-number\n")
    append(kern, raw=b"y" * (3 * 1024 * 1024) + b"\n")  # a 3 MB line (cut at 1 MiB, the rest skipped)
    append(kern, raw=b"NVRM: Xid " + b"z" * 100000 + b"\n")  # an overlong NVRM line
    append(kern, syslog_line(XID79.format(bus="c1")))
    m = watcher.wait_for(lambda m: xid_count(m) == 1, timeout=30, what="the XID after the garbage")
    assert watcher.proc.poll() is None
    assert value(m, "gpufleet_watcher_bytes_read_total") == kern.stat().st_size  # the dropped rests too
    assert total(m, "gpufleet_watcher_lines_unparsed_total") >= 2
    assert value(m, "gpufleet_watcher_lines_unparsed_total", reason="xid_line") >= 1
    assert value(m, "gpufleet_watcher_lines_unparsed_total", reason="overlong_line_cut") == 1


def test_a_flood_of_noise_does_not_delay_an_xid(watcher, kern):
    watcher.start()
    noise = "".join(syslog_line("igb 0000:c5:00.0 eno1: Reset adapter %d" % i) + "\n" for i in range(10000))
    append(kern, raw=noise.encode())
    append(kern, syslog_line(XID79.format(bus="c1")))
    m = watcher.wait_for(lambda m: xid_count(m) == 1, timeout=5, what="the XID within 5 s of the flood")
    assert value(m, "gpufleet_watcher_bytes_read_total") == kern.stat().st_size


def test_a_log_file_that_appears_later_is_followed(tmp_path):
    late = tmp_path / "late.log"
    w = WatcherProc(tmp_path / "w", source="file", log_file=str(late))
    try:
        w.start()
        w.wait_for_log("cannot open")
        append(late, syslog_line(XID79.format(bus="c1")))
        w.wait_for(lambda m: xid_count(m) == 1)
    finally:
        w.stop()


def test_bad_configuration_stops_with_a_clear_message(tmp_path):
    w = WatcherProc(tmp_path / "w", source="file")  # no log_file
    res = subprocess.run([sys.executable, str(WATCHER), "--config", str(w.config_path)], capture_output=True,
                         text=True, env=w.env)
    assert res.returncode == 2
    assert "source file needs log_file" in res.stderr
    assert read_metrics(w.prom) == {}
