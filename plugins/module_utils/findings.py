# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Findings: the one shape every judge returns (stdlib only: judges run on the node and on the controller).

    {"severity": "warn"|"error"|"fail", "code": "UPPER_SNAKE", "gpu": index or None, "pci": "dddd:bb:dd" or None,
     "message": str, "action": str, "evidence": [raw lines]}

A judge is a pure function `judge(result, thresholds, host)` -> [finding]. The module that ran the tool calls it with
the thresholds given as its options (so a module used on its own still answers pass/fail); the fleet report calls the
same function on the same result with the inventory's thresholds and never reads the node's verdict.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci

# The one verdict order of the collection (checks, GPUs, nodes, the fleet; every surface reads it from here),
# ascending. A proven failure outranks "could not run": it carries evidence and an action, while error only says
# "unknown". skipped outranks pass so a run that skipped work never reads as a clean pass. unreachable is a node's
# (it dropped out): worse than any verdict of a node that answered.
VERDICT_ORDER = ("pass", "skipped", "warn", "error", "fail", "unreachable")
# What a node, a GPU or the fleet can be (skipped is a check's: a node is judged by what did run).
NODE_VERDICTS = tuple(v for v in VERDICT_ORDER if v != "skipped")
_RANK = dict((v, i) for i, v in enumerate(VERDICT_ORDER))
# Node verdicts that fail the gate at each gpufleet_fail_on: the report's gate, junit.xml, the CLI's exit codes and the
# history's "last pass" (the newest run a node passed at the default gate) read this one table.
GATE_VERDICTS = {
    "fail": ("fail", "error", "unreachable"),
    "warn": ("warn", "fail", "error", "unreachable"),
    "never": (),
}
# A passing run: what the default gate lets through (a node that could not be checked never passes).
PASSING = tuple(v for v in NODE_VERDICTS if v not in GATE_VERDICTS["fail"])

MAX_EVIDENCE_LINES = 20
MAX_LINE_CHARS = 400


def worst(verdicts, default="pass"):
    """The most severe verdict (unknown strings count as error: never silently pass)."""
    found = None
    for verdict in verdicts:
        rank = _RANK.get(verdict, _RANK["error"])
        if found is None or rank > _RANK[found]:
            found = verdict if verdict in _RANK else "error"
    return found if found is not None else default


def rank(verdict):
    """A verdict's place in VERDICT_ORDER; an unknown string ranks as error (never silently below it)."""
    return _RANK.get(verdict, _RANK["error"])


def lines(values, limit=MAX_EVIDENCE_LINES):
    """Evidence lines: strings, stripped of line ends, bounded in count and length, without duplicates."""
    if values is None:
        return []
    if not isinstance(values, (list, tuple)):
        values = [values]
    out = []
    for value in values:
        if value is None:
            continue
        text = str(value).rstrip("\r\n")[:MAX_LINE_CHARS]
        if text and text not in out:
            out.append(text)
        if len(out) >= limit:
            break
    return out


def finding(severity, code, message, action, evidence=None, gpu=None, pci=None):
    # The report joins findings to GPUs by index and PCI address: a value of another shape (from a malformed result)
    # names no GPU rather than a wrong one.
    gpu = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None
    return {"severity": severity, "code": code, "gpu": gpu, "pci": normalize_pci(pci), "message": message,
            "action": action, "evidence": lines(evidence)}


def gpu_label(host, index=None, pci=None):
    """'node03 GPU 3 (0000:c1:00)': every message names the host and the GPU by index and PCI address."""
    if index is None:
        return "%s GPU at PCI %s" % (host, pci or "?")
    return "%s GPU %s%s" % (host, index, " (%s)" % pci if pci else "")


def check_verdict(findings, not_run=None):
    """A check's verdict from its findings; `not_run` (a reason) makes a finding-less check skipped, not pass."""
    if findings:
        return worst(f["severity"] for f in findings)
    return "skipped" if not_run else "pass"


def module_fields(findings, not_run=None):
    """verdict, reasons and evidence of a module result, from the judge's findings (the node's own view)."""
    evidence = []
    for f in findings:
        evidence.extend(f["evidence"])
    reasons = [f["message"] for f in findings] or ([not_run] if not_run else [])
    return {"verdict": check_verdict(findings, not_run), "reasons": reasons, "evidence": lines(evidence, 60)}
