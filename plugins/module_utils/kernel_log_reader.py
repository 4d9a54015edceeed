# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Read the kernel log for the XID parser once, going on from a saved position (stdlib only: runs on the node).

read_kernel_log() -> KernelLogRead (.facts(): the gpufleet_xid fact; .save(): the new position; .tool). The journal
(cursor, boot id: a read spans reboots and falls back to the saved time when the cursor is gone), dmesg (this boot,
by uptime) or a plain/gzip file (rotation by inode, truncation). ReadError names the tool or file and the fix.

The readers are xid_facts' (same behaviour); xid_facts, the watcher and the health snapshot share this API.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import hashlib
import json
import os
import re
import tempfile

from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import XidScanner
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import is_gzip, open_log
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool

STATE_VERSION = 1
_RELATIVE_RE = re.compile(r"^-\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)$", re.I)
_UNITS_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


class ReadError(Exception):
    """A source could not be read: the message names the tool/file, what failed and the fix."""

    def __init__(self, msg, tool=None):
        super(ReadError, self).__init__(msg)
        self.tool = tool


def _utcnow():
    return datetime.datetime.now(datetime.timezone.utc)


def parse_since(text, now=None):
    """ISO 8601, @epoch or -2h-style relative time -> aware datetime; ValueError with the accepted forms."""
    if text is None or str(text).strip() == "":
        return None
    text = str(text).strip()
    now = now or _utcnow()
    match = _RELATIVE_RE.match(text)
    if match:
        return now - datetime.timedelta(seconds=float(match.group(1)) * _UNITS_S[match.group(2).lower()])
    if text.startswith("@"):
        return datetime.datetime.fromtimestamp(float(text[1:]), datetime.timezone.utc)
    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        value = datetime.datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError("since=%r is neither ISO 8601 (2024-08-09T13:00:00Z, 2024-08-09) nor relative "
                         "(-2h, -30m, -1d, -90s, -1w)" % text) from None
    if value.tzinfo is None:
        value = value.astimezone()  # a naive time is the node's local time
    return value


