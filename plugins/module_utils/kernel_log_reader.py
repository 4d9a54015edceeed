# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Read the kernel log for the XID parser, once or following it (stdlib only: runs on the node).

One read (xid_facts, job_evidence, the audit's health snapshot): read_kernel_log() -> KernelLogRead. Following (the
XID watcher): JournalSource, DmesgSource, FileSource. Parsing is kernel_log.XidScanner's; this module decides what
to feed it, so that a read neither misses nor repeats a line when it goes on from a saved position:

  journal  journalctl -o json, NVRM entries only (--grep) and only the fields read (--output-fields) where journalctl
           knows them. Position {cursor, realtime_us, boot_id, uptime_s}: the next read asks --after-cursor, which
           spans boots (the rest of the previous boot is read too); a cursor that is gone (journal vacuumed) falls
           back to its time, and the entries at or before it are skipped.
  dmesg    the ring buffer of this boot. Position {boot_id, uptime_s, same_stamp_lines}: lines of the same boot at or
           before the saved stamp were read before. dmesg cannot show the rest of a previous boot: said in a note.
  file     a saved or rotating log, plain or gzip (by its magic bytes). Position {path, inode, dev, gzip, offset,
           size, head_bytes, head_sha256}: rotation (the old file is found by its inode and read to its end first),
           truncation, and a new file with a reused inode number (its first bytes differ) are told apart.

