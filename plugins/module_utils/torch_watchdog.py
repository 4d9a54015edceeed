# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parser for PyTorch distributed failure output: NCCL watchdog, torchrun/elastic summary, CUDA OOM (stdlib only).

docs/signals.md section 6. Line prefixes change with nearly every PyTorch release, so every pattern searches for the stable
substring anywhere in the line and reads the rank from whichever prefix is present:
  [E ProcessGroupNCCL.cpp:458] [Rank 0] ...                                 (<= 2.3, no time)
  [rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] ... (2.2+; month not zero-padded: E321)
  ... [PG 1 Rank 0] ... / [PG ID 0 PG GUID 0(default_pg) Rank 1] ...       (2.4+ / 2.5+)
  [default3]:...  (torchrun --tee, local rank) ; "(WorkerDict pid=1) " / "[80746] " (Ray, log shippers)
A timeout is read from every form it takes, and each distinct event is recorded once:
  Watchdog caught collective operation timeout: WorkNCCL(SeqNum=N, OpType=OP[, NumelIn=N, NumelOut=N],
      Timeout(ms)=N) ran for N milliseconds before timing out.        (torch 1.x: WorkNCCL(OpType=OP, Timeout(ms)=N))
  ... NCCL watchdog thread terminated with exception: <the same message>   (the only line some versions print)
  terminate called after throwing an instance of '...' / what():  <the same message>   (the abort message)
  Work WorkNCCL(...) timed out in blocking wait.                          (TORCH_NCCL_BLOCKING_WAIT=1)
  Timed out waiting Nms for recv operation                                 (gloo: no watchdog, the op raises)
Heartbeat-monitor kills (`Heartbeat monitor timed out!`, `watchdog got stuck for N seconds without making progress`)
are recorded per rank and process group. Lines carry a time where the prefix gives one (glog `EMMDD hh:mm:ss.f`, ISO
8601, the elastic summary's `time : YYYY-MM-DD_hh:mm:ss`); glog has no year, taken from `reference` (the log file's
mtime). A line without a time inherits the last time seen, so `since`/`until` keep one job out of another's log.
The rank that REPORTS a timeout is rarely the culprit: find_culprit() names the rank whose last completed (then
enqueued) sequence is lowest within the process group, a rank that ran a different collective at the same sequence,
or a rank that never reported at all.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import time

OOM_REMEDIES = (
    "reduce the micro-batch size (or sequence length) per GPU",
    "enable gradient (activation) checkpointing",
    "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against allocator fragmentation",
    "check for a neighbour process on the same GPU (nvidia-smi shows two PIDs): stop the one that should be gone",
    "shard optimizer state (ZeRO/FSDP); a bigger GPU does not fix a growing activation footprint",
)

_MAX_SAMPLES = 5
_MAX_TRACEBACK_LINES = 20
_MAX_EVENTS = 5000  # per list: a log of a long-hung job can repeat the same lines for hours

# How a process that aborts without a C++ exception says why (glibc, CPython, assert(3), the c10/glog signal handler).
_ABORT_MARKERS = (r"Fatal Python error|double free|corrupted (?:size|double-linked)|free\(\): invalid|malloc\(\)|"
                  r"Assertion [`'].*' failed|\*\*\* Aborted at|\*\*\* SIG[A-Z]+ |Aborted \(core dumped\)")
_ABORT = re.compile(_ABORT_MARKERS)

# Lines that can matter; everything else (loss prints, progress bars) is skipped before any other regex runs.
_KEYWORDS = re.compile(r"atchdog|WorkNCCL|Timed out waiting|last enqueued|terminate called|what\(\)|failed \(exitcode|"
                       r"out of memory|OutOfMemory|(?:Error|Exception|Interrupt|Exit)(?::|\s*$)|Failures:|Root Cause|"
                       r"Heartbeat|between collectives|\]:\[rank|" + _ABORT_MARKERS)



def _maybe(line):
    return ("Error" in line or "Exception" in line or "atchdog" in line or "WorkNCCL" in line or "]:[rank" in line
            or "Timed out" in line or "enqueued" in line or "terminate" in line or "what()" in line or "exitcode" in line
            or "memory" in line or "Failures:" in line or "Root Cause" in line or "Heartbeat" in line
            or "collectives" in line or "Interrupt" in line or "Exit" in line or "Fatal" in line or "free" in line
            or "malloc" in line or "Assertion" in line or "***" in line or "Aborted" in line)


