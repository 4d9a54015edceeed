# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parser for NCCL's RAS status report, as the `ncclras` client prints it (NCCL >= 2.24; stdlib only, never raises).

The report (NVIDIA/nccl src/ras/client_support.cc) has a job summary, a communicators table, then `Errors` and
`Warnings` sections. What names ranks:

    DEAD
      1 job process is considered dead (unreachable via the RAS network)
      Process 3487984 on node 172.16.64.213 managing GPU 5
    #0-0 (27a079b828ff1a75) INCOMPLETE
      Missing communicator data from 1 rank
      Rank 29 -- GPU 5 managed by process 3487984 on node 172.16.64.213
    #0-0 (27a079b828ff1a75) MISMATCH
      Communicator ranks have different AllReduce operation counts
      26 ranks have launched up to operation 6650
      6 ranks have launched up to operation 6649
      Rank 0 -- GPU 0 managed by process 483072 on node 172.16.64.210          (one line per rank of the group above)
      Rank 7 has launched up to operation 60 -- GPU 3 managed by process 1650386 on node node1   (a group of one)
      Rank 3 has not launched any operations -- GPU 3 managed by process ... on node ...

A communicator's ranks at the lowest count are the ones the others wait for (RAS samples launches: on a running job a
spread of one operation is normal; on a hung job the counts no longer move). Lines may carry any prefix.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

_COMM = re.compile(r"#(?P<id>\d+-\d+) \((?P<hash>[0-9a-fA-F]+)\) (?P<kind>MISMATCH|INCOMPLETE|ERROR)\s*$")
_DIFFERENT = re.compile(r"Communicator ranks have different (?P<op>.+?) operation counts")
_GROUP = re.compile(r"(?P<n>\d+) ranks have (?:launched up to operation (?P<op>\d+)|not launched any operations)")
_WHERE = r"-- GPU (?P<gpu>\S+) managed by process (?P<pid>\d+) on node (?P<node>\S+)"
_RANK_IN_GROUP = re.compile(r"Rank (?P<rank>\d+) " + _WHERE)
_RANK_ALONE = re.compile(r"Rank (?P<rank>\d+) has (?:launched up to operation (?P<op>\d+)|not launched any operations)"
                         r"(?: " + _WHERE + r")?")
_RANK_UNKNOWN = re.compile(r"Rank (?P<rank>\d+) -- \[process information not found\]")
_DEAD = re.compile(r"(?P<n>\d+) job process(?:es are| is) considered dead")
_MISSING_DATA = re.compile(r"Missing communicator data from (?P<n>\d+) job process")
_PROCESS = re.compile(r"Process (?P<pid>\d+) on node (?P<node>\S+) managing GPUs? (?P<gpus>\S+)")
MAX_ITEMS = 256


def _where(match):
    if match is None or match.groupdict().get("pid") is None:
        return {"gpu": None, "pid": None, "node": None}
    return {"gpu": match.group("gpu"), "pid": int(match.group("pid")), "node": match.group("node")}


class RasStatusReader:
    """Feed the lines of `ncclras` output (any prefix); result() gives the structure of parse_ras_status."""

    def __init__(self):
        self.out = {"communicators": [], "dead": [], "missing_processes": []}
        self.comm = None  # the communicator block being read
        self.counts = None  # the op-count comparison being read
        self.group = None  # the "N ranks have launched up to operation X" group being read
        self.section = None  # DEAD or INCOMPLETE (the job-level lists of processes)

    def feed(self, line, when=None):
        try:
            self._feed(line)
        except Exception:  # never raise
            pass

    def _feed(self, line):
        if "Rank" not in line and "rank" not in line and "#" not in line and "Process" not in line and \
                "process" not in line:
            return
        match = _COMM.search(line)
        if match:
            self.comm = {"id": "#" + match.group("id"), "hash": match.group("hash"), "kind": match.group("kind"),
                         "op_counts": [], "ranks": []}
            self.counts = self.group = self.section = None
            if len(self.out["communicators"]) < MAX_ITEMS:
                self.out["communicators"].append(self.comm)
            return
        for regex, section in ((_DEAD, "dead"), (_MISSING_DATA, "missing_processes")):
            if regex.search(line):  # the job-level lists of processes (not a communicator's missing ranks)
                self.section, self.comm = section, None
                return
        match = _PROCESS.search(line)
        if match and self.section and len(self.out[self.section]) < MAX_ITEMS:
            self.out[self.section].append({"pid": int(match.group("pid")), "node": match.group("node"),
                                           "gpus": match.group("gpus")})
            return
        if self.comm is None:
            return
        match = _DIFFERENT.search(line)
        if match:
            self.counts = {"op": match.group("op"), "groups": []}
            self.group = None
            self.comm["op_counts"].append(self.counts)
            return
        match = _GROUP.search(line)
        if match and self.counts is not None:
            self.group = {"operation": int(match.group("op") or 0), "ranks_total": int(match.group("n")), "ranks": []}
            self.counts["groups"].append(self.group)
            return
        match = _RANK_ALONE.search(line)
        if match and self.counts is not None:
            rank = dict(_where(match), rank=int(match.group("rank")))
            self.counts["groups"].append({"operation": int(match.group("op") or 0), "ranks_total": 1,
                                          "ranks": [rank]})
            self.group = None
            return
        match = _RANK_IN_GROUP.search(line) or _RANK_UNKNOWN.search(line)
        if match:
            rank = dict(_where(match), rank=int(match.group("rank")))
            target = self.group["ranks"] if self.group is not None else self.comm["ranks"]
            if len(target) < MAX_ITEMS:
                target.append(rank)

    def result(self):
        return self.out


def parse_ras_status(lines):
    """{"communicators": [{id, hash, kind MISMATCH|INCOMPLETE|ERROR, ranks [{rank, gpu, pid, node}] (an INCOMPLETE
    communicator's missing ranks), op_counts [{op, groups [{operation (0: none launched), ranks_total, ranks [...]}]}]}],
    "dead": [{pid, node, gpus}], "missing_processes": [{pid, node, gpus}]} of ncclras output."""
    reader = RasStatusReader()
    for item in lines or []:
        text = item[0] if isinstance(item, (tuple, list)) and item else item
        if isinstance(text, str):
            reader.feed(text)
    return reader.result()