A position is saved per source (save_state: atomic); a state file of another source or format reads as a first run,
said in a note. Errors that stop a read raise ReadError, whose message names the tool or file, what failed and the fix.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import json
import os
import shutil
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import MAX_RECORD_BYTES, XidScanner
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import (
    boot_datetime,
    file_position,
    is_gzip,
    journal_record,
    open_log,
    read_boot_id,
    resume,
    uptime_stamp,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.log_follow import (
    FileChanges,
    FileFollower,
    ProcessLines,
    bounded_lines,
    wait_readable,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.prom_textfile import atomic_write
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool

STATE_VERSION = 1
SOURCES = ("auto", "journal", "dmesg", "file")

# journalctl filters in C: only NVRM entries (--grep, systemd >= 237 with PCRE2) and only the fields read
# (--output-fields, systemd >= 236; the cursor, times and _BOOT_ID always come). That keeps a busy boot's kernel log
# far below the output run_tool keeps, and a flood of other kernel lines costs the watcher nothing. An older journalctl
# rejects them, naming them in its complaint: ask again without.
JOURNAL_GREP = "--grep=NVRM"
JOURNAL_FIELDS = "--output-fields=MESSAGE,_SOURCE_MONOTONIC_TIMESTAMP"
JOURNAL_OPTIONAL = ((JOURNAL_GREP, ("grep", "pattern", "pcre")), (JOURNAL_FIELDS, ("output-fields",)))


class ReadError(Exception):
    """A source could not be read: the message names the tool/file, what failed and the fix; tool is the run's
    ToolResult.as_dict() (None for a file)."""

    def __init__(self, msg, tool=None):
        super(ReadError, self).__init__(msg)
        self.tool = tool
        self.notes = []  # what the read had noted before it failed (a source given up for another)


def _utcnow():
    return datetime.datetime.now(datetime.timezone.utc)


def iso_us(realtime_us, default=None):
    """journald's microseconds since the epoch as ISO 8601 (UTC), or default."""
    try:
        return datetime.datetime.fromtimestamp(int(realtime_us) / 1e6, datetime.timezone.utc).isoformat()
    except (TypeError, ValueError, OverflowError, OSError):
        return default


# ---- the saved position --------------------------------------------------------------------------------------------
def load_state(path):
    """(state dict or None, note or None). A missing file is a first read; a corrupt one is ignored, said so."""
    if not path or not os.path.exists(path):
        return None, None
    try:
        with open(path) as fh:
            state = json.load(fh)
    except (IOError, OSError, ValueError) as exc:
        return None, "state file %s unreadable (%s): read as a first run" % (path, exc)
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        return None, "state file %s has an unknown format: read as a first run" % path
    return state, None


def save_state(path, source, position):
    """Write the position of a read atomically (temp file in the same directory, fsync, rename; mode 0600, the
    directory created 0700). Raises OSError."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o700)
    state = {"version": STATE_VERSION, "source": source, source: position, "saved_at": _utcnow().isoformat()}
    atomic_write(path, json.dumps(state, sort_keys=True), mode=0o600)


def _saved_position(state, source, notes):
    """The saved position of this source; a state of another source is ignored, said so."""
    if state is None:
        return {}
    if state.get("source") != source:
        notes.append("state file was written for source %s, not %s: read as a first run" % (state.get("source"), source))
        return {}
    return state.get(source) or {}


# ---- journal -------------------------------------------------------------------------------------------------------
def journal_rejected(option, stderr):
    """Whether journalctl's complaint (stderr) is about this optional option: an older journalctl."""
    low = (stderr or "").lower()
    return any(word in low for word in dict(JOURNAL_OPTIONAL)[option])


def _journal_failed(res):
    """Why a journalctl run is unusable, or None. 'No entries' with rc 1 (newer systemd) is not a failure."""
    if res.error:
        return res.error
    if res.timed_out:
        return "journalctl timed out after %.0f s" % res.duration_s
    err = (res.stderr or "").strip()
    if "No journal files were found" in err:
        return "journalctl found no journal files (journald not running or not persistent here)"
    if res.rc != 0 and not (res.rc == 1 and not res.stdout.strip() and ("No entries" in err or not err)):
        return "journalctl exited %s: %s" % (res.rc, err[-300:] or "no message")
    return None


def _run_journalctl(base, window, timeout_s):
    extras = [opt for opt, _words in JOURNAL_OPTIONAL]
    res = run_tool(base + extras + window, timeout_s)
    for opt, _words in JOURNAL_OPTIONAL:
        if res.rc not in (0, None) and not res.timed_out and journal_rejected(opt, res.stderr):
            extras.remove(opt)
            res = run_tool(base + extras + window, timeout_s)
    return res


def read_journal(exe, prev, since, until, timeout_s, scanner_opts, notes):
    """(scanner, position, position notes, ToolResult) of one journalctl read after prev (or since, or this boot)."""
    base = [exe, "-o", "json", "--no-pager", "--all"]
    tail = ["--until=@%d" % (int(until) + 1)] if until is not None else []
    position_notes = []
    after_us = None
    after_cursor = None
    if prev.get("cursor"):
        window = ["--after-cursor=" + prev["cursor"], "_TRANSPORT=kernel"]  # all boots after the cursor
        after_cursor = prev["cursor"]
    elif since is not None:
        window = ["--since=@%d" % int(since.timestamp()), "_TRANSPORT=kernel"]
    else:
        window = ["-k"]  # current boot, kernel transport
    res = _run_journalctl(base, window + tail, timeout_s)
    failure = _journal_failed(res)
    if failure and prev.get("cursor") and not res.timed_out and not res.error:
        # The cursor points into a rotated/vacuumed journal file: resume from the saved time instead.
        saved_us = prev.get("realtime_us")
        if saved_us:
            after_us = int(saved_us)
            window = ["--since=@%d" % (after_us // 1000000), "_TRANSPORT=kernel"]
        else:
            window = ["-k"]
        position_notes.append("the journal cursor of the last run is gone (%s): read from the saved time %s instead"
                              % (failure, iso_us(saved_us) if saved_us else "(none saved: current boot)"))
        res = _run_journalctl(base, window + tail, timeout_s)
        failure = _journal_failed(res)
    if failure:
        raise ReadError(failure + ". Fix: run with become: true (the system journal needs root or the "
                        "systemd-journal group), or use source=dmesg", res.as_dict())
    if "not seeing messages from other users" in (res.stderr or ""):
        notes.append("journalctl hides system messages from this user: run with become: true")
    scanner = XidScanner(after_realtime_us=after_us, after_cursor=after_cursor, **scanner_opts)
    for line in res.stdout.splitlines():
        scanner.feed_journal_line(line)
    later_boots = [b for b in scanner.journal_boot_ids if prev.get("boot_id") and b != prev["boot_id"]]
    if later_boots and after_cursor:
        position_notes.append("rebooted since the last run (boot %s -> %s): read the rest of the previous boot from "
                              "the journal too" % (prev["boot_id"], ", ".join(later_boots)))
    last = scanner.last_journal
    if last is not None:
        position = {"cursor": last.cursor, "realtime_us": last.realtime_us, "boot_id": last.boot_id,
                    "uptime_s": last.uptime_s}
    else:
        position = {k: prev.get(k) for k in ("cursor", "realtime_us", "boot_id", "uptime_s")}
    if scanner.unparsed_reasons.get("output_cut"):
        notes.append("journalctl printed more than the module keeps (4 MiB): the middle of the log was not read; "
                     "use state_file or since to read smaller windows")
    return scanner, position, position_notes, res


# ---- dmesg ---------------------------------------------------------------------------------------------------------
class DmesgCursor:
    """Where a dmesg read stopped: the boot, the last uptime stamp, and how many lines carried that stamp (several
    lines can share one). dmesg prints the whole ring buffer each time: fresh() drops what was handed out before."""

    def __init__(self, position=None, boot_id=None, same_boot=None):
        prev = position or {}
        if same_boot is None:
            same_boot = prev.get("uptime_s") is not None and prev.get("boot_id") == boot_id
        self.boot_id = boot_id
        self.uptime_s = float(prev["uptime_s"]) if same_boot and prev.get("uptime_s") is not None else None
        self.same = int(prev.get("same_stamp_lines") or 0) if same_boot else 0
        self.restart()

    def restart(self):
        """The ring buffer is printed again (a new read, a restarted dmesg --follow): skip up to the position."""
        self._skipping = self.uptime_s is not None
        self._skip_same = self.same

    def fresh(self, lines):
        """The lines (str or bytes) not handed out before; the position moves past them."""
        out = []
        for line in lines:
            stamp = uptime_stamp(line)
            if self._skipping:
                if stamp is None or stamp < self.uptime_s:
                    continue
                if stamp == self.uptime_s and self._skip_same > 0:
                    self._skip_same -= 1
                    continue
                self._skipping = False
            if stamp is not None:
                if stamp == self.uptime_s:
                    self.same += 1
                else:
                    self.uptime_s, self.same = stamp, 1
            out.append(line)
        return out

    def position(self):
        return {"boot_id": self.boot_id, "uptime_s": self.uptime_s, "same_stamp_lines": self.same}


def dmesg_failure(res):
    """Why a dmesg run is unusable, with the fix, or None."""
    err = (res.stderr or "").strip()
    if res.error:
        why = res.error
    elif res.timed_out:
        why = "dmesg timed out after %.0f s" % res.duration_s
    elif res.rc != 0:
        why = "dmesg exited %s: %s" % (res.rc, err[-300:] or "no message")
    else:
        return None
    if "not permitted" in err or "denied" in err.lower():
        why += (". The kernel restricts the ring buffer to root (kernel.dmesg_restrict=1): run this task with "
                "become: true, or set sysctl kernel.dmesg_restrict=0, or use source=journal")
    return why


def read_dmesg(exe, prev, timeout_s, scanner_opts, notes):
    """(scanner, position, position notes, ToolResult) of one dmesg read after prev."""
    res = run_tool([exe], timeout_s)
    failure = dmesg_failure(res)
    if failure:
        raise ReadError(failure, res.as_dict())
    boot_id = read_boot_id()
    lines = res.stdout.splitlines()
    position_notes = []
    same_boot = False
    if prev.get("uptime_s") is not None:
        saved_up = float(prev["uptime_s"])
        known = [s for s in (uptime_stamp(line) for line in lines) if s is not None]
        if prev.get("boot_id") and boot_id:
            same_boot = prev["boot_id"] == boot_id
        else:  # no boot id: a reboot shows as stamps that never reach the saved one
            same_boot = bool(known) and max(known) >= saved_up
        if not same_boot:
            position_notes.append("rebooted since the last run (boot %s -> %s, uptime reset): dmesg holds only the "
                                  "current boot, so events of the previous boot after uptime %.6f s are not visible "
                                  "here; source=journal reads them" % (prev.get("boot_id"), boot_id, saved_up))
        elif known and min(known) > saved_up:
            position_notes.append("the kernel ring buffer wrapped since the last run: lines logged between "
                                  "uptime %.6f s and %.6f s are lost" % (saved_up, min(known)))
    cursor = DmesgCursor(prev, boot_id, same_boot=same_boot)
    scanner = XidScanner(boot_id=boot_id, boot_time=boot_datetime(), **scanner_opts)
    for line in cursor.fresh(lines):
        scanner.feed_line(line)
    return scanner, cursor.position(), position_notes, res


# ---- file ----------------------------------------------------------------------------------------------------------
def _scan(scanner, fh, consume_tail):
    """Scan a stream: kernel log text with the fast binary search, or saved `journalctl -o json` output line by line.

    Returns the bytes consumed (a half-written last line is left for the next read unless consume_tail)."""
    if fh.peek(64)[:64].lstrip().startswith(b"{"):
        consumed = 0
        for line, size, terminated in bounded_lines(fh, MAX_RECORD_BYTES):
            if not terminated and not consume_tail:
                break
            if size > len(line):
                scanner.skip_overlong(line)  # a record over the limit cannot be a kernel message: skipped, counted
            else:
                scanner.feed_journal_line(line)
            consumed += size
        scanner.bytes_read += consumed
        return consumed
    return scanner.scan_binary(fh, consume_partial_tail=consume_tail)


def read_file(path, prev, incremental, scanner_opts, notes):
    """(scanner, position, position notes, None) of one read of a log file after prev. incremental: a position will
    be saved, so an unterminated last line (still being written) is left for the next read."""
    if not path:
        raise ReadError("source=file needs path")
    try:
        st = os.stat(path)
        gz = is_gzip(path)
    except (IOError, OSError) as exc:
        raise ReadError("cannot read %s: %s. Fix: check the path and run with become: true for system logs"
                        % (path, exc.strerror or exc)) from None
    path = os.path.abspath(path)
    if prev and prev.get("path") != path:
        notes.append("state file was written for %s, not %s: read from the start" % (prev.get("path"), path))
        prev = {}
    opts = dict(scanner_opts)
    opts["reference"] = datetime.datetime.fromtimestamp(st.st_mtime).astimezone()  # syslog has no year
    scanner = XidScanner(**opts)
    offset, old, note = resume(path, st, prev, gz=gz)
    position_notes = [note] if note else []
    try:
        if old:
            with open_log(old) as fh:
                fh.seek(int(prev.get("offset") or 0))  # gzip streams seek forward by reading
                _scan(scanner, fh, True)
        with open_log(path) as fh:
            if offset:
                fh.seek(offset)
            consumed = _scan(scanner, fh, not incremental)
    except (IOError, OSError, EOFError) as exc:
        raise ReadError("cannot read %s: %s. Fix: check the file (a damaged .gz?) and the permissions (become: true)"
                        % (path, exc)) from None
    return scanner, file_position(path, st, offset + consumed, gzip=gz, size=st.st_size), position_notes, None


# ---- one read ------------------------------------------------------------------------------------------------------
class KernelLogRead:
    """One read of the kernel log: the source read, the scanner fed with it, where the read ended, and notes."""

    def __init__(self, source, scanner, position, position_notes, tool, notes=None, state_file=None):
        self.source = source
        self.scanner = scanner
        self.position = position
        self.notes = notes or []
        self.position_notes = position_notes
        self.tool = tool  # ToolResult of journalctl/dmesg; None for a file
        self.state_file = state_file
        self.saved = False

    def save(self):
        """Save the position to the state file, for the next read to go on from it. Raises OSError."""
        save_state(self.state_file, self.source, self.position)
        self.saved = True

    def facts(self):
        """The gpufleet_xid fact (xid_facts' RETURN): XidScanner.result() with source, position and notes."""
        facts = dict(self.scanner.result())
        notes = list(self.notes)
        null = facts["unparsed"]["by_reason"].get("journal_message_null")
        if null:
            notes.append("%d journal entries had no MESSAGE (over 4096 bytes without --all)" % null)
        overlong = facts["unparsed"]["by_reason"].get("overlong_line")
        if overlong:
            notes.append("%d record(s) longer than %d bytes were skipped: a kernel message is never that long (a "
                         "damaged or foreign file?)" % (overlong, MAX_RECORD_BYTES))
        position = dict(self.position)
        position.update({"kind": self.source, "state_file": self.state_file, "saved": self.saved,
                         "notes": list(self.position_notes)})
        facts.update({"source": self.source, "position": position, "notes": notes + self.position_notes})
        return facts


def _missing(tool, package, other):
    return ReadError("%s not found on this node. Fix: install %s (or give its path: %s_executable), or use source=%s"
                     % (tool, package, tool, other))


def read_kernel_log(source="auto", journalctl=None, dmesg=None, path=None, state_file=None, since=None, until=None,
                    timeout_s=60, scanner_options=None):
    """Read the kernel log once. Raises ReadError (source unreadable or tool missing).

    source: auto (the journal when journalctl is given and answers, else dmesg), journal, dmesg or file (path: plain
    or gzip). journalctl, dmesg: the tools' paths, None where the node has none. state_file: go on from the position
    saved there (KernelLogRead.save() writes the new one). since/until: aware datetimes; the journal is asked for that
    window, and events before since are skipped. scanner_options: XidScanner's (severity_overrides, max_events).
    """
    notes = []
    try:
        return _read_once(source, journalctl, dmesg, path, state_file, since, until, timeout_s, scanner_options, notes)
    except ReadError as exc:
        exc.notes = notes
        raise


def _read_once(source, journalctl, dmesg, path, state_file, since, until, timeout_s, scanner_options, notes):
    state, note = load_state(state_file)
    if note:
        notes.append(note)
    opts = dict(scanner_options or {})
    opts["since"] = since
    until_s = until.timestamp() if until is not None else None
    if source == "auto":
        if journalctl:
            try:
                read = read_journal(journalctl, _saved_position(state, "journal", notes), since, until_s, timeout_s,
                                    opts, notes)
                return KernelLogRead("journal", *read, state_file=state_file, notes=notes)
            except ReadError as exc:
                notes.append("journal not usable (%s): read dmesg instead" % exc)
        else:
            notes.append("journalctl not found: read dmesg")
        source = "dmesg"
    if source == "journal":
        if not journalctl:
            raise _missing("journalctl", "systemd", "dmesg")
        read = read_journal(journalctl, _saved_position(state, "journal", notes), since, until_s, timeout_s, opts,
                            notes)
    elif source == "dmesg":
        if not dmesg:
            raise _missing("dmesg", "util-linux", "journal")
        read = read_dmesg(dmesg, _saved_position(state, "dmesg", notes), timeout_s, opts, notes)
    elif source == "file":
        read = read_file(path, _saved_position(state, "file", notes), bool(state_file), opts, notes)
    else:
        raise ReadError("source must be one of %s, not %r" % (", ".join(SOURCES), source))
    return KernelLogRead(source, *read, state_file=state_file, notes=notes)


# ---- following (the XID watcher) -----------------------------------------------------------------------------------
# A followed source: read(feed) feeds what is new and returns the lines read (0: nothing new, the caller calls wait());
# position() is what the caller saves to go on after a restart; overlong counts lines cut at the line limit; close().
class FileSource:
    """A log file followed (log_follow.FileFollower: rotation, truncation); blocks of whole lines. Waits on inotify
    (log_follow.FileChanges), or polls every poll_s where inotify cannot be used."""

    kind = "file"

    def __init__(self, path, position, poll_s, log, read_bytes):
        self.log = log
        self.follower = FileFollower(path, position, read_bytes=read_bytes)
        self.poll_s = poll_s
        self.changes = FileChanges.create(path)
        if self.changes is None:
            log("inotify is not available for %s: polling it every %s s" % (path, poll_s))

    def read(self, feed_block):
        """Feed the whole lines written since the last read, piece by piece (feed_block(buf, start, end)); their
        bytes."""
        pieces, size = self.follower.read_block()
        while self.follower.notes:
            self.log(self.follower.notes.pop(0))
        for buf, start, end in pieces:
            feed_block(buf, start, end)
        return size

    def wait(self, timeout_s, wake_fds=()):
        """Until the file may have new lines (True), or timeout_s or a wake fd (False)."""
        if self.changes is not None:
            return self.changes.wait(timeout_s, wake_fds)
        wait_readable(wake_fds, min(self.poll_s, timeout_s) if timeout_s is not None else self.poll_s)
        return True

    def position(self):
        return self.follower.position()

    @property
    def overlong(self):
        return self.follower.splitter.overlong

    def close(self):
        self.follower.close()
        if self.changes is not None:
            self.changes.close()


def _size(lines):
    """Bytes of the tool's output these lines were (each with its newline)."""
    return sum(map(len, lines)) + len(lines)


class _ProcessSource:
    """A following tool (log_follow.ProcessLines), restarted with back-off when it exits."""

    def __init__(self, log):
        self.log = log
        self.proc = None
        self.backoff_s = 1.0
        self.restart_at = 0.0
        self.splitter_overlong = 0

    def _start(self):
        self.proc = ProcessLines(self.argv())

    def lines(self):
        """The lines there now (never waits: wait() does)."""
        if self.proc is None:
            if time.monotonic() < self.restart_at:
                return []
            try:
                self._start()
            except OSError as exc:
                self.log("cannot start %s: %s; retrying in %.0f s" % (self.argv()[0], exc.strerror or exc,
                                                                        self.backoff_s))
                self._schedule_restart()
                return []
        lines = self.proc.read_lines(0)
        if self.proc.eof:
            self.splitter_overlong += self.proc.splitter.overlong
            rc, err = self.proc.returncode, self.proc.stderr_text
            self.proc.stop()
            self.proc = None
            if self.exited(rc, err):
                self.restart_at = 0.0
                self.backoff_s = 1.0
            else:
                self._schedule_restart()
        return lines

    def _schedule_restart(self):
        self.restart_at = time.monotonic() + self.backoff_s
        self.backoff_s = min(30.0, self.backoff_s * 2)

    @property
    def overlong(self):
        return self.splitter_overlong + (self.proc.splitter.overlong if self.proc is not None else 0)

    def wait(self, timeout_s, wake_fds=()):
        """Until the tool prints (True), or timeout_s or a wake fd (False); while it is down, until its restart."""
        if self.proc is None:
            until = self.restart_at - time.monotonic()
            wait_readable(wake_fds, until if timeout_s is None else min(timeout_s, until))
            return True
        ready = wait_readable(self.proc.fds() + list(wake_fds), timeout_s)
        return any(fd in ready for fd in self.proc.fds()) or self.proc.eof

    def close(self):
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


class JournalSource(_ProcessSource):
    """`journalctl --follow -o json` from the saved cursor (all boots after it), else the current boot from its start.

    The scanner is told what was read before (after_cursor; after_realtime_us when the cursor is gone). A journalctl
    that rejects --grep or --output-fields is asked again without it; without --grep, feed() gets every kernel entry.
    """

    kind = "journal"

    def __init__(self, exe, matches, grep, position, scanner, log):
        _ProcessSource.__init__(self, log)
        self.scanner = scanner
        self.exe = shutil.which(exe) or exe
        self.matches = list(matches)
        self.use_grep = bool(grep)
        self.use_fields = True
        self.pos = dict(position or {})
        self.mode = "cursor" if self.pos.get("cursor") else "boot"
        if self.mode == "cursor":
            scanner.after_cursor = self.pos["cursor"]

    def argv(self):
        argv = [self.exe, "--follow", "--output=json", "--no-pager", "--all"]
        if self.use_fields:
            argv.append(JOURNAL_FIELDS)
        if self.use_grep:
            argv.append(JOURNAL_GREP)
        if self.mode == "cursor" and self.pos.get("cursor"):
            argv.append("--after-cursor=" + self.pos["cursor"])
        elif self.mode == "since" and self.pos.get("realtime_us"):
            argv.append("--since=@%d" % (int(self.pos["realtime_us"]) // 1000000))
        else:
            argv.append("--boot=0")
        # --follow alone shows only the last 10 entries: all of them, from the position chosen above
        return argv + ["--lines=all"] + self.matches

    def exited(self, rc, err):
        """Adapt to why journalctl exited. True: restart at once (the arguments changed)."""
        if self.use_grep and rc != 0 and journal_rejected(JOURNAL_GREP, err):
            self.use_grep = False
            self.log("journalctl cannot filter with --grep here (%s): filtering NVRM lines in the watcher" % err[-200:])
            return True
        if self.use_fields and rc != 0 and journal_rejected(JOURNAL_FIELDS, err):
            self.use_fields = False
            self.log("journalctl does not know --output-fields: reading whole entries")
            return True
        if self.mode == "cursor" and rc != 0 and "cursor" in err.lower():
            saved = self.pos.get("realtime_us")
            self.mode = "since" if saved else "boot"
            self.scanner.after_cursor = None
            if saved:
                self.scanner.after_realtime_us = int(saved)
            self.log("the saved journal cursor is gone (%s): resuming from the saved time %s, entries at or before it "
                     "are skipped" % (err[-200:], iso_us(saved, "(none)")))
            return True
        self.log("journalctl exited with status %s%s; restarting in %.0f s"
                 % (rc, (": " + err[-300:]) if err else "", self.backoff_s))
        return False

    def read(self, feed_lines):
        lines = self.lines()
        if lines:
            feed_lines(lines)
            self._advance(lines)
        return _size(lines)

    def _advance(self, lines):
        """The position after these lines: the newest entry with a cursor (parsed again only for the last lines)."""
        for line in reversed(lines[-8:]):
            rec = journal_record(line)
            if rec.cursor:
                self.pos = {"cursor": rec.cursor, "realtime_us": rec.realtime_us, "boot_id": rec.boot_id}
                self.mode = "cursor"
                return

    def position(self):
        return dict(self.pos) if self.pos else None


class DmesgSource(_ProcessSource):
    """`dmesg --follow` (the ring buffer of the current boot, then new lines); a DmesgCursor drops what was read
    before, also when dmesg is restarted and prints the buffer again."""

    kind = "dmesg"

    def __init__(self, exe, position, boot_id, log):
        _ProcessSource.__init__(self, log)
        self.exe = shutil.which(exe) or exe
        self.cursor = DmesgCursor(position, boot_id)

    def argv(self):
        return [self.exe, "--follow"]

    def _start(self):
        _ProcessSource._start(self)
        self.cursor.restart()

    def exited(self, rc, err):
        if rc not in (0, None) or err:
            hint = ""
            if "not permitted" in err or "denied" in err.lower():
                hint = " (kernel.dmesg_restrict=1: the watcher's user needs CAP_SYSLOG, or use source journal)"
            self.log("dmesg exited with status %s: %s%s; restarting in %.0f s" % (rc, err[-300:], hint, self.backoff_s))
        return False

    def read(self, feed_lines):
        lines = self.lines()
        fresh = self.cursor.fresh(lines)
        if fresh:
            feed_lines(fresh)
        return _size(lines)

    def position(self):
        return self.cursor.position()