_RANK_PREFIX = re.compile(r"\[rank(?P<rank>\d+)\]:")
_PG_RANK = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)(?P<rest>[^\]]*?)\s*Rank (?P<rank>\d+)\]")
_PG_DESC = re.compile(r"\((?P<desc>[^()]*)\)")
_PLAIN_RANK = re.compile(r"\[Rank (?P<rank>\d+)\]")
_LOCAL_PREFIX = re.compile(r"\[(?P<role>[A-Za-z_][\w-]*?)(?P<local>\d+)\]:")
_LOCAL_AND_GLOBAL = re.compile(r"^\s*\[(?P<role>[A-Za-z_][\w-]*?)(?P<local>\d+)\]:\[rank(?P<rank>\d+)\]:")

# Times: c10/glog "[E1206 18:44:12.715298746 " (month not zero-padded by c10: "E321"), python glog "E1206 18:44:21.4560
# 00 140211 ", ISO 8601 from log shippers, the elastic summary "time      : 2024-12-06_18:44:20".
_GLOG_TIME = re.compile(r"(?:^|[\[\s:])[IWEF](?P<md>\d{3,4}) (?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})(?:\.(?P<f>\d{1,9}))?\s")
_ISO_TIME = re.compile(r"^\s*\[?(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})[T _](?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})"
                       r"(?:[.,](?P<f>\d{1,9}))?(?P<tz>Z|[+-]\d{2}:?\d{2})?")

_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\((?P<body>.*?)\) ran for (?P<ran>\d+) milli")
_BLOCKING = re.compile(r"Work WorkNCCL\((?P<body>.*?)\) timed out in blocking wait")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (?P<ms>\d+)ms for (?P<op>recv|send) operation")
_SEQ = re.compile(r"SeqNum=(\d+)")
_OPTYPE = re.compile(r"OpType=([A-Za-z_0-9]+)")
_NUMEL_IN = re.compile(r"NumelIn=(\d+)")
_NUMEL_OUT = re.compile(r"NumelOut=(\d+)")
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")
_PG_STATUS = re.compile(r"last enqueued (?:NCCL )?work: (?P<enq>-?\d+), last completed (?:NCCL )?work: (?P<comp>-?\d+)")
_FAILED_SEQ = re.compile(r"(?:work sequence id|at NCCL work|at work): (?P<seq>-?\d+)")
_HEARTBEAT = re.compile(r"Heartbeat monitor timed out!(?:.*?workMetaList_\.size\(\)\s*=\s*(?P<pending>\d+))?")
_STUCK = re.compile(r"watchdog got stuck for (?P<s>\d+) seconds without making progress")
_HANG_KILL = re.compile(r"Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL watchdog hang")
_DESYNC = re.compile(r"Rank (?P<ra>\d+) is running (?:collective|inconsistent collective): CollectiveFingerPrint\((?P<a>.*?)\)"
                     r", but Rank (?P<rb>\d+) is running (?:collective|inconsistent collective): "
                     r"CollectiveFingerPrint\((?P<b>[^)]*)")