def _boot_id():
    """This boot's id in journald's spelling (32 hex digits; /proc writes it as a dashed UUID)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip().replace("-", "").lower() or None
    except (IOError, OSError):
        return None


def _boot_time():
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return datetime.datetime.fromtimestamp(int(line.split()[1]), datetime.timezone.utc)
    except (IOError, OSError, ValueError, IndexError):
        pass
    return None


# ---- state file ----------------------------------------------------------------------------------------------------
def load_state(path):
    """(state dict or None, note or None). A missing file is a first run; a corrupt one is ignored, said so."""
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


def save_state(path, state):
    """Write the state atomically: a temp file in the same directory, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o700)
    fd, tmp = tempfile.mkstemp(prefix=".xid_state.", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(state, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.rename(tmp, path)
    except Exception:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---- journal -------------------------------------------------------------------------------------------------------
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


# journalctl filters in C: only NVRM entries (--grep, systemd >= 237) and only the fields we read (--output-fields,
# systemd >= 236; the cursor, times and _BOOT_ID always come). That keeps a busy boot's kernel log far below the
# output run_tool keeps. Older journalctl rejects the options: drop them one by one.
_JOURNAL_EXTRAS = (("--grep=NVRM", ("grep", "pattern", "PCRE")),
                   ("--output-fields=MESSAGE,_SOURCE_MONOTONIC_TIMESTAMP", ("output-fields",)))


def _run_journalctl(base, window, timeout):
    extras = [opt for opt, _ in _JOURNAL_EXTRAS]
    res = run_tool(base + extras + window, timeout)
    for opt, markers in _JOURNAL_EXTRAS:
        if res.rc not in (0, None) and not res.timed_out and any(m in (res.stderr or "") for m in markers):
            extras.remove(opt)
            res = run_tool(base + extras + window, timeout)
    return res


def read_journal(exe, params, state, since, scanner_opts, notes):
    timeout = params["timeout"]
    base = [exe, "-o", "json", "--no-pager", "--all"]
    prev = (state or {}).get("journal") or {}
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
    res = _run_journalctl(base, window, timeout)
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
                              % (failure, _iso_us(saved_us) if saved_us else "(none saved: current boot)"))
        res = _run_journalctl(base, window, timeout)
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


def _iso_us(us):
    try:
        return datetime.datetime.fromtimestamp(int(us) / 1e6, datetime.timezone.utc).isoformat()
    except (TypeError, ValueError, OverflowError, OSError):
        return None


# ---- dmesg ---------------------------------------------------------------------------------------------------------
_UPTIME_RE = re.compile(r"^\[\s*(\d+\.\d+)\]")


def read_dmesg(exe, params, state, scanner_opts, notes):
    res = run_tool([exe], params["timeout"])
    if res.error or res.timed_out or res.rc != 0:
        err = (res.stderr or "").strip()
        if res.error:
            why = res.error
        elif res.timed_out:
            why = "dmesg timed out after %.0f s" % res.duration_s
        else:
            why = "dmesg exited %s: %s" % (res.rc, err[-300:] or "no message")
        if "not permitted" in err or "denied" in err.lower():
            why += (". The kernel restricts the ring buffer to root (kernel.dmesg_restrict=1): run this task with "
                    "become: true, or set sysctl kernel.dmesg_restrict=0, or use source=journal")
        raise ReadError(why, res.as_dict())
    boot_id = _boot_id()
    prev = (state or {}).get("dmesg") or {}
    lines = res.stdout.splitlines()
    stamps = []
    for line in lines:
        match = _UPTIME_RE.match(line)
        stamps.append(float(match.group(1)) if match else None)
    known = [s for s in stamps if s is not None]
    start = 0
    position_notes = []
    if prev.get("uptime_s") is not None:
        saved_up = float(prev["uptime_s"])
        same_boot = (prev.get("boot_id") == boot_id) if (prev.get("boot_id") and boot_id) else \
            (bool(known) and max(known) >= saved_up)
        if not same_boot:
            position_notes.append("rebooted since the last run (boot %s -> %s, uptime reset): dmesg holds only the "
                                  "current boot, so events of the previous boot after uptime %.6f s are not visible "
                                  "here; source=journal reads them" % (prev.get("boot_id"), boot_id, saved_up))
        else:
            if known and min(known) > saved_up:
                position_notes.append("the kernel ring buffer wrapped since the last run: lines logged between "
                                      "uptime %.6f s and %.6f s are lost" % (saved_up, min(known)))
            skip_same = int(prev.get("same_stamp_lines") or 0)
            start = len(lines)
            for i, stamp in enumerate(stamps):
                if stamp is None:
                    continue
                if stamp < saved_up:
                    continue
                if stamp == saved_up and skip_same > 0:
                    skip_same -= 1
                    continue
                start = i
                break
    scanner = XidScanner(boot_id=boot_id, boot_time=_boot_time(), **scanner_opts)
    for line in lines[start:]:
        scanner.feed_line(line)
    position = {"boot_id": boot_id, "uptime_s": prev.get("uptime_s") if boot_id == prev.get("boot_id") else None,
                "same_stamp_lines": prev.get("same_stamp_lines") if boot_id == prev.get("boot_id") else 0}
    if known:
        last = known[-1]
        position = {"boot_id": boot_id, "uptime_s": last, "same_stamp_lines": sum(1 for s in known if s == last)}
    return scanner, position, position_notes, res


# ---- file ----------------------------------------------------------------------------------------------------------
def _rotated_sibling(path, prev):
    """The file that was `path` at the last run (kern.log -> kern.log.1), found by its inode."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    base = os.path.basename(path)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    for name in names:
        if name == base or not name.startswith(base):
            continue
        candidate = os.path.join(directory, name)
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if _same_file(candidate, st, prev):
            return candidate
    return None


HEAD_BYTES = 512


def _head(path, length=HEAD_BYTES):
    """(bytes hashed, sha256) of the first bytes of a (decompressed) file: tells a new file from a grown one when the
    filesystem reuses the inode number of a deleted log."""
    try:
        with open_log(path) as fh:
            data = fh.read(length)
    except (IOError, OSError, EOFError):
        return 0, None
    return len(data), hashlib.sha256(data).hexdigest()


def _same_file(path, st, prev):
    if prev.get("inode") != st.st_ino or prev.get("dev") != st.st_dev:
        return False
    length, digest = _head(path, int(prev.get("head_bytes") or 0))
    return prev.get("head_sha256") is None or (length == prev.get("head_bytes") and digest == prev["head_sha256"])


def _scan(scanner, fh, consume_tail):
    """Scan a stream: kernel log text with the fast binary search, or saved `journalctl -o json` output line by line.

    Returns the bytes consumed (a half-written last line is left for the next run unless consume_tail)."""
    if fh.peek(64)[:64].lstrip().startswith(b"{"):
        consumed = 0
        for line in fh:
            if not line.endswith(b"\n") and not consume_tail:
                break
            scanner.feed_journal_line(line)
            consumed += len(line)
        scanner.bytes_read += consumed
        return consumed
    return scanner.scan_binary(fh, consume_partial_tail=consume_tail)


def _skip(fh, count):
    """Move a plain or gzip stream forward by count bytes (GzipFile.seek reads forward; plain files seek)."""
    fh.seek(count)


def read_file(path, params, state, scanner_opts, notes):
    if not path:
        raise ReadError("source=file needs path")
    try:
        st = os.stat(path)
        gz = is_gzip(path)
    except (IOError, OSError) as exc:
        raise ReadError("cannot read %s: %s. Fix: check the path and run with become: true for system logs"
                        % (path, exc.strerror or exc)) from None
    prev = (state or {}).get("file") or {}
    if prev and prev.get("path") != os.path.abspath(path):
        notes.append("state file was written for %s, not %s: read from the start" % (prev.get("path"), path))
        prev = {}
    opts = dict(scanner_opts)
    opts["reference"] = datetime.datetime.fromtimestamp(st.st_mtime).astimezone()  # syslog has no year
    scanner = XidScanner(**opts)
    consume_tail = not params.get("state_file")  # an unterminated last line may still be being written
    position_notes = []
    offset = 0
    try:
        if prev:
            saved_off = int(prev.get("offset") or 0)
            if prev.get("inode") == st.st_ino and prev.get("dev") == st.st_dev:
                if st.st_size < int(prev.get("size") or 0) or (not gz and st.st_size < saved_off):
                    position_notes.append("%s was truncated since the last run (size %s -> %d): read from the start"
                                          % (path, prev.get("size"), st.st_size))
                elif not _same_file(path, st, prev):
                    position_notes.append("%s was replaced since the last run (same inode number, different content): "
                                          "read from the start; lines logged to the old file after the last run may "
                                          "be missed" % path)
                else:
                    offset = saved_off
            else:
                old = _rotated_sibling(path, prev)
                if old:
                    position_notes.append("%s was rotated since the last run: read the rest of %s from byte %d, "
                                          "then %s from the start" % (path, old, saved_off, path))
                    with open_log(old) as fh:
                        _skip(fh, saved_off)
                        _scan(scanner, fh, True)
                else:
                    position_notes.append("%s was rotated since the last run and the previous file (inode %s) is "
                                          "gone: lines logged between the last run and the rotation may be missed"
                                          % (path, prev.get("inode")))
        with open_log(path) as fh:
            if offset:
                _skip(fh, offset)
            consumed = _scan(scanner, fh, consume_tail)
    except (IOError, OSError, EOFError) as exc:
        raise ReadError("cannot read %s: %s. Fix: check the file (a damaged .gz?) and the permissions (become: true)"
                        % (path, exc)) from None
    head_bytes, head_sha = _head(path)
    position = {"path": os.path.abspath(path), "inode": st.st_ino, "dev": st.st_dev, "gzip": gz,
                "offset": offset + consumed, "size": st.st_size, "head_bytes": head_bytes, "head_sha256": head_sha}
    return scanner, position, position_notes, None


SOURCES = ("auto", "journal", "dmesg", "file")


def _for(state, source, notes):
    """The part of the saved state for this source; a state of another source is ignored, said so."""
    if state is None:
        return None
    if state.get("source") != source:
        notes.append("state file was written for source %s, not %s: read as a first run" % (state.get("source"), source))
        return None
    return state


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
        save_state(self.state_file, {"version": STATE_VERSION, "source": self.source, self.source: self.position,
                                     "saved_at": _utcnow().isoformat()})
        self.saved = True

    def facts(self):
        """The gpufleet_xid fact (xid_facts' RETURN): XidScanner.result() with source, position and notes."""
        facts = dict(self.scanner.result())
        notes = list(self.notes)
        null = facts["unparsed"]["by_reason"].get("journal_message_null")
        if null:
            notes.append("%d journal entries had no MESSAGE (over 4096 bytes without --all)" % null)
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
    saved there (KernelLogRead.save() writes the new one). since: an aware datetime (events before it are skipped).
    until is accepted for the API and not used by this one-shot reader. scanner_options: XidScanner's
    (severity_overrides, max_events).
    """
    notes = []
    state, note = load_state(state_file)
    if note:
        notes.append(note)
    opts = dict(scanner_options or {})
    opts["since"] = since
    params = {"timeout": timeout_s, "state_file": state_file}
    if source == "auto":
        if journalctl:
            try:
                read = read_journal(journalctl, params, _for(state, "journal", notes), since, opts, notes)
                return KernelLogRead("journal", *read, state_file=state_file, notes=notes)
            except ReadError as exc:
                notes.append("journal not usable (%s): read dmesg instead" % exc)
        else:
            notes.append("journalctl not found: read dmesg")
        source = "dmesg"
    if source == "journal":
        if not journalctl:
            raise _missing("journalctl", "systemd", "dmesg")
        read = read_journal(journalctl, params, _for(state, "journal", notes), since, opts, notes)
    elif source == "dmesg":
        if not dmesg:
            raise _missing("dmesg", "util-linux", "journal")
        read = read_dmesg(dmesg, params, _for(state, "dmesg", notes), opts, notes)
    elif source == "file":
        read = read_file(path, params, _for(state, "file", notes), opts, notes)
    else:
        raise ReadError("source must be one of %s, not %r" % (", ".join(SOURCES), source))
    return KernelLogRead(source, *read, state_file=state_file, notes=notes)
