# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Where a training job left its evidence on a node (stdlib only: runs on the node, read-only).

- log files (globs; plain or gzip) and systemd journal units, parsed line by line, in one pass, by every parser of what
  a hung job leaves (parse_job_lines: torch_watchdog, torch's desync report, NCCL's RAS status, torch's flight-recorder
  analyzer output; one parser per format), within an optional time window;
- flight-recorder dumps: files <prefix><rank>, returned as base64 bytes with a size limit. They are NEVER unpickled
  here: the controller reads them with a restricted unpickler;
- the environment of live worker processes (a hung job is still running): only the rank and device variables, never
  anything else of a process's environment.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import datetime
import errno
import glob
import gzip
import os
import pwd
import re
import stat

from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import (
    GZIP_MAGIC,
    journal_record,
    parse_since,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.log_follow import bounded_lines
from ansible_collections.kentino.gpufleet.plugins.module_utils.nccl_ras import RasStatusReader
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool
from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_desync_report import DesyncReportReader
from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_fr_analysis import FrAnalysisReader
from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_watchdog import parse_torch_lines

MAX_FILES = 256
ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
            "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")
_RANK_SUFFIX = re.compile(r"^(\d{1,7})$")


def _report_line(text):
    """Whether a line can matter to the desync, RAS or analyzer readers: each of theirs has one of these words
    (plain substring tests: a regex per line costs more than the readers themselves)."""
    return ("ank" in text or "ollective" in text or "rocess" in text or "lagging" in text or "started" in text
            or "finished" in text or "group info" in text or ") MISMATCH" in text or ") INCOMPLETE" in text
            or ") ERROR" in text)


# journalctl --grep (PCRE2, systemd >= 237): the lines the parsers can use, including the elastic summary block and
# torch's desync report.
JOURNAL_GREP = (r"atchdog|WorkNCCL|Timed out waiting|last enqueued|terminate called|what\(\)|exitcode|Failures:|"
                r"Timeout at collective|lagging|didn't (?:join|finish) collective|\] (?:started|finished) |"
                r"Root Cause|Heartbeat|between collectives|\]:\[rank|^\s*\[\d+\]:\s*$|^\s*(time|host|rank|"
                r"error_file|traceback)\s*:|^[=-]{10,}$|Error|Exception")


def expand(patterns):
    """Glob patterns -> sorted existing regular files (at most MAX_FILES), and notes for patterns matching nothing."""
    files, notes = [], []
    for pattern in patterns or []:
        found = sorted(p for p in glob.glob(os.path.expanduser(str(pattern))) if os.path.isfile(p))
        if not found:
            notes.append("no file matches %s" % pattern)
        for path in found:
            if path not in files:
                files.append(path)
    if len(files) > MAX_FILES:
        notes.append("%d log files match; only the newest %d are read" % (len(files), MAX_FILES))
        files = sorted(files, key=lambda p: os.path.getmtime(p))[-MAX_FILES:]
    return files, notes


class Refused(Exception):
    """A file that is not read: a link, not a regular file, or not the job's user's (the message says which)."""


def owner_problem(file_uid, job_uid, euid=None):
    """Why a file owned by file_uid is not the job's evidence, or None.

    job_uid given: the file must be that user's. Without it a root module still refuses root's files: in a directory
    every user can write, a root-owned file there was either written by a job run as root (say so with job_user: root)
    or linked in by someone else (a hard link to /etc/shadow keeps root as its owner)."""
    if job_uid is not None:
        if file_uid != job_uid:
            return "owned by %s, not by the job's user %s" % (user_label(file_uid), user_label(job_uid))
        return None
    if (os.geteuid() if euid is None else euid) == 0 and file_uid == 0:
        return ("owned by root and the job's user is not given (set job_user; job_user=root for a job that ran as "
                "root)")
    return None


def user_label(uid):
    try:
        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except (KeyError, OverflowError):
        return "uid %d" % uid


def resolve_user(user):
    """job_user (a name or a numeric uid) -> uid. Raises ValueError naming the user."""
    if user is None or str(user) == "":
        return None
    text = str(user)
    if re.match(r"\A[0-9]{1,10}\Z", text):
        return int(text)
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise ValueError("job_user %r is not a user on this node (a name or a numeric uid)" % text[:64]) from None


