# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parser for PyTorch's NCCL desync report (stdlib only: runs on the node; never raises).

With TORCH_NCCL_DESYNC_DEBUG=1 a rank whose collective timed out reads every rank's last collective from the store and
logs (torch/csrc/distributed/c10d/TraceUtils.h, retrieveDesyncReport) one multi-line message after its log prefix:

    [rank0]:[E1206 18:44:12.802441907 ProcessGroupNCCL.cpp:1669] [PG 0 (default_pg) Rank 0]
    \t - [0] Timeout at collective: ALLREDUCE, #183
    \t - To our best knowledge, ranks [5] are the lagging ranks that caused this timeout. They never joined any collectives
    \t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:
    \t   - [5] joined but didn't finish collective #182 (count from 1)
    \t     [7] finished collective #182, but didn't join collective #183 (count from 1)
    \t - Snapshot of ranks' latest states:
    \t   #183 started ranks:
    \t     [0, 1, 2, 3, 4, 6] started ALLREDUCE

The ranks it names are behind everyone else (the lowest collective in the store): they are the ones the others wait
for. Each line is read on its own (a log shipper or torchrun's --tee prefix can come before any of them); a report
starts at its `Timeout at collective` line, and lines of a report whose start was not captured make one of their own.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

_RANKS = r"\[(?P<ranks>\d+(?:\s*,\s*\d+)*)\]"
_START = re.compile(r"\[(?P<rank>\d+)\] Timeout at collective: (?P<col>[^,]*), #(?P<seq>\d+)")
_MISSING = re.compile(r"ranks " + _RANKS + r" are the lagging ranks that caused this timeout")
_STUCK = re.compile(_RANKS + r" joined but didn't finish collective #(?P<seq>\d+)")
_BEHIND = re.compile(_RANKS + r" finished collective #(?P<seq>\d+), but didn't join collective #(?P<next>\d+)")
_SNAPSHOT = re.compile(_RANKS + r" (?:started|finished) (?P<col>\S+)\s*$")
MAX_REPORTS = 64
MAX_LINES = 12


def _ranks(text):
    return [int(r) for r in re.findall(r"\d+", text)]


class DesyncReportReader:
    """Feed lines (any prefix); result() gives {"reports": [...]} (see parse_desync_report)."""

    def __init__(self):
        self.reports = []
        self.current = None

    def _report(self, when):
        if self.current is None:
            if len(self.reports) >= MAX_REPORTS:
                return None
            self.current = {"reporter": None, "collective": None, "seq": None, "time": when, "missing": [],
                            "lagging": [], "snapshot_ranks": [], "lines": []}
            self.reports.append(self.current)
        return self.current

    def feed(self, line, when=None):
        try:
            self._feed(line, when)
        except Exception:  # never raise: a line this parser cannot read is not its business
            pass

    def _feed(self, line, when):
        if "collective" not in line and "lagging" not in line and "started" not in line and "finished" not in line:
            return  # most lines of a training log: no regex for them
        match = _START.search(line)
        if match:
            self.current = None
            report = self._report(when)
            if report is None:
                return
            report.update({"reporter": int(match.group("rank")), "collective": match.group("col").strip() or None,
                           "seq": int(match.group("seq"))})
        else:
            found = [(regex, regex.search(line)) for regex in (_MISSING, _STUCK, _BEHIND)]
            found = [(regex, m) for regex, m in found if m]
            snapshot = _SNAPSHOT.search(line) if not found else None
            if not found and not snapshot:
                return
            report = self._report(when)
            if report is None:
                return
            for regex, m in found:
                if regex is _MISSING:
                    report["missing"] = sorted(set(report["missing"]) | set(_ranks(m.group("ranks"))))
                else:
                    report["lagging"].append({
                        "ranks": _ranks(m.group("ranks")), "seq": int(m.group("seq")),
                        "state": "joined_not_finished" if regex is _STUCK else "finished_not_joined",
                        "next_seq": int(m.group("next")) if regex is _BEHIND else None})
            if snapshot:
                report["snapshot_ranks"] = sorted(set(report["snapshot_ranks"]) | set(_ranks(snapshot.group("ranks"))))
        if len(report["lines"]) < MAX_LINES:
            report["lines"].append(" ".join(line.split())[:300])

    def result(self):
        return {"reports": [r for r in self.reports if r["missing"] or r["lagging"]]}


def parse_desync_report(lines):
    """{"reports": [{reporter, collective, seq, time, missing [ranks], lagging [{ranks, seq, state, next_seq}],
    snapshot_ranks, lines}]} of every desync report in lines (str, or (str, epoch seconds) pairs)."""
    reader = DesyncReportReader()
    for item in lines or []:
        if isinstance(item, (tuple, list)) and item:
            reader.feed(str(item[0]), item[1] if len(item) > 1 else None)
        elif isinstance(item, str):
            reader.feed(item)
    return reader.result()
