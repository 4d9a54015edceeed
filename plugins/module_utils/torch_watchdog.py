# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parser for PyTorch distributed failure output: NCCL watchdog, torchrun/elastic summary, CUDA OOM (stdlib only).

docs/signals.md section 6. Line prefixes change with nearly every PyTorch release, so every pattern searches for the stable
substring anywhere in the line and reads the rank from whichever prefix is present:
  [E ProcessGroupNCCL.cpp:458] [Rank 0] ...                                 (<= 2.1)
  [rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank 0] ... (2.2+)
  ... [PG 1 Rank 0] ... / [PG ID 0 PG GUID 0(default_pg) Rank 1] ...       (2.4+ / 2.5+)
  [default3]:...  (torchrun --tee, local rank) ; "(WorkerDict pid=1) " / "[80746] " (Ray, log shippers)
The rank that REPORTS a timeout is rarely the culprit: the culprit is the rank whose last completed (then enqueued)
sequence is lowest within the process group, or a rank that never reported at all.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

OOM_REMEDIES = (
    "reduce the micro-batch size (or sequence length) per GPU",
    "enable gradient (activation) checkpointing",
    "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against allocator fragmentation",
    "check for a neighbour process on the same GPU (nvidia-smi shows two PIDs): stop the one that should be gone",
    "shard optimizer state (ZeRO/FSDP); a bigger GPU does not fix a growing activation footprint",
)

_MAX_SAMPLES = 5
_MAX_TRACEBACK_LINES = 20

_RANK_PREFIX = re.compile(r"\[rank(?P<rank>\d+)\]:")
_PG_RANK = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)(?P<rest>[^\]]*?)\s*Rank (?P<rank>\d+)\]")
_PG_DESC = re.compile(r"\((?P<desc>[^()]*)\)")
_PLAIN_RANK = re.compile(r"\[Rank (?P<rank>\d+)\]")
_LOCAL_PREFIX = re.compile(r"\[(?P<role>[A-Za-z_][\w-]*?)(?P<local>\d+)\]:")

_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\((?P<body>.*?)\) ran for (?P<ran>\d+) milli")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (?P<ms>\d+)ms for (?P<op>recv|send) operation")
_SEQ = re.compile(r"SeqNum=(\d+)")
_OPTYPE = re.compile(r"OpType=([A-Za-z_0-9]+)")
_NUMEL_IN = re.compile(r"NumelIn=(\d+)")
_NUMEL_OUT = re.compile(r"NumelOut=(\d+)")
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")
_PG_STATUS = re.compile(r"last enqueued (?:NCCL )?work: (?P<enq>-?\d+), last completed (?:NCCL )?work: (?P<comp>-?\d+)")
_FAILED_SEQ = re.compile(r"(?:work sequence id|at NCCL work|at work): (?P<seq>-?\d+)")
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


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _empty():
    return {
        "timeouts": [],
        "pg_status": [],
        "culprit": None,
        "culprit_rank": None,
        "silent_ranks": [],
        "terminate": [],
        "agent_failures": [],
        "elastic_summary": {"failures": [], "root_cause": None},
        "oom": [],
        "exceptions": [],
        "ranks_reporting": [],
        "root_cause": None,
        "lines_read": 0,
        "evidence": [],
        "unparsed": {"count": 0, "samples": []},
    }


def _add_evidence(result, line):
    line = line.rstrip()
    if line and line not in result["evidence"] and len(result["evidence"]) < 40:
        result["evidence"].append(line[:500])


def _note_unparsed(result, line, reason):
    result["unparsed"]["count"] += 1
    if len(result["unparsed"]["samples"]) < _MAX_SAMPLES:
        result["unparsed"]["samples"].append({"line": line[:300], "reason": reason})


def _parse_oom(line, who):
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


