# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The common result shape of the check modules (docs/contracts.md), stdlib only: runs on the node.

    verdict   pass | warn | fail | error | skipped
    reasons   [str]   one line each, names the device
    evidence  [str]   raw tool lines that justify the verdict
    tool      ToolResult.as_dict() (or the planned argv in check mode)
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# Severity order used to combine findings. A proven failure outranks "could not run/read": it carries evidence and
# an operator action, while error only says "unknown". skipped outranks pass so a run that skipped work never reads
# as a clean pass.
VERDICT_ORDER = ("pass", "skipped", "warn", "error", "fail")
_RANK = dict((v, i) for i, v in enumerate(VERDICT_ORDER))

# Evidence is for humans and reports: enough lines to justify the verdict, bounded so a chatty tool cannot bloat
# every host's result.
MAX_EVIDENCE_LINES = 60
MAX_LINE_CHARS = 400

# Where the validation_tools role installs gpu_burn and all_reduce_perf: the checks look there after PATH.
TOOL_DIRS = ["/opt/gpufleet/bin"]
VALIDATION_TOOLS_HINT = "install it with the kentino.gpufleet.validation_tools role or pass executable="


def worst_of(verdicts, default="pass"):
    """The most severe verdict of an iterable (unknown strings count as error: never silently pass)."""
    worst = None
    for verdict in verdicts:
        rank = _RANK.get(verdict, _RANK["error"])
        if worst is None or rank > _RANK[worst]:
            worst = verdict if verdict in _RANK else "error"
    return worst if worst is not None else default


class Findings:
    """Collects verdict, reasons and evidence while a parser's output is judged."""

    def __init__(self):
        self.verdicts = []
        self.reasons = []
        self.evidence = []

    def add(self, verdict, reason, evidence=None):
        self.verdicts.append(verdict)
        if reason and reason not in self.reasons:
            self.reasons.append(reason)
        self.add_evidence(evidence)

    def add_evidence(self, lines):
        if not lines:
            return
        if isinstance(lines, str):
            lines = [lines]
        for line in lines:
            line = str(line).rstrip("\r\n")[:MAX_LINE_CHARS]
            if line and line not in self.evidence and len(self.evidence) < MAX_EVIDENCE_LINES:
                self.evidence.append(line)

    def verdict(self, default="pass"):
        return worst_of(self.verdicts, default=default)

    def as_dict(self, default="pass"):
        return {"verdict": self.verdict(default), "reasons": list(self.reasons), "evidence": list(self.evidence)}


def build_result(verdict, reasons, evidence, tool, **figures):
    """The module result: common keys first, then the check's own figures (units in their names)."""
    result = dict(figures)
    result.update({
        "verdict": verdict,
        "reasons": list(reasons),
        "evidence": list(evidence)[:MAX_EVIDENCE_LINES],
        "tool": tool,
        "changed": False,
    })
    return result


def planned_tool(argv, error=None):
    """The tool section when the tool did not run (check mode, missing tool): what would have run."""
    return {"argv": [str(a) for a in argv], "rc": None, "timed_out": False, "duration_s": 0.0, "error": error}


def run_problem(tool_result, name, timeout_s):
    """(verdict, reason, evidence) when the tool could not run or timed out, else None.

    tool_result is a tool_runner.ToolResult. The last lines of output go into evidence so a hang shows where it hung.
    """
    if tool_result.error:
        return "error", "%s could not be started: %s" % (name, tool_result.error), []
    if tool_result.timed_out:
        tail = (tool_result.stdout or "").replace("\r", "\n").strip().splitlines()[-5:]
        tail += (tool_result.stderr or "").strip().splitlines()[-5:]
        return ("error", "%s timed out after %s s (killed with its process group); raise timeout= if the run is "
                         "legitimately longer" % (name, timeout_s), tail)
    return None


def missing_tool_reason(name, install_hint):
    return "%s not found: %s" % (name, install_hint)
