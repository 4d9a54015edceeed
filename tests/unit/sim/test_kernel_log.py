"""journalctl and dmesg stand-ins: one simulated kernel log in every docs/signals.md section 1 shape."""

import json
import re
import time

XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})\): (\d+), (?:pid=([^,]+), name=([^,]+), )?(.*)")


def journal(sim, scenario, *args):
    res = sim.run(scenario, "journalctl", *args)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def test_journal_json_records_have_journald_types(sim):
    recs = journal(sim, "healthy_h100", "-k", "-o", "json", "--no-pager")
    assert len(recs) > 20
    boot_ids = {r["_BOOT_ID"] for r in recs}
    assert len(boot_ids) == 1  # -k is the current boot only
    binary = [r for r in recs if isinstance(r["MESSAGE"], list)]
    assert len(binary) == 1 and all(isinstance(b, int) for b in binary[0]["MESSAGE"])  # non-UTF-8 -> byte array
    for r in recs:
        for key in ("__CURSOR", "__REALTIME_TIMESTAMP", "__MONOTONIC_TIMESTAMP", "_BOOT_ID", "PRIORITY", "_TRANSPORT"):
            assert isinstance(r[key], str), key  # every journald value is a string
        assert re.fullmatch(r"s=[0-9a-f]{32};i=[0-9a-f]+;b=[0-9a-f]{32};m=[0-9a-f]+;t=[0-9a-f]+;x=[0-9a-f]{16}",
                            r["__CURSOR"])
    stamps = [int(r["__REALTIME_TIMESTAMP"]) for r in recs]
    assert stamps == sorted(stamps) and stamps[-1] <= time.time() * 1e6


def test_previous_boot_holds_the_xid_119_trap(sim):
    current = journal(sim, "healthy_h100", "-k", "-o", "json")
    everything = journal(sim, "healthy_h100", "--boot=all", "-o", "json", "_TRANSPORT=kernel")
    assert not any(": 119, " in str(r["MESSAGE"]) for r in current)
    events = [XID.search(r["MESSAGE"]) for r in everything if isinstance(r["MESSAGE"], str)]
    xid119 = [m for m in events if m and m.group(2) == "119"]
    assert len(xid119) == 2 and xid119[0].group(3) == "3081" and xid119[0].group(4) == "nvidia-smi"
    follow_on = [r for r in everything if str(r["MESSAGE"]).startswith("NVRM:     ")]
    assert len(follow_on) >= 5  # RPC history table lines: not events
    assert len({r["_BOOT_ID"] for r in everything}) == 2
    assert len(journal(sim, "healthy_h100", "-b", "-1", "-o", "json")) == len(everything) - len(current)


def test_cursor_reads_neither_miss_nor_repeat(sim):
    before = journal(sim, "riser_xid79", "-k", "-o", "json")
    cursor = before[-1]["__CURSOR"]
    assert journal(sim, "riser_xid79", "-o", "json", "--after-cursor=" + cursor, "_TRANSPORT=kernel") == []
    sim.run("riser_xid79", "gpu_burn", "600")
    new = journal(sim, "riser_xid79", "-o", "json", "--after-cursor=" + cursor, "_TRANSPORT=kernel")
    messages = [r["MESSAGE"] for r in new]
    assert any(": 79, " in m for m in messages) and len(messages) == len(set(r["__CURSOR"] for r in new))
    again = journal(sim, "riser_xid79", "-o", "json", "--after-cursor", new[-1]["__CURSOR"], "_TRANSPORT=kernel")
    assert again == []
    fields = journal(sim, "riser_xid79", "-k", "-o", "json", "--output-fields=MESSAGE", "-n", "1")
    assert set(fields[0]) >= {"MESSAGE", "__CURSOR", "_BOOT_ID"} and "PRIORITY" not in fields[0]


