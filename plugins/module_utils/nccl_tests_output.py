# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parse nccl-tests (all_reduce_perf and friends) stdout; stdlib only, runs on the node (judged by judge_nccl).

Shapes read (nccl-tests common.cu / util.cu format strings):
  # nccl-tests version 2.17.1 nccl-headers=22703 nccl-library=22703
  # Collective test starting: all_reduce_perf
  # nThread 1 nGpus 8 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
  #  Rank  0 Group  0 Pid  12345 on     node01 device  0 [0000:04:00] NVIDIA H100 80GB HBM3   (older: [0x04])
  #  <size count type redop root time algbw busbw #wrong time algbw busbw #wrong> and the (B) (elements) units line
  "%12li  %12li  %8s  %6s  %6s" then per half "  %7s  %6s  %6s  %6g" (#wrong may be N/A; a value too wide for its
  column loses its decimals or turns into 1.2e+04)
  # Out of bounds values : 0 OK|FAILED / # Avg bus bandwidth    : 72.7724 [OK|FAILED] / # Collective test concluded: X
  failures: "<host>: Test CUDA failure common.cu:N '...'", "Test NCCL failure ...", "Invalid number of GPUs ..."
Foreign lines (MPI or NCCL warnings) inside the table are skipped and counted.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci

_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                   r"\[([^\]]*)\]\s*(.*)$")
_HEADER_FIELDS = (
    ("nthread", re.compile(r"\bnThread\s+(\d+)")),
    ("ngpus", re.compile(r"\bnGpus\s+(\d+)")),
    ("min_bytes", re.compile(r"\bminBytes\s+(\d+)")),
    ("max_bytes", re.compile(r"\bmaxBytes\s+(\d+)")),
    ("warmup_iters", re.compile(r"\bwarmup iters:\s*(\d+)")),
    ("iters", re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)")),
    ("validation", re.compile(r"\bvalidation:\s*(\d+)")),
    ("graph", re.compile(r"\bgraph:\s*(\d+)")),
)
_STEP = re.compile(r"\bstep:\s*(\d+)\((factor|bytes)\)")
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(-?\d+)\s*(OK|FAILED)?", re.I)
_AVG_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?", re.I)
_BITWISE = re.compile(r"^#\s*Bitwise mismatches\s*:\s*(-?\d+)\s*(OK|FAILED)?", re.I)
_FAILURE = re.compile(r"Test (?:CUDA|NCCL) failure|Test failure\b|Invalid number of GPUs|mpirun noticed that|"
                      r"process returned a non-zero exit code|Check failed|Segmentation fault|core dumped")
_INT = re.compile(r"^-?\d+$")
MAX_SAMPLES = 5


def _num(token):
    """Float of a column value (12.3, 1234, 1.2e+04), None for N/A / nan / garbage."""
    try:
        value = float(token)
    except (TypeError, ValueError):
        return None
    return None if value != value or value in (float("inf"), float("-inf")) else value


def _wrong(token):
    value = _num(token)
    return None if value is None else int(value)


def _new_output():
    return {
        "nccl_tests_version": None, "test_name": None, "header": {}, "gpus": [], "rows": [],
        "columns_seen": False, "out_of_bounds": None, "out_of_bounds_status": None, "avg_busbw_gbps": None,
        "avg_busbw_check": None, "bitwise_mismatches": None, "concluded": False, "failures": [], "last_error": None,
        "foreign_lines_in_table": 0, "wrong_values": 0, "peak_busbw_gbps": None, "largest_size_bytes": None,
        "unparsed": {"count": 0, "samples": []}, "problems": [],
    }


def _half(tokens, prefix):
    """time, algbw, busbw, #wrong of one half of a row (out-of-place or in-place)."""
    if len(tokens) < 4:
        return {prefix + "time_us": None, prefix + "algbw_gbps": None, prefix + "busbw_gbps": None,
                prefix + "wrong": None}
    return {prefix + "time_us": _num(tokens[0]), prefix + "algbw_gbps": _num(tokens[1]),
            prefix + "busbw_gbps": _num(tokens[2]), prefix + "wrong": _wrong(tokens[3])}