def parse_torch_log(text, world_size=None):
    """Parse combined torchrun/worker output. Never raises.

    world_size: when known, ranks that never appear in any watchdog line are listed in silent_ranks (a rank that
    never reached the collective prints nothing about it).
    """
    result = _empty()
    if not isinstance(text, str):
        _note_unparsed(result, repr(text)[:300], "not text")
        return result
    reporting = set()
    in_summary = False
    section = None
    record = None
    traceback_open = False
    exceptions_seen = set()

    for raw in text.splitlines():
        result["lines_read"] += 1
        line = raw.rstrip("\r\n")
        stripped = line.strip()
        if not stripped:
            continue

        # ---- the elastic agent's end-of-run summary (a block of "key : value" records) ----
        if _SUMMARY_START.match(line):
            in_summary = True
            section = "root_cause" if "Root Cause" in line else "failures"
            record = None
            traceback_open = False
            _add_evidence(result, line)
            continue
        if in_summary:
            if _SUMMARY_RECORD.match(line):
                record = _summary_record(section)
                if section == "root_cause":
                    result["elastic_summary"]["root_cause"] = record
                else:
                    result["elastic_summary"]["failures"].append(record)
                traceback_open = False
                continue
            if set(stripped) <= set("=-"):
                traceback_open = False
                if set(stripped) == {"="}:
                    in_summary = False
                continue
            if stripped == "<NO_OTHER_FAILURES>":
                continue
            field = _SUMMARY_FIELD.match(line)
            if field and record is not None:
                _apply_summary_field(record, field.group("key"), field.group("value"))
                traceback_open = field.group("key") == "traceback"
                _add_evidence(result, line)
                continue
            if traceback_open and record is not None:
                if len(record["traceback"]) < _MAX_TRACEBACK_LINES:
                    record["traceback"].append(stripped)
                # The last traceback line is the exception: keep it as evidence.
                if _EXCEPTION.match(stripped):
                    _add_evidence(result, line)
                continue
            if record is not None:
                _note_unparsed(result, line, "unexpected line inside the elastic failure summary")
                continue
            in_summary = False  # text between "Failures:" and a record that is not one: not a summary after all

        who = line_rank(line)

        match = _WHAT.search(line)
        if match and result["terminate"] and result["terminate"][-1]["what"] is None:
            result["terminate"][-1]["what"] = match.group("what").strip()[:500]
            _add_evidence(result, line)
            continue

        match = _TIMEOUT.search(line)
        if match and "terminated with exception" in line:
            _add_evidence(result, line)  # the watchdog thread re-stating a timeout already recorded
            continue
        if match:
            body = match.group("body")
            seq = _SEQ.search(body)
            op = _OPTYPE.search(body)
            nin, nout, tmo = _NUMEL_IN.search(body), _NUMEL_OUT.search(body), _TIMEOUT_MS.search(body)
            if not seq:
                _note_unparsed(result, line, "watchdog timeout line without SeqNum")
            result["timeouts"].append({
                "rank": who["rank"], "pg": who["pg"],
                "seq": int(seq.group(1)) if seq else None,
                "op_type": op.group(1) if op else None,
                "numel_in": int(nin.group(1)) if nin else None,
                "numel_out": int(nout.group(1)) if nout else None,
                "timeout_ms": int(tmo.group(1)) if tmo else None,
                "ran_for_ms": int(match.group("ran")),
                "backend": "nccl",
                "line": stripped[:500],
            })
            if who["rank"] is not None:
                reporting.add(who["rank"])
            _add_evidence(result, line)
            continue

        match = _GLOO_TIMEOUT.search(line)
        if match:
            # gloo has no watchdog: the waiting rank's collective raises instead. Same meaning for the culprit hunt.
            result["timeouts"].append({
                "rank": who["rank"], "pg": who["pg"], "seq": None, "op_type": match.group("op").upper(),
                "numel_in": None, "numel_out": None, "timeout_ms": int(match.group("ms")), "ran_for_ms": None,
                "backend": "gloo", "line": stripped[:500],
            })
            if who["rank"] is not None:
                reporting.add(who["rank"])
            _add_evidence(result, line)
            # no continue: the same line is that rank's exception (RuntimeError: ... Timed out waiting ...)

        match = _PG_STATUS.search(line)
        if match:
            failed = _FAILED_SEQ.search(line[:match.start()])
            result["pg_status"].append({
                "rank": who["rank"], "pg": who["pg"], "pg_rank": who["pg_rank"], "pg_desc": who["pg_desc"],
                "failed_seq": int(failed.group("seq")) if failed else None,
                "last_enqueued": int(match.group("enq")),
                "last_completed": int(match.group("comp")),
                "line": stripped[:500],
            })
            if who["rank"] is not None:
                reporting.add(who["rank"])
            _add_evidence(result, line)
            continue

        match = _TERMINATE.search(line)
        if match:
            result["terminate"].append({"rank": who["rank"], "exception": match.group("type"), "what": None,
                                        "line": stripped[:500]})
            _add_evidence(result, line)
            continue
        match = _AGENT_FAILED.search(line)
        if match:
            exitcode = int(match.group("exit"))
            result["agent_failures"].append({"local_rank": int(match.group("local")), "pid": int(match.group("pid")),
                                             "exitcode": exitcode, "signal": -exitcode if exitcode < 0 else None,
                                             "line": stripped[:500]})
            _add_evidence(result, line)
            continue

        if _OOM.search(line):
            oom = _parse_oom(line, who)
            same = [o for o in result["oom"] if o["rank"] == oom["rank"] and o["gpu"] in (oom["gpu"], None)
                    and o["tried_to_allocate_mib"] in (oom["tried_to_allocate_mib"], None)]
            if same:  # the same OOM restated (exception chain, logger): keep the more detailed record
                if _detail(oom) > _detail(same[0]):
                    result["oom"][result["oom"].index(same[0])] = oom
            else:
                result["oom"].append(oom)
            _add_evidence(result, line)
            # no continue: the OOM line is also that rank's exception

        match = _EXCEPTION.match(stripped)
        if match and not stripped.startswith(("File ", "Traceback")):
            key = (who["rank"], match.group("type"), (match.group("msg") or "")[:200])
            if key not in exceptions_seen and len(result["exceptions"]) < 50:
                exceptions_seen.add(key)
                result["exceptions"].append({"rank": who["rank"], "type": match.group("type"),
                                             "message": (match.group("msg") or "").strip()[:500],
                                             "line": stripped[:500]})
                _add_evidence(result, line)

    result["ranks_reporting"] = sorted(reporting)
    _find_culprit(result, world_size)
    result["root_cause"] = _root_cause(result)
    return result


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