def test_since_and_show_cursor(sim):
    sim.run("riser_xid79", "gpu_burn", "600")
    recent = journal(sim, "riser_xid79", "-k", "-o", "json", "--since=@%d" % (int(time.time()) - 30))
    assert recent and all(int(r["__REALTIME_TIMESTAMP"]) >= (time.time() - 40) * 1e6 for r in recent)
    short = sim.run("riser_xid79", "journalctl", "-k", "--since", "10 min ago", "--show-cursor").stdout
    assert re.search(r"^\w{3} [ \d]\d \d\d:\d\d:\d\d node kernel: NVRM: Xid ", short, re.M)
    assert short.splitlines()[-1].startswith("-- cursor: s=")
    bad = sim.run("riser_xid79", "journalctl", "--since", "not a time")
    assert bad.returncode == 1 and "Failed to parse timestamp" in bad.stderr
    empty = sim.run("healthy_h100", "journalctl", "-k", "--since", "@%d" % (int(time.time()) + 3600))
    assert empty.stdout == "-- No entries --\n"


def test_dmesg_prefixes(sim):
    sim.run("riser_xid79", "gpu_burn", "600")
    plain = sim.run("riser_xid79", "dmesg").stdout.splitlines()
    assert all(re.match(r"^\[ *\d+\.\d{6}\] ", line) for line in plain)
    assert any(XID.search(line) for line in plain)
    ctime = sim.run("riser_xid79", "dmesg", "-T").stdout.splitlines()
    assert all(re.match(r"^\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\] ", line) for line in ctime)
    iso = sim.run("riser_xid79", "dmesg", "--time-format", "iso").stdout.splitlines()
    assert all(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:\d\d ", line) for line in iso)
    decoded = sim.run("riser_xid79", "dmesg", "-x").stdout.splitlines()
    assert all(re.match(r"^kern  :(emerg |alert |crit  |err   |warn  |notice|info  |debug ): \[ *\d+\.\d{6}\] ", line)
               for line in decoded)
    assert any(line.startswith("kern  :warn  : [") and "Xid" in line for line in decoded)
    assert any("\\xe9" in line for line in plain)  # the non-UTF-8 byte, escaped
    assert len(plain) == len(journal(sim, "riser_xid79", "-k", "-o", "json"))  # same log, current boot


def test_kernel_traps_per_scenario(sim):
    msgs = [r["MESSAGE"] for r in journal(sim, "neighbour_process", "-k", "-o", "json")]
    xid13 = [m for m in msgs if isinstance(m, str) and ": 13, pid=48213, name=python3.11, " in m]
    assert len(xid13) == 5  # one burst, several related lines
    assert any(m.endswith(": 43, pid=48213, name=python3.11, Ch 00000008") for m in msgs if isinstance(m, str))
    leak = [r["MESSAGE"] for r in journal(sim, "ecc_leak", "-k", "-o", "json")]
    assert sum(": 92, " in str(m) for m in leak) == 11 and sum(": 63, " in str(m) for m in leak) == 2
    ro = [r["MESSAGE"] for r in journal(sim, "checkpoint_readonly", "-k", "-o", "json")]
    assert "EXT4-fs (nvme1n1p1): Remounting filesystem read-only" in ro


def test_cursor_file_resumes_where_the_last_read_stopped(sim, tmp_path):
    cur = tmp_path / "cursor"
    first = journal(sim, "psu_rail_b", "-k", "-o", "json", "--cursor-file", str(cur))
    assert first and cur.read_text() == first[-1]["__CURSOR"]
    assert journal(sim, "psu_rail_b", "-k", "-o", "json", "--cursor-file", str(cur)) == []
    sim.run("psu_rail_b", "gpu_burn", "300")
    new = journal(sim, "psu_rail_b", "-k", "-o", "json", "--cursor-file", str(cur))
    assert sum(": 79, " in r["MESSAGE"] for r in new) == 4
    boots = sim.run("psu_rail_b", "journalctl", "--list-boots").stdout.splitlines()
    assert boots[0].startswith("IDX BOOT ID") and boots[1].lstrip().startswith("-1 ") and boots[2].lstrip().startswith("0 ")