def open_evidence(path, job_uid):
    """(binary file object, os.stat_result) of a log or dump, opened without following a link (O_NOFOLLOW: a link
    planted in a world-writable directory is never read as root), checked after the open (fstat: no race between check
    and read) to be a regular file of the job's user. Raises Refused, or OSError when it cannot be opened."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused("%s is a symbolic link: not followed (a link in a directory other users can write could "
                          "point anywhere); give the file itself" % path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused("%s is not a regular file: not read" % path)
        problem = owner_problem(st.st_uid, job_uid)
        if problem:
            raise Refused("%s is %s: not read" % (path, problem))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st
    except BaseException:
        os.close(fd)
        raise


MAX_LOG_LINE_BYTES = 1024 * 1024


def _lines(fh, skip, limit, notes, path):
    """Decoded lines of a log, at most `limit` bytes of it; a line over MAX_LOG_LINE_BYTES is skipped (noted), and
    never held whole (a file without newlines costs that much memory, not its size)."""
    lines = bounded_lines(fh, MAX_LOG_LINE_BYTES)
    if skip:
        fh.seek(skip)
        next(lines, None)  # the first line is cut: drop it
    read = overlong = 0
    try:
        for line, size, _terminated in lines:
            read += size
            if read > limit:
                return
            if size > len(line):
                overlong += 1
                continue
            yield line.decode("utf-8", "replace")
    finally:
        if overlong:
            notes.append("%s: %d line(s) longer than %d bytes were skipped (not a log line of the job)"
                         % (path, overlong, MAX_LOG_LINE_BYTES))


def parse_job_lines(lines, world_size=None, since=None, until=None, reference=None):
    """torch_watchdog's result for the lines (str, or (str, epoch seconds) pairs), plus what the other formats of a
    hang say in the same stream: desync_reports (torch's TORCH_NCCL_DESYNC_DEBUG report), ras (`ncclras` output) and
    fr_analysis (`torchfrtrace` output), e.g. from a file the operator saved beside the job's logs."""
    readers = (("desync_reports", DesyncReportReader()), ("ras", RasStatusReader()),
               ("fr_analysis", FrAnalysisReader()))

    def tee():
        for item in lines:
            text, when = item if isinstance(item, tuple) else (item, None)
            if _report_line(text):  # the rest of a long log (loss prints, progress bars) skips the readers
                for _key, reader in readers:
                    reader.feed(text, when)
            yield item

    parsed = parse_torch_lines(tee(), world_size=world_size, since=since, until=until, reference=reference)
    for key, reader in readers:
        parsed[key] = reader.result()
    return parsed


def read_log_file(path, since=None, until=None, max_bytes=2 * 1024 ** 3, world_size=None, job_uid=None):
    """One log file parsed by torch_watchdog. Never raises: problems are in `error` and `notes`."""
    out = {"source": "file", "path": path, "unit": None, "bytes": None, "mtime": None, "notes": [], "error": None,
           "parsed": None}
    try:
        raw, st = open_evidence(path, job_uid)
        with raw:
            # gzip is told by its magic bytes, not by the name
            fh = gzip.GzipFile(fileobj=raw, mode="rb") if raw.peek(2)[:2] == GZIP_MAGIC else raw
            out["bytes"], out["mtime"] = st.st_size, st.st_mtime
            skip = 0
            if st.st_size > max_bytes and not isinstance(fh, gzip.GzipFile):
                skip = st.st_size - max_bytes  # the end of the log is where the job died
                out["notes"].append("%s is %d bytes: only its last %d bytes were read" % (path, st.st_size, max_bytes))
            out["parsed"] = parse_job_lines(_lines(fh, skip, max_bytes, out["notes"], path), world_size=world_size,
                                            since=since, until=until, reference=st.st_mtime)
    except Refused as exc:
        out["error"] = "refused: %s" % exc
    except (IOError, OSError, EOFError) as exc:
        out["error"] = ("cannot read %s: %s. Fix: check the path and the permissions (become: true when the job ran "
                        "as another user)" % (path, getattr(exc, "strerror", None) or exc))
    return out


def read_journal_unit(exe, unit, since, until, timeout, world_size=None):
    """The journal of one systemd unit (the job's service), keyword-filtered by journalctl itself."""
    out = {"source": "journal", "path": None, "unit": unit, "bytes": None, "mtime": None, "notes": [], "error": None,
           "parsed": None, "tool": None}
    window = []
    if since is not None:
        window.append("--since=@%d" % int(since))
    if until is not None:
        window.append("--until=@%d" % (int(until) + 1))
    base = [exe, "-u", unit, "-o", "json", "--no-pager", "--all", "--output-fields=MESSAGE"] + window
    res = run_tool(base + ["--grep=" + JOURNAL_GREP], timeout)
    if res.rc not in (0, None) and not res.timed_out and any(w in (res.stderr or "") for w in ("grep", "pattern")):
        res = run_tool(base, timeout)  # journalctl older than systemd 237 has no --grep
        out["notes"].append("journalctl has no --grep here: the whole unit journal was read")
    out["tool"] = res.as_dict()
    err = (res.stderr or "").strip()
    if res.error or res.timed_out or (res.rc not in (0, 1) or (res.rc == 1 and res.stdout.strip())):
        out["error"] = ("journalctl -u %s failed (%s): %s. Fix: check the unit name, run with become: true (the "
                        "system journal needs root or the systemd-journal group)"
                        % (unit, res.error or ("timed out" if res.timed_out else "rc %s" % res.rc), err[-300:]))
        return out
    if res.output_cut:
        out["notes"].append("the journal of %s was longer than the 4 MiB kept: its middle was not read; narrow the "
                            "window (since/until)" % unit)

    def lines():
        for raw in res.stdout.splitlines():
            rec = journal_record(raw)
            when = rec.realtime_us / 1e6 if rec.realtime_us is not None else None
            for message in rec.messages:
                for part in message.splitlines() or [message]:
                    yield (part, when)

    out["parsed"] = parse_job_lines(lines(), world_size=world_size, since=since, until=until)
    return out


def collect_dumps(prefixes, max_bytes, max_total, since=None, job_uid=None):
    """Dump files <prefix><rank>: metadata for all, bytes (base64) for those within the limits and the window. Each is
    opened with open_evidence (no link followed, a regular file of the job's user): a refused one is an error."""
    dumps, notes, total = [], [], 0
    seen = set()
    for prefix in prefixes or []:
        prefix = os.path.expanduser(str(prefix))
        directory = os.path.dirname(prefix) or "."
        if not os.path.isdir(directory):
            notes.append("dump directory %s does not exist (no dump was written on this node)" % directory)
            continue
        for path in sorted(glob.glob(glob.escape(prefix) + "*")):
            match = _RANK_SUFFIX.match(path[len(prefix):])
            if not match or path in seen:
                continue
            seen.add(path)
            item = {"path": path, "prefix": prefix, "rank": int(match.group(1)), "bytes": None, "mtime": None,
                    "data_b64": None, "skipped": None, "error": None}
            dumps.append(item)
            try:
                fh, st = open_evidence(path, job_uid)
            except Refused as exc:
                item["error"] = "refused: %s" % exc
                continue
            except (IOError, OSError) as exc:
                item["error"] = ("cannot read %s: %s. Fix: run with become: true (the dump belongs to the job's user)"
                                 % (path, getattr(exc, "strerror", None) or exc))
                continue
            with fh:
                item["bytes"], item["mtime"] = st.st_size, st.st_mtime
                item["skipped"] = _dump_skipped(st, since, max_bytes, max_total, total)
                if item["skipped"]:
                    continue
                try:
                    data = fh.read(max_bytes + 1)
                except (IOError, OSError) as exc:
                    item["error"] = "cannot read %s: %s" % (path, getattr(exc, "strerror", None) or exc)
                    continue
            if len(data) > max_bytes:
                item["skipped"] = "grew over max_dump_bytes while being read: not sent"
                continue
            total += len(data)
            item["data_b64"] = base64.b64encode(data).decode("ascii")
    return dumps, notes


def _dump_skipped(st, since, max_bytes, max_total, total):
    """Why a dump's bytes are not sent (before the window, over a limit), or None."""
    if since is not None and st.st_mtime < since:
        return "written before the window (%s): an older job's dump" % int(st.st_mtime)
    if st.st_size > max_bytes:
        return "%d bytes, over max_dump_bytes=%d: not sent (raise the limit)" % (st.st_size, max_bytes)
    if total + st.st_size > max_total:
        return "the dumps of this node exceed max_dumps_total_bytes=%d: not sent" % max_total
    return None


def scan_processes(proc_root="/proc", max_processes=100000):
    """Live processes carrying RANK and LOCAL_RANK (torchrun's workers): pid, command and ENV_KEYS only."""
    found, denied = [], 0
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return found, 0
    for pid in pids[:max_processes]:
        try:
            with open(os.path.join(proc_root, pid, "environ"), "rb") as fh:
                raw = fh.read(1024 * 1024)
        except (IOError, OSError):
            denied += 1
            continue
        if b"LOCAL_RANK=" not in raw:
            continue
        env = {}
        for item in raw.split(b"\0"):
            key, _sep, value = item.partition(b"=")
            key = key.decode("ascii", "replace")
            if key in ENV_KEYS:
                env[key] = value.decode("utf-8", "replace")[:300]
        if "RANK" not in env or "LOCAL_RANK" not in env:
            continue
        try:
            with open(os.path.join(proc_root, pid, "cmdline"), "rb") as fh:
                cmd = fh.read(400).replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except (IOError, OSError):
            cmd = None
        found.append({"pid": int(pid), "command": cmd, "env": env})
    return found, denied


def parse_when(text, now):
    """kernel_log_sources.parse_since as epoch seconds (now: epoch seconds); None for an empty value."""
    value = parse_since(text, datetime.datetime.fromtimestamp(now, datetime.timezone.utc))
    return value.timestamp() if value is not None else None
