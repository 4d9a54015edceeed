"""kernel_log_reader: the positions that let a read go on without missing or repeating a line (dmesg stamps, file
identity across rotation), and read_kernel_log's contract for its callers (xid_facts, job_evidence, health code)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_reader import (
    DmesgCursor,
    ReadError,
    load_state,
    read_kernel_log,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import file_position, resume
from helpers.probes import PEAK_MB

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_log"


def _dmesg(*stamps):
    return ["[%12.6f] line %d" % (stamp, n) for n, stamp in enumerate(stamps)]


def test_dmesg_cursor_skips_what_was_read_including_lines_that_share_a_stamp():
    first = DmesgCursor(None, "boot-a")
    assert first.fresh(_dmesg(1.0, 2.0, 2.0)) == _dmesg(1.0, 2.0, 2.0)
    position = first.position()
    assert position == {"boot_id": "boot-a", "uptime_s": 2.0, "same_stamp_lines": 2}
    # the ring buffer printed again, grown by a third line with the same stamp and a later one
    again = DmesgCursor(json.loads(json.dumps(position)), "boot-a")
    lines = _dmesg(1.0, 2.0, 2.0, 2.0, 3.0)
    assert again.fresh(lines) == lines[3:]
    assert again.position() == {"boot_id": "boot-a", "uptime_s": 3.0, "same_stamp_lines": 1}
    # a restarted `dmesg --follow` prints the buffer once more: nothing is handed out twice
    again.restart()
    assert again.fresh([line.encode() for line in lines]) == []


def test_dmesg_cursor_after_a_reboot_reads_the_new_boot_whole():
    cursor = DmesgCursor({"boot_id": "boot-a", "uptime_s": 500.0, "same_stamp_lines": 1}, "boot-b")
    assert cursor.fresh(_dmesg(1.0, 2.0)) == _dmesg(1.0, 2.0)


def test_dmesg_x_prefix_and_unstamped_lines():
    cursor = DmesgCursor({"boot_id": "b", "uptime_s": 2.0, "same_stamp_lines": 1}, "b")
    lines = ["kern  :warn  : [    1.000000] old", "no stamp", "kern  :warn  : [    2.500000] new", "no stamp after"]
    assert cursor.fresh(lines) == lines[2:]


def _position(path, offset, **extra):
    return json.loads(json.dumps(file_position(str(path), os.stat(path), offset, **extra)))


def test_resume_tells_grown_truncated_replaced_and_rotated_files_apart(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("one\ntwo\n")
    saved = _position(log, 8, size=8)
    with open(log, "a") as fh:
        fh.write("three\n")
    assert resume(str(log), os.stat(log), saved) == (8, None, None)
    log.write_text("x\n")  # copytruncate: same inode, shorter
    offset, old, note = resume(str(log), os.stat(log), saved)
    assert (offset, old) == (0, None) and "truncated" in note
    log.write_text("another file, longer than the first one\n")  # same inode, other first bytes
    offset, old, note = resume(str(log), os.stat(log), saved)
    assert (offset, old) == (0, None) and "new file with the inode number" in note
    log.write_text("one\ntwo\nthree\n")
    saved = _position(log, 8)
    os.rename(log, tmp_path / "kern.log.1")
    log.write_text("four\n")
    offset, old, note = resume(str(log), os.stat(log), saved)
    assert (offset, old) == (0, str(tmp_path / "kern.log.1")) and "rotated to" in note
    os.unlink(tmp_path / "kern.log.1")
    offset, old, note = resume(str(log), os.stat(log), saved)
    assert (offset, old) == (0, None) and "may be missed" in note


def test_file_read_leaves_a_half_written_line_for_the_next_read(tmp_path):
    log = tmp_path / "kern.log"
    state = tmp_path / "state" / "xid.json"
    lines = (FIX / "xid_pid_forms.log").read_text().splitlines(keepends=True)
    log.write_text(lines[0] + lines[1][:20])
    first = read_kernel_log("file", path=str(log), state_file=str(state))
    assert [e["xid"] for e in first.facts()["events"]] == [31]
    first.save()
    assert oct(os.stat(state).st_mode & 0o777) == "0o600" and oct(os.stat(state.parent).st_mode & 0o777) == "0o700"
    saved, note = load_state(str(state))
    assert note is None and saved["source"] == "file" and saved["file"]["offset"] == len(lines[0])
    log.write_text("".join(lines))
    second = read_kernel_log("file", path=str(log), state_file=str(state))
    facts = second.facts()
    assert [e["xid"] for e in facts["events"]] == [64, 79, 48]
    assert facts["position"]["kind"] == "file" and facts["position"]["saved"] is False
    # without a state file nothing is left for later: the unterminated line is read too
    log.write_text(lines[0] + lines[1].rstrip("\n"))
    assert [e["xid"] for e in read_kernel_log("file", path=str(log)).facts()["events"]] == [31, 64]


def test_no_tool_at_all_is_a_read_error_that_keeps_what_was_tried():
    with pytest.raises(ReadError) as caught:
        read_kernel_log("auto", journalctl=None, dmesg=None)
    assert "dmesg not found" in str(caught.value) and "source=journal" in str(caught.value)
    assert caught.value.notes == ["journalctl not found: read dmesg"]


def test_a_state_of_another_source_reads_as_a_first_run(tmp_path):
    state = tmp_path / "xid.json"
    state.write_text(json.dumps({"version": 1, "source": "journal", "journal": {"cursor": "s=1"}}))
    read = read_kernel_log("file", path=str(FIX / "xid_channel.log"), state_file=str(state))
    assert len(read.facts()["events"]) == 2
    assert any("written for source journal, not file" in n for n in read.facts()["notes"])
    state.write_text("{not json")
    read = read_kernel_log("file", path=str(FIX / "xid_channel.log"), state_file=str(state))
    assert any("unreadable" in n for n in read.facts()["notes"])


def test_an_overlong_journal_record_is_skipped_with_a_note_and_the_rest_is_read(tmp_path):
    records = (FIX / "journal_two_boots.json").read_text().splitlines(keepends=True)
    log = tmp_path / "saved.json"
    log.write_text("{" + "x" * (3 * 1024 * 1024) + "\n" + "".join(records))
    facts = read_kernel_log("file", path=str(log)).facts()
    whole = read_kernel_log("file", path=str(FIX / "journal_two_boots.json")).facts()
    assert [e["xid"] for e in facts["events"]] == [e["xid"] for e in whole["events"]] != []
    assert facts["unparsed"]["by_reason"] == dict(whole["unparsed"]["by_reason"], overlong_line=1)
    assert any("1 record(s) longer than" in n and "skipped" in n for n in facts["notes"]), facts["notes"]


def test_a_huge_file_without_a_newline_costs_bounded_memory(tmp_path):
    # 256 MiB that start with "{" and never end a line: the reader keeps at most one record's limit of it (before:
    # the whole "line", then its decoded copy; a 2 GB file took 4.1 GB and the module died with "Module failed.").
    log = tmp_path / "kern.json"
    with open(log, "wb") as fh:
        fh.write(b"{")
        fh.truncate(256 * 1024 * 1024)  # sparse: the file reads as NUL bytes, no disk used
    probe = PEAK_MB + ("import sys\n"
             "from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_reader import read_kernel_log\n"
             "facts = read_kernel_log('file', path=%r).facts()\n"
             "print(peak_mb(), facts['unparsed']['by_reason'],"
             " facts['notes'])" % str(log))
    env = dict(os.environ, PYTHONPATH=str(FIX.parents[2] / "collections"))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    peak_mb, rest = out.stdout.split(" ", 1)
    assert int(peak_mb) < 100, "peak RSS %s MB reading a 256 MiB line" % peak_mb
    assert "'overlong_line': 1" in rest and "record(s) longer than" in rest