_TERMINATE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'")
_WHAT = re.compile(r"what\(\):\s*(?P<what>.*)$")
_AGENT_FAILED = re.compile(r"failed \(exitcode: (?P<exit>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)")
_SUMMARY_START = re.compile(r"^\s*(?:Failures:|Root Cause \(first observed failure\):)\s*$")
_SUMMARY_RECORD = re.compile(r"^\s*\[(?P<idx>\d+)\]:\s*$")
_SUMMARY_FIELD = re.compile(r"^\s{0,4}(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_SUMMARY_RANK = re.compile(r"(?P<rank>-?\d+)(?:\s*\(local_rank:\s*(?P<local>-?\d+)\))?")
_SUMMARY_EXIT = re.compile(r"(?P<exit>-?\d+)(?:\s*\(pid:\s*(?P<pid>\d+)\))?")
_SIGNAL = re.compile(r"Signal (?P<num>\d+) \((?P<name>SIG\w+)\)")
# The message, not a source line of a traceback (`raise torch.OutOfMemoryError(` has no colon after the name).
_OOM = re.compile(r"(?:OutOfMemoryError:|CUDA out of memory|CUDA error: out of memory)")
_SIZE = r"(?P<{0}>\d+(?:\.\d+)?)\s*(?P<{0}_unit>[KMGT]i?B|bytes)"
_OOM_TRIED = re.compile(r"Tried to allocate " + _SIZE.format("v"))
_OOM_GPU = re.compile(r"GPU (?P<gpu>\d+)")
_OOM_TOTAL = re.compile(r"(?:total capacity of " + _SIZE.format("v") + r"|" + _SIZE.format("w") + r" total capacity)")
_OOM_FREE = re.compile(r"(?:of which " + _SIZE.format("v") + r" is free|" + _SIZE.format("w") + r" free)")
_OOM_PROCESS = re.compile(r"Process (?P<pid>\d+) has " + _SIZE.format("v") + r" memory in use")
_OOM_THIS = re.compile(r"this process has " + _SIZE.format("v") + r" memory in use")
_EXCEPTION = re.compile(
    r"^(?:.*?\]:\s?)?(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit))(?::\s*(?P<msg>.*))?$")

_UNIT_MIB = {"bytes": 1.0 / (1024 * 1024), "KiB": 1.0 / 1024, "MiB": 1.0, "GiB": 1024.0, "TiB": 1024.0 * 1024,
             "KB": 1e3 / 1048576, "MB": 1e6 / 1048576, "GB": 1e9 / 1048576, "TB": 1e12 / 1048576}


def _mib(match, name):
    if not match or match.group(name) is None:
        return None
    return round(float(match.group(name)) * _UNIT_MIB.get(match.group(name + "_unit"), 1.0), 2)


def _size_mib(regex, line):
    match = regex.search(line)
    if not match:
        return None
    for name in ("v", "w"):
        if name in match.groupdict() and match.group(name) is not None:
            return _mib(match, name)
    return None


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def line_rank(line):
    """{rank, pg, pg_rank, pg_desc, local_rank} as far as this line's prefixes tell; values None when absent."""
    info = {"rank": None, "pg": None, "pg_rank": None, "pg_desc": None, "local_rank": None}
    match = _RANK_PREFIX.search(line)
    if match:
        info["rank"] = int(match.group("rank"))
    match = _PG_RANK.search(line)
    if match:
        info["pg"] = int(match.group("pg"))
        info["pg_rank"] = int(match.group("rank"))
        desc = _PG_DESC.search(match.group("rest") or "")
        info["pg_desc"] = desc.group("desc") if desc else None
    if info["rank"] is None:
        match = _PLAIN_RANK.search(line)
        if match:
            info["rank"] = int(match.group("rank"))
        elif info["pg_rank"] is not None:
            info["rank"] = info["pg_rank"]
    match = _LOCAL_PREFIX.match(line.lstrip())
    if match and match.group("role") not in ("rank", "PG", "E", "W", "I"):
        info["local_rank"] = int(match.group("local"))
        if info["rank"] is None:
            info["rank"] = info["local_rank"]
    return info


def _year_for(month, day, reference):
    """glog prints no year: the reference's year, or the year before when that date lies after the reference."""
    ref = time.localtime(reference)
    return ref.tm_year - 1 if (month, day) > (ref.tm_mon, ref.tm_mday + 1) else ref.tm_year


def _epoch_local(year, month, day, hour, minute, second, frac):
    try:
        base = time.mktime((year, month, day, hour, minute, second, 0, 0, -1))
    except (OverflowError, ValueError):
        return None
    return base + (float("0." + frac) if frac else 0.0)


def line_time(line, reference=None):
    """Epoch seconds of a line from its prefix (node-local time for glog and zone-less ISO), or None."""
    match = _ISO_TIME.match(line)
    if match:
        g = match.groupdict()
        try:
            fields = [int(g[k]) for k in ("y", "mo", "d", "h", "m", "s")]
        except ValueError:
            return None
        if not (1 <= fields[1] <= 12 and 1 <= fields[2] <= 31):
            return None
        tz = g["tz"]
        if tz is None:
            return _epoch_local(fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], g["f"])
        import calendar
        sign = -1 if tz[0] == "-" else 1
        offset = 0 if tz == "Z" else sign * (int(tz[1:3]) * 3600 + int(tz.replace(":", "")[3:5]) * 60)
        try:
            base = calendar.timegm((fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], 0, 0, 0))
        except (OverflowError, ValueError):
            return None
        return base - offset + (float("0." + g["f"]) if g["f"] else 0.0)
    match = _GLOG_TIME.search(line[:120])
    if match:
        md = match.group("md")
        month, day = int(md[:-2]), int(md[-2:])
        if not (1 <= month <= 12 and 1 <= day <= 31):
            return None
        ref = reference if reference is not None else time.time()
        return _epoch_local(_year_for(month, day, ref), month, day, int(match.group("h")), int(match.group("m")),
                            int(match.group("s")), match.group("f"))
    return None


def _summary_time(value):
    match = re.match(r"^(\d{4})-(\d{2})-(\d{2})_(\d{2}):(\d{2}):(\d{2})$", value.strip())
    if not match:
        return None
    return _epoch_local(*[int(x) for x in match.groups()], frac=None)