def _find_culprit(result, world_size):
    if isinstance(world_size, int) and not isinstance(world_size, bool) and 0 < world_size <= 100000 and \
            (result["timeouts"] or result["pg_status"]):
        result["silent_ranks"] = [r for r in range(world_size) if r not in set(result["ranks_reporting"])]

    # Latest status per (pg, rank): the watchdog can print several lines for the same work.
    latest = {}
    for status in result["pg_status"]:
        if status["rank"] is None:
            continue
        latest[(status["pg"], status["rank"])] = status
    by_pg = {}
    for (pg, _rank), status in latest.items():
        by_pg.setdefault(pg, []).append(status)

    best = None
    for pg, statuses in by_pg.items():
        if len(statuses) < 2:
            continue
        statuses.sort(key=lambda s: (s["last_completed"], s["last_enqueued"], s["rank"]))
        low, high = statuses[0], statuses[-1]
        failed_seqs = [s["failed_seq"] for s in statuses if s["failed_seq"] is not None]
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
                     "last_enqueued": pick["last_enqueued"], "reason": reason, "line": pick["line"]}
        if best is None or (candidate["last_completed"], candidate["rank"]) < (best["last_completed"], best["rank"]):
            best = candidate

    if best is None and result["silent_ranks"] and result["ranks_reporting"]:
        rank = result["silent_ranks"][0]
        best = {"rank": rank, "pg": None, "last_completed": None, "last_enqueued": None, "line": None,
                "reason": "rank %d reported no timeout while rank(s) %s timed out waiting: it never reached the collective"
                          % (rank, ",".join(str(r) for r in result["ranks_reporting"]))}
    if best is None:
        # Old logs (<= 2.3) have no PG status: a rank that timed out on an EARLIER sequence is behind the others.
        seqs = {}
        for tmo in result["timeouts"]:
            if tmo["rank"] is not None and tmo["seq"] is not None:
                seqs[tmo["rank"]] = min(tmo["seq"], seqs.get(tmo["rank"], tmo["seq"]))
        if len(seqs) >= 2:
            ordered = sorted(seqs.items(), key=lambda kv: (kv[1], kv[0]))
            if ordered[0][1] < ordered[1][1]:
                rank, seq = ordered[0]
                best = {"rank": rank, "pg": None, "last_completed": None, "last_enqueued": None, "line": None,
                        "reason": "rank %d timed out on sequence %d, earlier than every other rank" % (rank, seq)}
    result["culprit"] = best
    result["culprit_rank"] = best["rank"] if best else None
