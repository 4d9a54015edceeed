"""kentino.gpufleet.xid_facts run as Ansible runs it (a subprocess), with stand-in journalctl/dmesg on PATH."""

import gzip
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.module_runner import run_module

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_log"

JOURNALCTL = textwrap.dedent('''\
    #!{python}
    """Stand-in journalctl: serves the JSON lines of $XID_TEST_JOURNAL like `journalctl -o json` would."""
    import json, os, sys
    args = sys.argv[1:]
    with open(os.environ["XID_TEST_ARGV_LOG"], "a") as fh:
        fh.write(json.dumps(args) + "\\n")
    if os.environ.get("XID_TEST_JOURNAL_BROKEN"):
        sys.stderr.write("No journal files were found.\\n")
        sys.exit(1)
    lines = [l for l in open(os.environ["XID_TEST_JOURNAL"]).read().splitlines() if l.strip()]
    recs = [json.loads(l) for l in lines]
    keep = list(range(len(recs)))
    for arg in args:
        if arg.startswith("--after-cursor="):
            cursor = arg.split("=", 1)[1]
            idx = [i for i, r in enumerate(recs) if r["__CURSOR"] == cursor]
            if not idx:
                sys.stderr.write("Failed to seek to cursor: Invalid argument\\n")
                sys.exit(1)
            keep = [i for i in keep if i > idx[0]]
        elif arg.startswith("--since=@"):
            since_us = int(arg.split("@", 1)[1]) * 1000000
            keep = [i for i in keep if int(recs[i]["__REALTIME_TIMESTAMP"]) >= since_us]
        elif arg == "-k":
            boot = recs[-1]["_BOOT_ID"] if recs else None
            keep = [i for i in keep if recs[i]["_BOOT_ID"] == boot]
    for i in keep:
        print(lines[i])
''')

DMESG = textwrap.dedent('''\
    #!{python}
    """Stand-in dmesg: prints $XID_TEST_DMESG, or fails like a restricted ring buffer."""
    import os, sys
    if os.environ.get("XID_TEST_DMESG_DENY"):
        sys.stderr.write("dmesg: read kernel buffer failed: Operation not permitted\\n")
        sys.exit(1)
    sys.stdout.write(open(os.environ["XID_TEST_DMESG"]).read())
''')


@pytest.fixture()
def bin_dir(tmp_path):
    path = tmp_path / "bin"
    path.mkdir()
    for name, body in (("journalctl", JOURNALCTL), ("dmesg", DMESG)):
        script = path / name
        script.write_text(body.replace("{python}", sys.executable))
        script.chmod(0o755)
    return path


def _env(tmp_path, **extra):
    env = {"XID_TEST_ARGV_LOG": str(tmp_path / "argv.log"), "XID_TEST_JOURNAL": str(tmp_path / "journal.json"),
           "XID_TEST_DMESG": str(tmp_path / "dmesg.txt")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _facts(result):
    assert not result.get("failed"), result.get("msg")
    return result["ansible_facts"]["gpufleet_xid"]


def _keys(facts):
    return [(e["xid"], e["pci"], e["line"]) for e in facts["events"]]


def _journal_lines():
    return [line for line in (FIX / "journal_two_boots.json").read_text().splitlines() if line.strip()]


# ---- file source ---------------------------------------------------------------------------------------------------
def test_file_plain_and_gzip_give_the_same_events(tmp_path):
    plain = _facts(run_module("xid_facts", {"source": "file", "path": str(FIX / "mixed.syslog.log")}))
    gz = _facts(run_module("xid_facts", {"source": "file", "path": str(FIX / "mixed.syslog.log.gz")}))
    assert plain["source"] == gz["source"] == "file"
    assert [(e["xid"], e["pci"]) for e in plain["events"]] == [(79, "0000:86:00"), (13, "0000:3b:00"),
                                                               (79, "0000:b3:00"), (145, "0008:01:00")]
    assert _keys(plain) == _keys(gz)
    assert plain["lost_gpus"] == ["0000:86:00", "0000:b3:00"]
    assert plain["highest_severity"] == "critical"
    assert gz["position"]["gzip"] is True and plain["position"]["gzip"] is False


def test_gpu_that_did_not_initialise_is_in_the_facts(tmp_path):
    facts = _facts(run_module("xid_facts", {"source": "file", "path": str(FIX / "xid_119_other_gpu_init_failed.log")}))
    assert [(f["kind"], f["pci"], f["minor"], f["count"]) for f in facts["init_failures"]] == [
        ("init_failed", "0000:3b:00", 1, 2)]
    assert facts["summary"]["init_failures"] == 1
    assert [(e["xid"], e["pci"]) for e in facts["events"]] == [(119, "0000:5e:00")]


def test_file_incremental_no_miss_no_repeat_and_check_mode(tmp_path):
    log = tmp_path / "kern.log"
    state = tmp_path / "state" / "xid.json"
    lines = (FIX / "xid_pid_forms.log").read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:2]))
    args = {"source": "file", "path": str(log), "state_file": str(state)}
    # check mode reads but does not write the state
    checked = _facts(run_module("xid_facts", args, check_mode=True))
    assert [e["xid"] for e in checked["events"]] == [31, 64] and not state.exists()
    assert checked["position"]["saved"] is False
    first = _facts(run_module("xid_facts", args))
    assert [e["xid"] for e in first["events"]] == [31, 64] and first["position"]["saved"] is True
    assert json.loads(state.read_text())["file"]["offset"] == len("".join(lines[:2]).encode())
    with open(log, "a") as fh:
        fh.write("".join(lines[2:]))
    second = _facts(run_module("xid_facts", args))
    assert [e["xid"] for e in second["events"]] == [79, 48]
    third = _facts(run_module("xid_facts", args))
    assert third["events"] == [] and third["highest_severity"] == "none"