def _empty():
    return {
        "timeouts": [],
        "pg_status": [],
        "heartbeat_kills": [],
        "desync": [],
        "culprit": None,
        "culprit_rank": None,
        "silent_ranks": [],
        "terminate": [],
        "agent_failures": [],
        "elastic_summary": {"failures": [], "root_cause": None},
        "oom": [],
        "exceptions": [],
        "ranks_reporting": [],
        "local_ranks": {},
        "root_cause": None,
        "lines_read": 0,
        "lines_outside_window": 0,
        "time_first": None,
        "time_last": None,
        "evidence": [],
        "unparsed": {"count": 0, "samples": []},
    }


def _parse_oom(line, who, when):
    processes = [{"pid": int(m.group("pid")), "used_mib": _mib(m, "v")} for m in _OOM_PROCESS.finditer(line)]
    gpu = _OOM_GPU.search(line)
    total, free, this = _size_mib(_OOM_TOTAL, line), _size_mib(_OOM_FREE, line), _size_mib(_OOM_THIS, line)
    # Memory neither free nor ours: another process (or a leaked context) holds it.
    others = round(total - free - this, 2) if None not in (total, free, this) else None
    return {
        "rank": who["rank"],
        "gpu": int(gpu.group("gpu")) if gpu else None,
        "tried_to_allocate_mib": _size_mib(_OOM_TRIED, line),
        "total_capacity_mib": total,
        "free_mib": free,
        "this_process_used_mib": this,
        "other_processes_mib": others,
        "processes": processes,
        # Two or more processes on the GPU, or > 1 GiB held by someone else: a neighbour that should be gone.
        "neighbour_suspected": len(processes) > 1 or (others is not None and others > 1024),
        "time": when,
        "line": line.strip()[:1000],
    }


def _detail(oom):
    return sum(1 for k in ("gpu", "tried_to_allocate_mib", "total_capacity_mib", "free_mib") if oom[k] is not None) \
        + len(oom["processes"])


def _summary_record(section):
    return {"section": section, "time": None, "host": None, "rank": None, "local_rank": None, "exitcode": None,
            "pid": None, "signal": None, "error_file": None, "traceback": []}


def _apply_summary_field(record, key, value):
    value = value.strip()
    if key == "rank":
        match = _SUMMARY_RANK.match(value)
        if match:
            record["rank"] = _int(match.group("rank"))
            record["local_rank"] = _int(match.group("local"))
    elif key == "exitcode":
        match = _SUMMARY_EXIT.match(value)
        if match:
            record["exitcode"] = _int(match.group("exit"))
            record["pid"] = _int(match.group("pid"))
            if record["exitcode"] is not None and record["exitcode"] < 0:
                record["signal"] = -record["exitcode"]
    elif key == "error_file":
        record["error_file"] = None if value in ("<N/A>", "") else value
    elif key == "traceback":
        if value:
            record["traceback"].append(value)
        sig = _SIGNAL.search(value)
        if sig:
            record["signal"] = int(sig.group("num"))
    else:
        record[key] = value or None


def _work_fields(body):
    seq, op = _SEQ.search(body), _OPTYPE.search(body)
    nin, nout, tmo = _NUMEL_IN.search(body), _NUMEL_OUT.search(body), _TIMEOUT_MS.search(body)
    return {"seq": int(seq.group(1)) if seq else None, "op_type": op.group(1) if op else None,
            "numel_in": int(nin.group(1)) if nin else None, "numel_out": int(nout.group(1)) if nout else None,
            "timeout_ms": int(tmo.group(1)) if tmo else None}


