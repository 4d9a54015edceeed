# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parser for the text output of PyTorch's flight-recorder analyzer (`torchfrtrace`, tools/flight_recorder; stdlib
only, never raises).

The analyzer reads every rank's dump and prints one block per collective it could not match (EntryState.log in
tools/flight_recorder/components/types.py; torch 2.5 printed the first line without "sequence number"):

    Not all ranks joining collective, sequence number: 7753        (2.5: Not all ranks joining collective 5 at entry 4)
    internal record id: 19990
    group info: 0:default_pg
    collective: nccl:all_reduce
    missing ranks: {21}
    ...
    collective state: scheduled
    Collective sequence number: 112 has errors
    ...
    error msg: Culprit rank 10; Error type: COLLECTIVE_TYPE_MISMATCH, Expected collective type: ...
    Input/output mismatch in the collective sequence number: 5

The oldest form is one line: `Not all ranks joining collective for group 0:default_pg collective nccl:all_reduce
Missing ranks are {1}`. Missing ranks never joined the collective the others wait in; a culprit rank ran something
else. Lines may carry any prefix.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

_NOT_ALL = re.compile(r"Not all ranks joining collective(?:, sequence number: (?P<seq>\d+)|\s+(?P<seq25>\d+) at entry "
                      r"(?P<entry>\d+)| for group (?P<group>\S+) collective (?P<col>\S+))?")
_HAS_ERRORS = re.compile(r"Collective sequence number: (?P<seq>\d+) has errors")
_SIZE = re.compile(r"Input/output mismatch in the collective sequence number: (?P<seq>\d+)")
_GROUP = re.compile(r"group info: (?P<v>.+?)\s*$")
_COLLECTIVE = re.compile(r"(?:^|\s|\]:?)collective: (?P<v>\S+)\s*$")
_MISSING = re.compile(r"[Mm]issing ranks(?: are|:) \{(?P<v>[\d,\s]*)\}")
_STATE = re.compile(r"collective state: (?P<v>\w+)")
_CULPRIT = re.compile(r"Culprit rank (?P<rank>\d+); (?P<detail>.*?)(?=, Culprit rank \d+;|$)")
MAX_BLOCKS = 256


def _ranks(text):
    return sorted(int(r) for r in re.findall(r"\d+", text))


class FrAnalysisReader:
    """Feed the analyzer's lines; result() gives the structure of parse_fr_analysis."""

    def __init__(self):
        self.blocks = []
        self.block = None

    def feed(self, line, when=None):
        try:
            self._feed(line)
        except Exception:  # never raise
            pass

    def _start(self, kind, seq, line, **fields):
        self.block = None
        if len(self.blocks) >= MAX_BLOCKS:
            return
        self.block = dict({"kind": kind, "seq": int(seq) if seq else None, "pg": None, "collective": None,
                           "missing": [], "culprits": [], "state": None, "line": " ".join(line.split())[:300]}, **fields)
        self.blocks.append(self.block)

    def _feed(self, line):
        if "ollective" not in line and "ranks" not in line and "Culprit" not in line and "group info" not in line:
            return
        match = _NOT_ALL.search(line)
        if match:
            self._start("missing", match.group("seq") or match.group("seq25"), line)
            if match.group("group"):
                self.block.update({"pg": match.group("group"), "collective": match.group("col")})
            missing = _MISSING.search(line)  # the one-line form names them on the same line
            if missing and self.block is not None:
                self.block["missing"] = _ranks(missing.group("v"))
            return
        for regex, kind in ((_HAS_ERRORS, "errors"), (_SIZE, "size_mismatch")):
            match = regex.search(line)
            if match:
                self._start(kind, match.group("seq"), line)
                return
        block = self.block
        if block is None:
            return
        for regex, key in ((_GROUP, "pg"), (_COLLECTIVE, "collective"), (_STATE, "state")):
            match = regex.search(line)
            if match and block[key] is None:
                block[key] = match.group("v")
                return
        match = _MISSING.search(line)
        if match:
            block["missing"] = _ranks(match.group("v"))
            return
        if "Culprit rank" in line:
            block["culprits"] += [{"rank": int(m.group("rank")), "detail": m.group("detail").strip()[:300]}
                                  for m in _CULPRIT.finditer(line)]

    def result(self):
        return {"collectives": [b for b in self.blocks if b["missing"] or b["culprits"] or b["kind"] != "missing"]}


def parse_fr_analysis(lines):
    """{"collectives": [{kind missing|errors|size_mismatch, seq, pg, collective, state, missing [ranks], culprits
    [{rank, detail}], line}]} of torchfrtrace output."""
    reader = FrAnalysisReader()
    for item in lines or []:
        text = item[0] if isinstance(item, (tuple, list)) and item else item
        if isinstance(text, str):
            reader.feed(text)
    return reader.result()