def test_file_half_written_last_line_is_read_once_complete(tmp_path):
    log = tmp_path / "kern.log"
    state = tmp_path / "xid.json"
    full = "[ 1.0] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, Ch 00000001\n"
    log.write_text(full + full.replace("31,", "43,")[:30])
    args = {"source": "file", "path": str(log), "state_file": str(state)}
    assert [e["xid"] for e in _facts(run_module("xid_facts", args))["events"]] == [31]
    log.write_text(full + full.replace("31,", "43,"))
    assert [e["xid"] for e in _facts(run_module("xid_facts", args))["events"]] == [43]


def test_file_rotation_reads_the_rest_of_the_old_file(tmp_path):
    log = tmp_path / "kern.log"
    state = tmp_path / "xid.json"
    lines = (FIX / "xid_pid_forms.log").read_text().splitlines(keepends=True)
    log.write_text(lines[0])
    args = {"source": "file", "path": str(log), "state_file": str(state)}
    assert [e["xid"] for e in _facts(run_module("xid_facts", args))["events"]] == [31]
    with open(log, "a") as fh:  # logged after the run, before the rotation
        fh.write(lines[1])
    os.rename(log, tmp_path / "kern.log.1")
    log.write_text("".join(lines[2:]))
    facts = _facts(run_module("xid_facts", args))
    assert [e["xid"] for e in facts["events"]] == [64, 79, 48]
    assert any("rotated" in n and "kern.log.1" in n for n in facts["position"]["notes"])


def test_file_rotation_with_the_old_file_gone_says_so(tmp_path):
    log = tmp_path / "kern.log"
    state = tmp_path / "xid.json"
    log.write_text((FIX / "xid_channel.log").read_text())
    args = {"source": "file", "path": str(log), "state_file": str(state)}
    _facts(run_module("xid_facts", args))
    os.unlink(log)
    # larger than the old file, so not a truncation; the filesystem may even hand out the same inode number again
    log.write_text((FIX / "xid_mig.log").read_text() + (FIX / "xid_pid_forms.log").read_text())
    facts = _facts(run_module("xid_facts", args))
    assert [e["xid"] for e in facts["events"]] == [31, 43, 31, 64, 79, 48]
    assert any("may be missed" in n for n in facts["position"]["notes"])


def test_file_truncation_reads_from_the_start(tmp_path):
    log = tmp_path / "kern.log"
    state = tmp_path / "xid.json"
    log.write_text((FIX / "xid_154.log").read_text())
    args = {"source": "file", "path": str(log), "state_file": str(state)}
    assert len(_facts(run_module("xid_facts", args))["events"]) == 8
    with open(log, "w") as fh:  # copytruncate: same inode, shorter
        fh.write((FIX / "fallen_off_single.log").read_text())
    facts = _facts(run_module("xid_facts", args))
    assert facts["lost_gpus"] == ["0000:29:00"] and len(facts["events"]) == 1
    assert any("truncated" in n for n in facts["position"]["notes"])