class _Parser:
    """One stream of log lines (a file, a journal unit): a small state machine for the elastic summary block."""

    def __init__(self, since, until, reference):
        self.result = _empty()
        self.since, self.until, self.reference = since, until, reference
        self.reporting = set()
        self.in_summary = False
        self.section = None
        self.record = None
        self.traceback_open = False
        self.exceptions_seen = set()
        self.timeout_keys = {}
        self.kill_keys = {}
        self.when = None  # the last time seen (lines without a time inherit it)
        self.fatal_frame = False  # after "Fatal Python error": the next "File ..." line is where the rank aborted

    # ---- helpers ------------------------------------------------------------------------------------------------
    def evidence(self, line):
        line = line.rstrip()
        ev = self.result["evidence"]
        if line and len(ev) < 40 and line[:500] not in ev:
            ev.append(line[:500])

    def unparsed(self, line, reason):
        self.result["unparsed"]["count"] += 1
        if len(self.result["unparsed"]["samples"]) < _MAX_SAMPLES:
            self.result["unparsed"]["samples"].append({"line": line[:300], "reason": reason})

    def _append(self, key, item):
        if len(self.result[key]) < _MAX_EVENTS:
            self.result[key].append(item)

    def _stamp(self, when):
        if when is None:
            return
        self.when = when
        r = self.result
        r["time_first"] = when if r["time_first"] is None else min(r["time_first"], when)
        r["time_last"] = when if r["time_last"] is None else max(r["time_last"], when)

    # ---- one line -----------------------------------------------------------------------------------------------
    def feed(self, raw, when=None):
        self.result["lines_read"] += 1
        line = raw.rstrip("\r\n")
        if self.fatal_frame and line.strip() and not line.startswith(("Current thread", "Thread 0x")):
            self.fatal_frame = False  # the frame, or whatever came instead: never a later traceback's frame
            if line.lstrip().startswith("File "):
                self.evidence(line)
                return
        # Plain substring tests first (C speed), the exact keyword regex only on the few lines that pass them.
        if not self.in_summary and not (_maybe(line) and _KEYWORDS.search(line)):
            return
        stripped = line.strip()
        if not stripped:
            return
        own = when if when is not None else line_time(line, self.reference)
        if own is not None:
            self.when = own
        current = own if own is not None else self.when
        if current is not None and ((self.since is not None and current < self.since)
                                    or (self.until is not None and current > self.until)):
            self.result["lines_outside_window"] += 1
            return
        self._stamp(own)
        if self._summary(line, stripped):
            return
        both = _LOCAL_AND_GLOBAL.match(line)
        if both and both.group("role") not in ("rank", "PG"):
            self.result["local_ranks"][int(both.group("rank"))] = int(both.group("local"))
        self._events(line, stripped, line_rank(line), current)

    def _summary(self, line, stripped):
        """The elastic agent's end-of-run summary (a block of "key : value" records). True when the line was used."""
        es = self.result["elastic_summary"]
        if _SUMMARY_START.match(line):
            self.in_summary = True
            self.section = "root_cause" if "Root Cause" in line else "failures"
            self.record = None
            self.traceback_open = False
            self.evidence(line)
            return True
        if not self.in_summary:
            return False
        if _SUMMARY_RECORD.match(line):
            self.record = _summary_record(self.section)
            if self.section == "root_cause":
                es["root_cause"] = self.record
            elif len(es["failures"]) < _MAX_EVENTS:
                es["failures"].append(self.record)
            self.traceback_open = False
            return True
        if set(stripped) <= set("=-"):
            self.traceback_open = False
            if set(stripped) == {"="}:
                self.in_summary = False
            return True
        if stripped == "<NO_OTHER_FAILURES>":
            return True
        field = _SUMMARY_FIELD.match(line)
        if field and self.record is not None:
            _apply_summary_field(self.record, field.group("key"), field.group("value"))
            if field.group("key") == "time":
                self._stamp(_summary_time(field.group("value")))
            self.traceback_open = field.group("key") == "traceback"
            self.evidence(line)
            return True
        if self.traceback_open and self.record is not None:
            if len(self.record["traceback"]) < _MAX_TRACEBACK_LINES:
                self.record["traceback"].append(stripped)
            if _EXCEPTION.match(stripped):  # the last traceback line is the exception: keep it as evidence
                self.evidence(line)
            return True
        if self.record is not None:
            self.unparsed(line, "unexpected line inside the elastic failure summary")
            return True
        self.in_summary = False  # text between "Failures:" and a record that is not one: not a summary after all
        return False

    def _timeout(self, who, fields, ran_for, form, backend, line, when):
        """Record a timeout once: the watchdog line, the thread-exit line and what() restate the same event."""
        rank = who["rank"]
        exact = (rank, fields["seq"], fields["op_type"], fields["numel_in"], fields["numel_out"], fields["timeout_ms"])
        previous = self.timeout_keys.get(exact)
        if previous is not None and (previous["ran_for_ms"] in (None, ran_for) or ran_for is None):
            if previous["ran_for_ms"] is None and ran_for is not None:
                previous["ran_for_ms"] = ran_for  # a blocking-wait line first, then the watchdog's figure
            if previous["pg"] is None and who["pg"] is not None:
                previous["pg"] = who["pg"]
            return
        event = {"rank": rank, "pg": who["pg"], "ran_for_ms": ran_for, "backend": backend, "form": form,
                 "time": when, "line": line.strip()[:500]}
        event.update(fields)
        self.timeout_keys[exact] = event
        self._append("timeouts", event)
        if rank is not None:
            self.reporting.add(rank)

    def _kill(self, who, kind, line, when, stuck_s=None, pending=None):
        key = (who["rank"], who["pg"])
        kill = self.kill_keys.get(key)
        if kill is None:
            kill = {"rank": who["rank"], "pg": who["pg"], "pg_rank": who["pg_rank"], "pg_desc": who["pg_desc"],
                    "signals": [], "stuck_s": None, "pending_work": None, "time": when, "line": line.strip()[:500]}
            self.kill_keys[key] = kill
            self._append("heartbeat_kills", kill)
        if kind not in kill["signals"]:
            kill["signals"].append(kind)
        if stuck_s is not None:
            kill["stuck_s"] = stuck_s
        if pending is not None:
            kill["pending_work"] = pending

    def _events(self, line, stripped, who, when):
        r = self.result
        match = _WHAT.search(line)
        if match:
            term = r["terminate"][-1] if r["terminate"] else None
            if term is not None and term["what"] is None:
                term["what"] = match.group("what").strip()[:500]
                if term["rank"] is None:
                    term["rank"] = who["rank"]
            self.evidence(line)
            # The abort message can be the only place a timeout is printed: read it, then nothing else of the line.
            timeout = _TIMEOUT.search(line)
            if timeout:
                self._timeout(who, _work_fields(timeout.group("body")), int(timeout.group("ran")), "abort_message",
                              "nccl", stripped, when)
            return

        for regex, form in ((_TIMEOUT, None), (_BLOCKING, "blocking_wait")):
            match = regex.search(line)
            if match:
                if form is None:
                    form = "abort_message" if "terminated with exception" in line else "watchdog"
                ran = int(match.group("ran")) if form != "blocking_wait" else None
                self._timeout(who, _work_fields(match.group("body")), ran, form, "nccl", stripped, when)
                self.evidence(line)
                return

        match = _GLOO_TIMEOUT.search(line)
        if match:
            # gloo has no watchdog: the waiting rank's collective raises instead. Same meaning for the culprit hunt.
            fields = {"seq": None, "op_type": match.group("op").upper(), "numel_in": None, "numel_out": None,
                      "timeout_ms": int(match.group("ms"))}
            self._timeout(who, fields, None, "gloo", "gloo", stripped, when)
            self.evidence(line)
            # no return: the same line is that rank's exception (RuntimeError: ... Timed out waiting ...)

        match = _PG_STATUS.search(line)
        if match:
            failed = _FAILED_SEQ.search(line[:match.start()])
            self._append("pg_status", {
                "rank": who["rank"], "pg": who["pg"], "pg_rank": who["pg_rank"], "pg_desc": who["pg_desc"],
                "failed_seq": int(failed.group("seq")) if failed else None,
                "last_enqueued": int(match.group("enq")), "last_completed": int(match.group("comp")),
                "time": when, "line": stripped[:500]})
            if who["rank"] is not None:
                self.reporting.add(who["rank"])
            self.evidence(line)
            return

        match = _HEARTBEAT.search(line)
        if match:
            self._kill(who, "heartbeat_timeout", line, when, pending=_int(match.group("pending")))
            self.evidence(line)
            return
        match = _STUCK.search(line)
        if match:
            self._kill(who, "watchdog_stuck", line, when, stuck_s=int(match.group("s")))
            self.evidence(line)
            return
        if _HANG_KILL.search(line):
            self._kill(who, "terminated_after_hang", line, when)
            self.evidence(line)
            return

        match = _DESYNC.search(line)
        if match:
            self._append("desync", {
                "rank_a": int(match.group("ra")), "collective_a": match.group("a")[:300],
                "rank_b": int(match.group("rb")), "collective_b": match.group("b")[:300],
                "op_a": (_OPTYPE.search(match.group("a")) or [None, None])[1],
                "op_b": (_OPTYPE.search(match.group("b")) or [None, None])[1],
                "time": when, "line": stripped[:500]})
            self.evidence(line)
            # no return: the same line is a RuntimeError

        if _ABORT.search(line):  # the only word on why a rank aborted when no C++ exception was thrown
            self.fatal_frame = self.fatal_frame or "Fatal Python error" in line
            self.evidence(line)
            return
        match = _TERMINATE.search(line)
        if match:
            self._append("terminate", {"rank": who["rank"], "exception": match.group("type"), "what": None,
                                       "time": when, "line": stripped[:500]})
            self.evidence(line)
            return
        match = _AGENT_FAILED.search(line)
        if match:
            exitcode = int(match.group("exit"))
            self._append("agent_failures", {"local_rank": int(match.group("local")), "pid": int(match.group("pid")),
                                            "exitcode": exitcode, "signal": -exitcode if exitcode < 0 else None,
                                            "time": when, "line": stripped[:500]})
            self.evidence(line)
            return

        if _OOM.search(line):
            oom = _parse_oom(line, who, when)
            same = [o for o in r["oom"] if o["rank"] == oom["rank"] and o["gpu"] in (oom["gpu"], None)
                    and o["tried_to_allocate_mib"] in (oom["tried_to_allocate_mib"], None)]
            if same:  # the same OOM restated (exception chain, logger): keep the more detailed record
                if _detail(oom) > _detail(same[0]):
                    r["oom"][r["oom"].index(same[0])] = oom
            else:
                self._append("oom", oom)
            self.evidence(line)
            # no return: the OOM line is also that rank's exception

        match = _EXCEPTION.match(stripped)
        if match and not stripped.startswith(("File ", "Traceback")):
            key = (who["rank"], match.group("type"), (match.group("msg") or "")[:200])
            if key not in self.exceptions_seen and len(r["exceptions"]) < 50:
                self.exceptions_seen.add(key)
                r["exceptions"].append({"rank": who["rank"], "type": match.group("type"),
                                        "message": (match.group("msg") or "").strip()[:500], "line": stripped[:500]})
                self.evidence(line)

    def finish(self, world_size):
        r = self.result
        r["ranks_reporting"] = sorted(self.reporting)
        culprit, silent = find_culprit(r["pg_status"], r["timeouts"], r["ranks_reporting"], world_size)
        r["culprit"], r["silent_ranks"] = culprit, silent
        r["culprit_rank"] = culprit["rank"] if culprit else None
        r["root_cause"] = _root_cause(r)
        return r


