# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Where kernel log lines come from: line prefixes, journald JSON records, plain/gzip files and how to tell one file
from another across rotations, this boot's identity (stdlib only: runs on the node).

Every source spells time differently (docs/signals.md section 1):
  dmesg                    "[ 1843.308145] "                       seconds since boot
  dmesg -T                 "[Fri Aug  9 13:32:56 2024] "            local wall time, day space-padded
  dmesg --time-format iso  "2024-08-09T13:32:56,123456+00:00 "
  dmesg -x                 "kern  :warn  : [ 1843.308145] "
  syslog (kern.log)        "Dec  2 11:38:47 host kernel: [  219.470994] "   no year
  rsyslog RFC 3339         "2024-12-02T11:38:47.123456+00:00 host kernel: [  219.470994] "
  journalctl -k -o json    one JSON object a line (see journal_record)
split_prefix() strips any of these and returns what it could learn; it never raises.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import gzip
import hashlib
import json
import os
import re

GZIP_MAGIC = b"\x1f\x8b"
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
PROC_STAT = "/proc/stat"
HEAD_BYTES = 512  # hashed at the start of a log file: tells a new file from a grown one when an inode number is reused

_MONTHS = {m: i + 1 for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"))}
_UPTIME_RE = re.compile(r"^\[\s*(\d+\.\d+)\]\s?")
_STAMP_RE = re.compile(r"^(?:[a-z]+\s*:[a-z]+\s*: )?\[\s*(\d+\.\d+)\]")  # dmesg and dmesg -x
_STAMP_RE_BYTES = re.compile(_STAMP_RE.pattern.encode("ascii"))
_DMESG_X_RE = re.compile(r"^[a-z]+\s*:[a-z]+\s*: ")
_DMESG_T_RE = re.compile(r"^\[(?:[A-Z][a-z]{2} )?([A-Z][a-z]{2}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})\]\s?")
_ISO_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:[,.](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?\s")
_SYSLOG_RE = re.compile(r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) ")
_HOST_KERNEL_RE = re.compile(r"^\S+ kernel: ")


_RELATIVE_RE = re.compile(r"^-\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)$", re.I)
_UNITS_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
_LOCAL_TZ = []


def _local_tz():
    """The node's local timezone (looked up once: it costs more than parsing a line)."""
    if not _LOCAL_TZ:
        _LOCAL_TZ.append(datetime.datetime.now().astimezone().tzinfo)
    return _LOCAL_TZ[0]


def _iso(dt):
    return dt.isoformat()


def _tz_from(text):
    if not text:
        return None
    if text == "Z":
        return datetime.timezone.utc
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    return datetime.timezone(sign * datetime.timedelta(hours=int(digits[:2]), minutes=int(digits[2:4])))


def parse_since(text, now=None):
    """A time an operator gives (since, until): ISO 8601 (a naive time is the node's local time), @epoch, or relative
    to now (-2h, -30m, -1d, -90s, -1w) -> aware datetime; None for none. ValueError naming the accepted forms."""
    if text is None or str(text).strip() == "":
        return None
    text = str(text).strip()
    now = now or datetime.datetime.now(datetime.timezone.utc)
    match = _RELATIVE_RE.match(text)
    if match:
        return now - datetime.timedelta(seconds=float(match.group(1)) * _UNITS_S[match.group(2).lower()])
    try:
        if text.startswith("@"):
            return datetime.datetime.fromtimestamp(float(text[1:]), datetime.timezone.utc)
        value = datetime.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except (ValueError, OverflowError, OSError):
        raise ValueError("%r is neither ISO 8601 (2024-08-09T13:00:00Z, 2024-08-09), @epoch nor relative to now "
                         "(-2h, -30m, -1d, -90s, -1w)" % text) from None
    if value.tzinfo is None:
        value = value.astimezone()  # a naive time is the node's local time
    return value


def syslog_year(month, reference):
    """Year of a syslog timestamp that has none: the reference's year, or the year before when the month lies ahead.

    reference is a datetime near the end of the log (the file's mtime, or now).
    """
    return reference.year - 1 if month > reference.month else reference.year


class Prefix:
    """What a line prefix told us. time is a timezone-aware datetime or None; uptime_s a float or None."""

    __slots__ = ("kind", "time", "uptime_s", "message")

    def __init__(self, kind, time, uptime_s, message):
        self.kind = kind
        self.time = time
        self.uptime_s = uptime_s
        self.message = message


def split_prefix(line, reference=None, want_time=True):
    """Strip a dmesg/syslog prefix from one line (str). Returns a Prefix; unknown prefixes leave the line untouched.

    reference: datetime used to guess the year of syslog timestamps (default: now).
    want_time=False skips building the datetime (the costly part) when only the uptime and message are needed.
    """
    text = line.rstrip("\r\n")
    time_ = None
    uptime = None
    kind = "plain"
    try:
        match = _SYSLOG_RE.match(text)
        if match and match.group(1) in _MONTHS:
            if want_time:
                ref = reference or datetime.datetime.now().astimezone()
                month = _MONTHS[match.group(1)]
                try:
                    time_ = datetime.datetime(syslog_year(month, ref), month, int(match.group(2)),
                                              int(match.group(3)), int(match.group(4)), int(match.group(5)),
                                              tzinfo=_local_tz())
                except ValueError:  # Feb 29 guessed into a non-leap year, garbage digits
                    time_ = None
            kind = "syslog"
            text = text[match.end():]
            host = _HOST_KERNEL_RE.match(text)
            if host:
                text = text[host.end():]
        else:
            match = _ISO_RE.match(text)
            if match:
                frac = (match.group(7) or "0")[:6].ljust(6, "0")
                try:
                    time_ = datetime.datetime(int(match.group(1)), int(match.group(2)), int(match.group(3)),
                                              int(match.group(4)), int(match.group(5)), int(match.group(6)),
                                              int(frac), tzinfo=_tz_from(match.group(8)) or _local_tz())
                except ValueError:
                    time_ = None
                text = text[match.end():]
                host = _HOST_KERNEL_RE.match(text)
                kind = "syslog_iso" if host else "dmesg_iso"
                if host:
                    text = text[host.end():]
            else:
                match = _DMESG_X_RE.match(text)
                if match:
                    kind = "dmesg_x"
                    text = text[match.end():]
                match = _DMESG_T_RE.match(text)
                if match and match.group(1) in _MONTHS:
                    try:
                        time_ = datetime.datetime(int(match.group(6)), _MONTHS[match.group(1)], int(match.group(2)),
                                                  int(match.group(3)), int(match.group(4)), int(match.group(5)),
                                                  tzinfo=_local_tz())
                    except ValueError:
                        time_ = None
                    kind = "dmesg_t"
                    text = text[match.end():]
        match = _UPTIME_RE.match(text)
        if match:
            uptime = float(match.group(1))
            if kind == "plain":
                kind = "dmesg"
            text = text[match.end():]
    except (ValueError, OverflowError):
        pass
    return Prefix(kind, time_, uptime, text)


def _as_text(value):
    """A journald field value as str: strings as is, byte arrays (non-UTF-8 values) decoded, None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if all(isinstance(b, int) and 0 <= b < 256 for b in value):
            return bytes(value).decode("utf-8", "replace")
        return None
    return str(value)


def _first(value):
    """A repeated journald field is an array of values: keep the first."""
    if isinstance(value, list) and value and not all(isinstance(b, int) for b in value):
        return value[0]
    return value


def _int_field(record, *names):
    for name in names:
        value = _as_text(_first(record.get(name)))
        if value is not None:
            try:
                return int(value)
            except ValueError:
                continue
    return None


class JournalRecord:
    """One journald entry: messages (list of str; several when MESSAGE was repeated), time, uptime_s, boot_id, cursor.

    problem is a short reason when the entry could not be read (bad JSON, MESSAGE null because it exceeded 4096 bytes).
    """

    __slots__ = ("messages", "time", "realtime_us", "uptime_s", "boot_id", "cursor", "problem")

    def __init__(self):
        self.messages = []
        self.time = None
        self.realtime_us = None
        self.uptime_s = None
        self.boot_id = None
        self.cursor = None
        self.problem = None


def journal_record(line):
    """Decode one line of `journalctl -o json`. Never raises; see JournalRecord.problem."""
    rec = JournalRecord()
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    line = line.strip()
    if not line:
        rec.problem = "empty"
        return rec
    try:
        data = json.loads(line)
    except ValueError:
        rec.problem = "json"
        return rec
    if not isinstance(data, dict):
        rec.problem = "json"
        return rec
    rec.cursor = _as_text(_first(data.get("__CURSOR")))
    rec.boot_id = _as_text(_first(data.get("_BOOT_ID")))
    rec.realtime_us = _int_field(data, "__REALTIME_TIMESTAMP")
    if rec.realtime_us is not None:
        try:
            rec.time = datetime.datetime.fromtimestamp(rec.realtime_us / 1e6, datetime.timezone.utc)
        except (ValueError, OverflowError, OSError):
            rec.time = None
    # Kernel entries carry the kernel's own monotonic stamp; __MONOTONIC_TIMESTAMP is when journald received it.
    mono = _int_field(data, "_SOURCE_MONOTONIC_TIMESTAMP", "__MONOTONIC_TIMESTAMP")
    rec.uptime_s = mono / 1e6 if mono is not None else None
    raw = data.get("MESSAGE")
    if raw is None:
        rec.problem = "message_null" if "MESSAGE" in data else "no_message"
    elif isinstance(raw, list) and raw and not all(isinstance(b, int) for b in raw):
        rec.messages = [m for m in (_as_text(v) for v in raw) if m is not None]
    else:
        text = _as_text(raw)
        if text is None:
            rec.problem = "message_type"
        else:
            rec.messages = [text]
    return rec


def is_gzip(path):
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def open_log(path):
    """Open a log file for binary streaming reads; gzip detected by its magic bytes, not by the name."""
    if is_gzip(path):
        return gzip.open(path, "rb")
    return open(path, "rb")


def uptime_stamp(line):
    """The seconds-since-boot stamp of a dmesg line (str or bytes; plain or -x form), or None."""
    match = (_STAMP_RE_BYTES if isinstance(line, bytes) else _STAMP_RE).match(line)
    return float(match.group(1)) if match else None


# ---- this boot -----------------------------------------------------------------------------------------------------
def read_boot_id(path=BOOT_ID_FILE):
    """This boot's id in journald's spelling (32 hex digits; /proc writes it as a dashed UUID), or None."""
    try:
        with open(path) as fh:
            return fh.read().strip().replace("-", "").lower() or None
    except (IOError, OSError):
        return None


def read_boot_time(path=PROC_STAT):
    """When this boot started (epoch seconds, the kernel's btime), or None."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (IOError, OSError, ValueError, IndexError):
        pass
    return None


def boot_datetime(path=PROC_STAT):
    """read_boot_time as an aware datetime (what dates dmesg's uptime stamps), or None."""
    epoch = read_boot_time(path)
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc) if epoch is not None else None


# ---- one file across rotations -------------------------------------------------------------------------------------
def head_digest(path, length=HEAD_BYTES):
    """(bytes hashed, sha256 hex) of the first length bytes of a (decompressed) file; (0, None) when unreadable."""
    try:
        with open_log(path) as fh:
            data = fh.read(length)
    except (IOError, OSError, EOFError):
        return 0, None
    return len(data), hashlib.sha256(data).hexdigest()


def file_position(path, st, offset, **extra):
    """The saved position of a log file read up to offset: its identity (inode, device, first bytes) and the offset."""
    head_bytes, head_sha = head_digest(path)
    position = {"path": path, "inode": st.st_ino, "dev": st.st_dev, "offset": offset, "head_bytes": head_bytes,
                "head_sha256": head_sha}
    position.update(extra)
    return position


def same_file(path, st, prev):
    """Whether path (os.stat result st) is the file of the saved position prev: same inode and device, and the same
    first bytes where prev recorded them (a deleted log's inode number can be handed to a new file)."""
    if prev.get("inode") != st.st_ino or prev.get("dev") != st.st_dev:
        return False
    if not prev.get("head_sha256"):
        return True
    return head_digest(path, int(prev.get("head_bytes") or 0)) == (prev.get("head_bytes"), prev["head_sha256"])


def rotated_sibling(path, prev):
    """The file that was `path` at the saved position prev (kern.log -> kern.log.1), found by its identity, or None."""
    directory, base = os.path.split(os.path.abspath(path))
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
        if same_file(candidate, st, prev):
            return candidate
    return None


def resume(path, st, prev, gz=False):
    """Where to go on reading path (os.stat result st) after the read that saved prev ({path, inode, dev, offset,
    size, head_bytes, head_sha256}; size optional).

    Returns (offset in path, old, note). old: the file path was at that read (rotated away, found by its identity),
    whose rest from prev's offset comes first; None when there is none. note: what happened, for the operator, or None.
    gz: path is gzip (its offset counts decompressed bytes, so only a smaller file size tells a truncation).
    """
    if not prev:
        return 0, None, None
    saved = int(prev.get("offset") or 0)
    if prev.get("inode") == st.st_ino and prev.get("dev") == st.st_dev:
        if st.st_size < int(prev.get("size") or 0) or (not gz and st.st_size < saved):
            return 0, None, ("%s was truncated since the last read (size %d, read up to byte %d): reading it from the "
                             "start" % (path, st.st_size, saved))
        if not same_file(path, st, prev):
            return 0, None, ("%s is a new file with the inode number of the old one: reading it from the start; lines "
                             "logged to the old file after the last read may be missed" % path)
        return saved, None, None
    old = rotated_sibling(path, prev)
    if old:
        return 0, old, ("%s was rotated to %s since the last read: reading its rest from byte %d, then %s from the "
                        "start" % (path, old, saved, path))
    return 0, None, ("%s was rotated and the old file (inode %s) is gone: lines logged between the last read and the "
                     "rotation may be missed" % (path, prev.get("inode")))