def test_file_missing_is_a_clear_error(tmp_path):
    res = run_module("xid_facts", {"source": "file", "path": str(tmp_path / "nope.log")})
    assert res["failed"] and "cannot read" in res["msg"] and "nope.log" in res["msg"]


def test_since_relative_and_iso(tmp_path):
    recent = _facts(run_module("xid_facts", {"source": "file", "path": str(FIX / "mixed.syslog_iso.log"),
                                             "since": "-2h"}))
    assert recent["events"] == [] and recent["summary"]["skipped_before_since"] > 0
    iso = _facts(run_module("xid_facts", {"source": "file", "path": str(FIX / "mixed.syslog_iso.log"),
                                          "since": "2024-08-09T13:33:00Z"}))
    assert [e["xid"] for e in iso["events"]] == [79, 145]
    bad = run_module("xid_facts", {"source": "file", "path": str(FIX / "mixed.syslog_iso.log"), "since": "yesterday"})
    assert bad["failed"] and "ISO 8601" in bad["msg"] and "-2h" in bad["msg"]


def test_severity_overrides(tmp_path):
    facts = _facts(run_module("xid_facts", {"source": "file", "path": str(FIX / "xid_pid_forms.log"),
                                            "severity_overrides": {"79": "warning", "64": "info", "48": "warning"}}))
    assert {e["xid"]: e["severity"] for e in facts["events"]}[79] == "warning"
    assert facts["highest_severity"] == "warning"
    bad = run_module("xid_facts", {"source": "file", "path": str(FIX / "xid_pid_forms.log"),
                                   "severity_overrides": {"79": "page-me"}})
    assert bad["failed"] and "page-me" in bad["msg"]


# ---- journal source ------------------------------------------------------------------------------------------------
def test_journal_current_boot_by_default(tmp_path, bin_dir):
    shutil.copy(FIX / "journal_two_boots.json", tmp_path / "journal.json")
    res = run_module("xid_facts", {"source": "journal"}, env=_env(tmp_path), path_prepend=[bin_dir])
    facts = _facts(res)
    assert facts["source"] == "journal"
    assert [e["xid"] for e in facts["events"]] == [48]  # -k: the current (second) boot only
    argv = json.loads((tmp_path / "argv.log").read_text().splitlines()[-1])
    assert "-k" in argv and "-o" in argv and "json" in argv and "--grep=NVRM" in argv
    assert res["tool"]["rc"] == 0


def test_journal_without_grep_support_retries_without_it(tmp_path, bin_dir):
    shutil.copy(FIX / "journal_two_boots.json", tmp_path / "journal.json")
    old = bin_dir / "journalctl"
    old.write_text(old.read_text().replace(
        'if os.environ.get("XID_TEST_JOURNAL_BROKEN"):',
        "if any(a.startswith('--grep') for a in args):\n"
        "    sys.stderr.write('Compiled without pattern matching support\\n'); sys.exit(1)\n"
        'if os.environ.get("XID_TEST_JOURNAL_BROKEN"):'))
    facts = _facts(run_module("xid_facts", {"source": "journal"}, env=_env(tmp_path), path_prepend=[bin_dir]))
    assert [e["xid"] for e in facts["events"]] == [48]
    calls = [json.loads(x) for x in (tmp_path / "argv.log").read_text().splitlines()]
    assert "--grep=NVRM" in calls[0] and "--grep=NVRM" not in calls[-1]