def parse_torch_lines(lines, world_size=None, since=None, until=None, reference=None):
    """Parse one stream of torchrun/worker output. Never raises.

    lines: an iterable of str, or of (str, epoch) pairs when the source knows each line's time (journald).
    world_size: when known, ranks that never appear in any watchdog line are listed in silent_ranks (a rank that
    never reached the collective prints nothing about it).
    since/until: epoch seconds; lines whose time (own or inherited) lies outside are skipped and counted.
    reference: epoch near the end of the log (the file's mtime), for the year glog times do not print.
    """
    parser = _Parser(since, until, reference)
    skipped = 0
    for item in lines:
        if type(item) is str:
            # The common case, inlined: most lines of a training log carry none of the keywords.
            if not parser.in_summary and not parser.fatal_frame and not _maybe(item):
                skipped += 1
                continue
            text, when = item, None
        elif isinstance(item, tuple):
            text, when = item[0], item[1]
        else:
            text, when = item, None
        if not isinstance(text, str):
            parser.unparsed(repr(text)[:300], "not text")
            continue
        parser.feed(text, when)
    parser.result["lines_read"] += skipped
    return parser.finish(world_size)


def parse_torch_log(text, world_size=None, since=None, until=None, reference=None):
    """Parse combined torchrun/worker output (one text). Never raises. See parse_torch_lines()."""
    if not isinstance(text, str):
        result = parse_torch_lines([], world_size)
        result["unparsed"] = {"count": 1, "samples": [{"line": repr(text)[:300], "reason": "not text"}]}
        return result
    return parse_torch_lines(text.splitlines(), world_size, since, until, reference)


