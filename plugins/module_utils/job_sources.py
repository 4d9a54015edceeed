# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Where a training job left its evidence on a node (stdlib only: runs on the node, read-only).

- log files (globs; plain or gzip) and systemd journal units, parsed line by line with torch_watchdog (one parser per
  format), within an optional time window;
- flight-recorder dumps: files <prefix><rank>, returned as base64 bytes with a size limit. They are NEVER unpickled
  here: the controller reads them with a restricted unpickler;
- the environment of live worker processes (a hung job is still running): only the rank and device variables, never
  anything else of a process's environment.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import datetime
import glob
import gzip
import io
import os
import re

from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import (
    journal_record,
    open_log,
    parse_since,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool
from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_watchdog import parse_torch_lines

MAX_FILES = 256
ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
            "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")
_RANK_SUFFIX = re.compile(r"^(\d{1,7})$")
# journalctl --grep (PCRE2, systemd >= 237): the lines torch_watchdog can use, including the elastic summary block.
JOURNAL_GREP = (r"atchdog|WorkNCCL|Timed out waiting|last enqueued|terminate called|what\(\)|exitcode|Failures:|"
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


def _lines(fh, skip, limit):
    if skip:
        fh.seek(skip)
        fh.readline()  # the first line is cut: drop it
    text = io.TextIOWrapper(fh, encoding="utf-8", errors="replace")  # decoded in large chunks, not line by line
    read = 0
    for line in text:
        read += len(line)
        if read > limit:
            return
        yield line


def read_log_file(path, since=None, until=None, max_bytes=2 * 1024 ** 3, world_size=None):
    """One log file parsed by torch_watchdog. Never raises: problems are in `error` and `notes`."""
    out = {"source": "file", "path": path, "unit": None, "bytes": None, "mtime": None, "notes": [], "error": None,
           "parsed": None}
    try:
        st = os.stat(path)
        out["bytes"], out["mtime"] = st.st_size, st.st_mtime
        with open_log(path) as fh:
            skip = 0
            if st.st_size > max_bytes and not isinstance(fh, gzip.GzipFile):
                skip = st.st_size - max_bytes  # the end of the log is where the job died
                out["notes"].append("%s is %d bytes: only its last %d bytes were read" % (path, st.st_size, max_bytes))
            out["parsed"] = parse_torch_lines(_lines(fh, skip, max_bytes), world_size=world_size, since=since,
                                              until=until, reference=st.st_mtime)
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

    out["parsed"] = parse_torch_lines(lines(), world_size=world_size, since=since, until=until)
    return out


def collect_dumps(prefixes, max_bytes, max_total, since=None):
    """Dump files <prefix><rank>: metadata for all, bytes (base64) for those within the limits and the window."""
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
            if not match or path in seen or not os.path.isfile(path):
                continue
            seen.add(path)
            item = {"path": path, "prefix": prefix, "rank": int(match.group(1)), "bytes": None, "mtime": None,
                    "data_b64": None, "skipped": None, "error": None}
            dumps.append(item)
            try:
                st = os.stat(path)
                item["bytes"], item["mtime"] = st.st_size, st.st_mtime
                if since is not None and st.st_mtime < since:
                    item["skipped"] = "written before the window (%s): an older job's dump" % int(st.st_mtime)
                    continue
                if st.st_size > max_bytes:
                    item["skipped"] = ("%d bytes, over max_dump_bytes=%d: not sent (raise the limit)"
                                       % (st.st_size, max_bytes))
                    continue
                if total + st.st_size > max_total:
                    item["skipped"] = ("the dumps of this node exceed max_dumps_total_bytes=%d: not sent" % max_total)
                    continue
                with open(path, "rb") as fh:
                    data = fh.read(max_bytes + 1)
                if len(data) > max_bytes:
                    item["skipped"] = "grew over max_dump_bytes while being read: not sent"
                    continue
                total += len(data)
                item["data_b64"] = base64.b64encode(data).decode("ascii")
            except (IOError, OSError) as exc:
                item["error"] = ("cannot read %s: %s. Fix: run with become: true (the dump belongs to the job's user)"
                                 % (path, getattr(exc, "strerror", None) or exc))
    return dumps, notes


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