def test_journal_incremental_across_a_reboot_no_miss_no_repeat(tmp_path, bin_dir):
    lines = _journal_lines()
    journal = tmp_path / "journal.json"
    state = tmp_path / "xid.state"
    journal.write_text("\n".join(lines[:5]) + "\n")  # boot A, up to the first Xid 13 line
    args = {"source": "journal", "state_file": str(state)}
    first = _facts(run_module("xid_facts", args, env=_env(tmp_path), path_prepend=[bin_dir]))
    journal.write_text("\n".join(lines) + "\n")  # the rest of boot A, then the reboot into boot B
    second = _facts(run_module("xid_facts", args, env=_env(tmp_path), path_prepend=[bin_dir]))
    third = _facts(run_module("xid_facts", args, env=_env(tmp_path), path_prepend=[bin_dir]))
    argv = json.loads((tmp_path / "argv.log").read_text().splitlines()[1])
    assert any(a.startswith("--after-cursor=") for a in argv) and "-k" not in argv  # all boots after the cursor
    seen = [(e["xid"], e["pci"], e["time"]) for e in first["events"] + second["events"]]
    assert len(seen) == len(set(seen))
    everything = _facts(run_module("xid_facts", {"source": "file", "path": str(FIX / "journal_two_boots.json")}))
    assert len(everything["events"]) == 7  # a saved journalctl -o json file reads the same as the tool's output
    assert sorted(seen) == sorted((e["xid"], e["pci"], e["time"]) for e in everything["events"])
    assert [e["xid"] for e in first["events"]] == [79, 13]
    assert {e["boot_id"] for e in second["events"]} == {"a1b2c3d4e5f60718293a4b5c6d7e8f90",
                                                          "0f9e8d7c6b5a49382716f5e4d3c2b1a0"}
    assert third["events"] == []
    assert any("rebooted" in n for n in second["position"]["notes"])
    assert not any("rebooted" in n for n in third["position"]["notes"])
    saved = json.loads(state.read_text())
    assert saved["source"] == "journal" and saved["journal"]["boot_id"] == "0f9e8d7c6b5a49382716f5e4d3c2b1a0"


def test_journal_cursor_gone_falls_back_to_saved_time(tmp_path, bin_dir):
    lines = _journal_lines()
    journal = tmp_path / "journal.json"
    state = tmp_path / "xid.state"
    journal.write_text("\n".join(lines[:9]) + "\n")  # boot A up to the NVLink 145
    args = {"source": "journal", "state_file": str(state)}
    first = _facts(run_module("xid_facts", args, env=_env(tmp_path), path_prepend=[bin_dir]))
    assert [e["xid"] for e in first["events"]] == [79, 13, 79, 145]
    # journal vacuumed: the entries up to and including the saved cursor are gone
    journal.write_text("\n".join(lines[9:]) + "\n")
    second = _facts(run_module("xid_facts", args, env=_env(tmp_path), path_prepend=[bin_dir]))
    assert [e["xid"] for e in second["events"]] == [31, 94, 48]
    assert any("cursor" in n and "gone" in n for n in second["position"]["notes"])
    argv = json.loads((tmp_path / "argv.log").read_text().splitlines()[-1])
    assert any(a.startswith("--since=@") for a in argv)


def test_journal_cursor_gone_does_not_repeat_entries_still_there(tmp_path, bin_dir):
    lines = _journal_lines()
    journal = tmp_path / "journal.json"
    state = tmp_path / "xid.state"
    journal.write_text("\n".join(lines[:9]) + "\n")
    args = {"source": "journal", "state_file": str(state)}
    _facts(run_module("xid_facts", args, env=_env(tmp_path), path_prepend=[bin_dir]))
    saved = json.loads(state.read_text())
    saved["journal"]["cursor"] = "s=deadbeef;i=ffff"  # a cursor journalctl no longer knows
    state.write_text(json.dumps(saved))
    journal.write_text("\n".join(lines) + "\n")
    second = _facts(run_module("xid_facts", args, env=_env(tmp_path), path_prepend=[bin_dir]))
    assert [e["xid"] for e in second["events"]] == [31, 94, 48]  # nothing at or before the saved time again


def test_journal_missing_is_a_clear_error(tmp_path):
    res = run_module("xid_facts", {"source": "journal", "journalctl_executable": str(tmp_path / "journalctl")})
    assert res["failed"] and "journalctl not found" in res["msg"] and "source=dmesg" in res["msg"]


def test_auto_falls_back_to_dmesg_when_the_journal_does_not_work(tmp_path, bin_dir):
    (tmp_path / "dmesg.txt").write_text((FIX / "mixed.dmesg.log").read_text())
    res = run_module("xid_facts", {}, env=_env(tmp_path, XID_TEST_JOURNAL_BROKEN=1), path_prepend=[bin_dir])
    facts = _facts(res)
    assert facts["source"] == "dmesg"
    assert any("journal not usable" in n and "no journal files" in n for n in facts["notes"])
    assert [e["xid"] for e in facts["events"]] == [79, 13, 79, 145]