def _root_cause(result):
    """The first failure as the elastic agent saw it, joined with that rank's exception (if it printed one).

    This is the rank that DIED first, not necessarily the culprit of a hang (see culprit).
    """
    rc = result["elastic_summary"]["root_cause"]
    if rc is None and result["agent_failures"]:
        first = result["agent_failures"][0]
        rc = {"rank": None, "local_rank": first["local_rank"], "exitcode": first["exitcode"],
              "signal": first["signal"]}
    if rc is None:
        return None
    rank = rc.get("rank") if rc.get("rank") is not None else rc.get("local_rank")
    exception = None
    for exc in result["exceptions"]:
        if exc["rank"] == rank:
            exception = exc  # the last exception a rank printed is the one that killed it
    return {"rank": rank, "local_rank": rc.get("local_rank"), "exitcode": rc.get("exitcode"),
            "signal": rc.get("signal"),
            "exception": {"type": exception["type"], "message": exception["message"]} if exception else None}


def _status_culprit(pg_status):
    """The rank behind the others in a process group, from the watchdog's PG status lines (2.4+)."""
    latest = {}
    for status in pg_status:
        if status.get("rank") is not None:
            latest[(status.get("pg"), status["rank"])] = status  # the watchdog can print several lines per work
    by_pg = {}
    for (pg, _rank), status in latest.items():
        by_pg.setdefault(pg, []).append(status)
    best = None
    for pg, statuses in by_pg.items():
        if len(statuses) < 2:
            continue
        statuses.sort(key=lambda s: (s["last_completed"], s["last_enqueued"], s["rank"]))
        low, high = statuses[0], statuses[-1]
        failed_seqs = [s["failed_seq"] for s in statuses if s.get("failed_seq") is not None]
        failed = max(failed_seqs) if failed_seqs else None
        never_enqueued = [s for s in statuses if failed is not None and s["last_enqueued"] < failed]
        if never_enqueued:
            pick = sorted(never_enqueued, key=lambda s: (s["last_enqueued"], s["rank"]))[0]
            reason = ("rank %d never enqueued work %d that the other ranks of PG %s wait on (last enqueued %d)"
                      % (pick["rank"], failed, pg, pick["last_enqueued"]))
        elif (low["last_completed"], low["last_enqueued"]) < (high["last_completed"], high["last_enqueued"]) and \
                (low["last_completed"], low["last_enqueued"]) < (statuses[1]["last_completed"],
                                                                 statuses[1]["last_enqueued"]):
            pick = low
            reason = ("rank %d is behind the others in PG %s: last completed %d, last enqueued %d"
                      % (pick["rank"], pg, pick["last_completed"], pick["last_enqueued"]))
        else:
            continue
        candidate = {"rank": pick["rank"], "pg": pg, "last_completed": pick["last_completed"],
                     "last_enqueued": pick["last_enqueued"], "reason": reason, "line": pick.get("line"),
                     "basis": "pg_status"}
        if best is None or (candidate["last_completed"], candidate["rank"]) < (best["last_completed"], best["rank"]):
            best = candidate
    return best