def _parse_row(line, half_width, has_root):
    tokens = line.split()
    fixed = 5 if has_root else 4
    if len(tokens) < fixed + 4 or not _INT.match(tokens[0]) or not _INT.match(tokens[1]):
        return None
    if _num(tokens[2]) is not None or _num(tokens[3]) is not None:
        return None  # type and redop are words (float, sum): a row of numbers only is not a data row
    if has_root and not _INT.match(tokens[4]):
        return None
    rest = tokens[fixed:]
    if any(_num(t) is None and t != "N/A" for t in rest[:4]):
        return None
    row = {"size_bytes": int(tokens[0]), "count": int(tokens[1]), "type": tokens[2], "redop": tokens[3],
           "root": int(tokens[4]) if has_root else None}
    if len(rest) >= 2 * half_width:
        row.update(_half(rest[:half_width], "oop_"))
        row.update(_half(rest[half_width:2 * half_width], "ip_"))
    else:
        # Only one half printed (nccl-tests leaves the out-of-place columns blank when it skips them).
        row.update(_half([], "oop_"))
        row.update(_half(rest[:half_width], "ip_"))
    if row["ip_busbw_gbps"] is None and row["oop_busbw_gbps"] is None:
        return None
    return row


def parse_nccl_tests(text):
    """nccl-tests stdout (+stderr) -> dict; never raises."""
    text = text if isinstance(text, str) else ("" if text is None else str(text))
    out = _new_output()
    half_width, has_root = 4, True
    in_table = False
    for raw in text.replace("\r", "\n").split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            tokens = body.split()
            if tokens[:3] == ["size", "count", "type"]:
                out["columns_seen"] = True
                in_table = True
                has_root = "root" in tokens
                times = [i for i, t in enumerate(tokens) if t in ("time", "cputime")]
                if len(times) >= 2:
                    half_width = times[1] - times[0]
                continue
            _consume_comment(out, line, body)
            if body.lower().startswith(("out of bounds", "avg bus")):
                in_table = False
            continue
        if _FAILURE.search(line):
            out["failures"].append(line[:300])
            continue
        row = _parse_row(line, half_width, has_root)
        if row is not None:
            row["line"] = line[:300]  # the evidence the judge quotes
            out["rows"].append(row)
            in_table = True
            continue
        if in_table:
            out["foreign_lines_in_table"] += 1
        out["unparsed"]["count"] += 1
        if len(out["unparsed"]["samples"]) < MAX_SAMPLES:
            out["unparsed"]["samples"].append(line[:200])
    _figures(out)
    return out


def _consume_comment(out, line, body):
    """Header/footer comment lines. True when recognised."""
    match = _RANK.match(line)
    if match:
        bus = match.group(6).strip()
        out["gpus"].append({"rank": int(match.group(1)), "group": int(match.group(2)) if match.group(2) else None,
                            "pid": int(match.group(3)),
                            "host": match.group(4), "device": int(match.group(5)), "pci": normalize_pci(bus),
                            "bus_id": bus, "name": match.group(7).strip() or None})
        return True
    if body.startswith("nThread"):
        for key, regex in _HEADER_FIELDS:
            found = regex.search(body)
            if found:
                out["header"][key] = int(found.group(1))
        step = _STEP.search(body)
        if step:
            out["header"]["step_" + step.group(2)] = int(step.group(1))
        return True
    match = _OUT_OF_BOUNDS.match(line)
    if match:
        out["out_of_bounds"] = int(match.group(1))
        out["out_of_bounds_status"] = (match.group(2) or "").upper() or None
        return True
    match = _AVG_BUSBW.match(line)
    if match:
        out["avg_busbw_gbps"] = _num(match.group(1))
        out["avg_busbw_check"] = (match.group(2) or "").upper() or None
        if out["avg_busbw_gbps"] is None:
            out["problems"].append({"kind": "footer", "message": "unreadable average bus bandwidth",
                                    "line": line[:200]})
        return True
    match = _BITWISE.match(line)
    if match:
        out["bitwise_mismatches"] = int(match.group(1))
        return True
    if body.startswith("Collective test concluded"):
        out["concluded"] = True
        return True
    if body.startswith("Collective test starting:"):
        out["test_name"] = body.split(":", 1)[1].strip() or None
        return True
    if body.startswith("nccl-tests version"):
        out["nccl_tests_version"] = body.split()[2] if len(body.split()) > 2 else None
        return True
    if body.startswith("error:"):
        out["last_error"] = body[len("error:"):].strip() or None
        return True
    return False


def _figures(out):
    rows = out["rows"]
    wrong = 0
    for row in rows:
        wrong += sum(abs(row[k]) for k in ("oop_wrong", "ip_wrong") if row[k] is not None)
    out["wrong_values"] = wrong
    if rows:
        largest = max(r["size_bytes"] for r in rows)
        out["largest_size_bytes"] = largest
        # The tool's average includes tiny latency-bound sizes: the health figure is the bus bandwidth at the
        # largest message, best of out-of-place and in-place.
        values = [r[k] for r in rows if r["size_bytes"] == largest for k in ("oop_busbw_gbps", "ip_busbw_gbps")
                  if r[k] is not None]
        out["peak_busbw_gbps"] = max(values) if values else None