def test_auto_prefers_the_journal(tmp_path, bin_dir):
    shutil.copy(FIX / "journal_two_boots.json", tmp_path / "journal.json")
    facts = _facts(run_module("xid_facts", {}, env=_env(tmp_path), path_prepend=[bin_dir]))
    assert facts["source"] == "journal"


# ---- dmesg source --------------------------------------------------------------------------------------------------
def test_dmesg_events_are_dated_from_the_boot_time(tmp_path, bin_dir):
    (tmp_path / "dmesg.txt").write_text((FIX / "mixed.dmesg.log").read_text())
    facts = _facts(run_module("xid_facts", {"source": "dmesg"}, env=_env(tmp_path), path_prepend=[bin_dir]))
    assert facts["source"] == "dmesg"
    first = facts["events"][0]
    assert first["uptime_s"] == pytest.approx(1843.308145)
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")  # journald's spelling
    assert first["time"] is not None and first["boot_id"] == boot_id
    assert facts["lost_gpus"] == ["0000:86:00", "0000:b3:00"]


def test_dmesg_incremental_and_same_timestamp_lines(tmp_path, bin_dir):
    dmesg = tmp_path / "dmesg.txt"
    state = tmp_path / "xid.state"
    lines = (FIX / "xid_13_burst.log").read_text().splitlines(keepends=True)
    dup = "[ 5405.162005] NVRM: Xid (PCI:0000:5e:00): 31, pid=1, name=a, Ch 00000001\n"  # same stamp as the last line
    dmesg.write_text("".join(lines[:6]))
    args = {"source": "dmesg", "state_file": str(state)}
    first = _facts(run_module("xid_facts", args, env=_env(tmp_path), path_prepend=[bin_dir]))
    assert [(e["xid"], e["line_count"]) for e in first["events"]] == [(13, 6)]
    dmesg.write_text("".join(lines[:6]) + dup + "".join(lines[6:]))
    second = _facts(run_module("xid_facts", args, env=_env(tmp_path), path_prepend=[bin_dir]))
    assert [(e["xid"], e["pid"]) for e in second["events"]] == [(31, 1), (13, 29001)]
    third = _facts(run_module("xid_facts", args, env=_env(tmp_path), path_prepend=[bin_dir]))
    assert third["events"] == []


def test_dmesg_reboot_reads_the_new_boot_and_says_what_is_lost(tmp_path, bin_dir):
    dmesg = tmp_path / "dmesg.txt"
    state = tmp_path / "xid.state"
    dmesg.write_text((FIX / "xid_154.log").read_text())
    # the previous run happened in another boot, later in its uptime than anything in this buffer
    state.write_text(json.dumps({"version": 1, "source": "dmesg",
                                 "dmesg": {"boot_id": "00000000-previous-boot", "uptime_s": 99999.0,
                                           "same_stamp_lines": 1}}))
    facts = _facts(run_module("xid_facts", {"source": "dmesg", "state_file": str(state)}, env=_env(tmp_path),
                              path_prepend=[bin_dir]))
    assert len(facts["events"]) == 8
    assert any("rebooted" in n and "source=journal" in n for n in facts["position"]["notes"])


def test_dmesg_restricted_is_a_clear_error(tmp_path, bin_dir):
    res = run_module("xid_facts", {"source": "dmesg"}, env=_env(tmp_path, XID_TEST_DMESG_DENY=1),
                     path_prepend=[bin_dir])
    assert res["failed"]
    assert "dmesg_restrict" in res["msg"] and "become: true" in res["msg"]
    assert res["tool"]["rc"] == 1


def test_state_of_another_source_is_ignored_and_said(tmp_path, bin_dir):
    state = tmp_path / "xid.state"
    state.write_text(json.dumps({"version": 1, "source": "journal", "journal": {"cursor": "s=1"}}))
    facts = _facts(run_module("xid_facts", {"source": "file", "path": str(FIX / "xid_mig.log"),
                                            "state_file": str(state)}))
    assert len(facts["events"]) == 2
    assert any("written for source journal" in n for n in facts["notes"])


def test_gzip_file_incremental(tmp_path):
    log = tmp_path / "kern.log.gz"
    state = tmp_path / "xid.state"
    log.write_bytes(gzip.compress((FIX / "xid_channel.log").read_bytes()))
    args = {"source": "file", "path": str(log), "state_file": str(state)}
    assert len(_facts(run_module("xid_facts", args))["events"]) == 2
    assert _facts(run_module("xid_facts", args))["events"] == []