def _op_mismatch_culprit(timeouts):
    """Ranks that timed out on the same sequence with a different collective: the odd one out ran other code."""
    by_seq = {}
    for tmo in timeouts:
        if tmo.get("rank") is not None and tmo.get("seq") is not None and tmo.get("op_type"):
            by_seq.setdefault(tmo["seq"], {}).setdefault(tmo["op_type"], set()).add(tmo["rank"])
    for seq in sorted(by_seq):
        ops = by_seq[seq]
        if len(ops) < 2:
            continue
        ranked = sorted(ops.items(), key=lambda kv: (len(kv[1]), kv[0]))
        odd_op, odd_ranks = ranked[0]
        major_op, major_ranks = ranked[-1]
        if len(odd_ranks) == len(major_ranks):
            continue  # no majority: nothing says which side is wrong
        rank = min(odd_ranks)
        line = next((t["line"] for t in timeouts if t.get("rank") == rank and t.get("seq") == seq), None)
        return {"rank": rank, "pg": None, "last_completed": None, "last_enqueued": None, "line": line,
                "basis": "op_mismatch",
                "reason": "rank %d ran %s at sequence %d while rank(s) %s ran %s: mismatched collective"
                          % (rank, odd_op, seq, ",".join(str(x) for x in sorted(major_ranks)[:8]), major_op)}
    return None


def find_culprit(pg_status, timeouts, ranks_reporting, world_size=None):
    """(culprit or None, silent_ranks) from watchdog evidence, possibly merged from several nodes. Pure, never raises.

    Order: a rank behind in its process group (PG status lines), a rank that ran a different collective at the same
    sequence, a rank of the world that reported nothing while others timed out, a rank that timed out on an earlier
    sequence than every other rank (<= 2.3 logs have no PG status).
    """
    reporting = set(r for r in ranks_reporting or [] if isinstance(r, int))
    silent = []
    if isinstance(world_size, int) and not isinstance(world_size, bool) and 0 < world_size <= 100000 and \
            (timeouts or pg_status):
        silent = [r for r in range(world_size) if r not in reporting]
    try:
        best = _status_culprit(pg_status or [])
        if best is None:
            best = _op_mismatch_culprit(timeouts or [])
    except (KeyError, TypeError, ValueError):
        best = None
    if best is None and silent and reporting:
        rank = silent[0]
        best = {"rank": rank, "pg": None, "last_completed": None, "last_enqueued": None, "line": None,
                "basis": "silent",
                "reason": "rank %d reported no timeout while rank(s) %s timed out waiting: it never reached the "
                          "collective" % (rank, ",".join(str(r) for r in sorted(reporting)[:16]))}
    if best is None:
        seqs = {}
        for tmo in timeouts or []:
            if isinstance(tmo.get("rank"), int) and isinstance(tmo.get("seq"), int):
                seqs[tmo["rank"]] = min(tmo["seq"], seqs.get(tmo["rank"], tmo["seq"]))
        if len(seqs) >= 2:
            ordered = sorted(seqs.items(), key=lambda kv: (kv[1], kv[0]))
            if ordered[0][1] < ordered[1][1]:
                rank, seq = ordered[0]
                best = {"rank": rank, "pg": None, "last_completed": None, "last_enqueued": None, "line": None,
                        "basis": "earlier_seq",
                        "reason": "rank %d timed out on sequence %d, earlier than every other rank" % (rank, seq)}
    return best, silent
