# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""report.md from report.json: the fleet summary table (node, verdict, worst finding, action), then per node its
findings with evidence. summary_table() is also what the action returns as summary_md for the playbook's debug.

Text from nodes is shown as text: control characters are written out (report_format.printable_tree) and whatever
Markdown or HTML would interpret is escaped (text()); evidence stays verbatim inside code fences."""

from __future__ import annotations

import re

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import NODE_VERDICTS
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.report_format import (
    count,
    lost_finding,
    number,
    printable_tree,
    run_times,
)

# What makes Markdown (CommonMark, GFM) do something: emphasis, links and images, inline HTML and autolinks, code
# spans, table cells, strikethrough, escapes; an underscore only where it can open or close emphasis (not in_words).
_MARKDOWN = re.compile(r"[\\`*\[\]<>|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def text(value):
    """A value as literal Markdown text: every character Markdown would interpret is backslash-escaped."""
    return _MARKDOWN.sub(lambda m: "\\" + m.group(0), str(value if value is not None else ""))


def code(value):
    """A value inside a code span (no backquote can end it early)."""
    return "`%s`" % str(value if value is not None else "").replace("`", "'")

_ICON = {"pass": "PASS", "warn": "WARN", "error": "ERROR", "fail": "FAIL", "unreachable": "UNREACHABLE",
         "skipped": "SKIPPED"}


def verdict_text(node):
    """A node's verdict for the summary tables: a pass of what ran never hides what did not run."""
    skipped = node.get("skipped") or []
    label = _ICON.get(node["verdict"], node["verdict"])
    return "%s (SKIPPED: %s)" % (label, ", ".join(skipped)) if skipped else label


def cell(value, limit=160):
    """A table cell: one line, at most `limit` characters, escaped."""
    value = " ".join(str(value if value is not None else "").split())
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    return text(value) or "-"


def counts_line(report):
    s = report["summary"]
    parts = ["%s %s" % (count(s["verdicts"].get(v, 0)), v) for v in NODE_VERDICTS
             if s["verdicts"].get(v, 0)]
    return "%s node(s), %s GPU(s): %s" % (count(s["nodes"]), count(s["gpus"]), ", ".join(parts) or "none")


def gate_line(report):
    """The gate's outcome; an interrupted run's gate failed (it is no verdict), never passed."""
    gate = report["summary"]["gate"]
    if report.get("interrupted"):
        return "Gate (fail_on=%s): FAILED: the run was interrupted before it finished (%s did not finish); rerun for " \
               "a verdict" % (gate["fail_on"], ", ".join(gate["nodes"]) or "no node")
    failed = gate["nodes"] + (["the fabric (see its section)"] if gate.get("fabric") else [])
    return "Gate (fail_on=%s): %s" % (gate["fail_on"], ("FAILED: " + ", ".join(failed)) if gate["failed"]
                                      else "passed")


def history_line(report):
    """The history's failure for this run (not recorded, damaged, read-only), or None: beside the gate on every
    surface, because a run missing from the history is otherwise silent until a trend is missed."""
    error = (report.get("history") or {}).get("error")
    return "History: %s" % " ".join(str(error).split()) if error else None


def summary_table(report):
    report = printable_tree(report)
    lines = ["| node | verdict | stage | worst finding | action |", "|---|---|---|---|---|"]
    for node in report["nodes"]:
        worst = node.get("worst")
        lines.append("| %s | %s | %s | %s | %s |" % (
            cell(node["host"]), cell(verdict_text(node)), cell(node.get("stage")),
            cell(("%s: %s" % (worst["code"], worst["message"])) if worst else "no findings"),
            cell(node.get("action") or "none")))
    footer = "\n".join(line for line in (gate_line(report), history_line(report)) if line)
    skipped = sum(1 for node in report["nodes"] if node.get("skipped"))
    if skipped:
        footer += "\nSkipped: %d node(s) did not run every check (switched off, refused or check mode): see SKIPPED" % (
            skipped)
    title = "Fleet report %s%s: %s" % (report["run_id"], " (INTERRUPTED: what the run had when it stopped)"
                                       if report.get("interrupted") else "", counts_line(report))
    return "\n".join([title, ""] + lines + ["", footer])


def fabric_markdown(section):
    """The fabric section: the culprits with their evidence and action, then every pair test by round."""
    out = ["## Fabric: %s" % _ICON.get(section["verdict"], text(section["verdict"])), ""]
    if section.get("error"):
        out += [text(section["error"]), ""]
    if section.get("floor_gbps") is not None:
        out += ["%s round(s), %s pair test(s); a pair is slow below %s GB/s: the baseline %s GB/s (%s) less %s %%." % (
            count(section["rounds"]), count(len(section["pairs"])), number(section["floor_gbps"]),
            number(section["baseline_gbps"]), text(section.get("baseline_source")),
            number(100 * section.get("slow_margin", 0))), ""]
    for f in section["findings"]:
        out.append("- **%s** %s: %s  " % (text(f["severity"].upper()), code(f["code"]), text(" ".join(f["message"].split()))))
        out.append("  Action: %s" % text(" ".join(f["action"].split())))
        if f["evidence"]:
            out += ["", "  ```"] + ["  " + line.replace("```", "'''") for line in f["evidence"]] + ["  ```"]
    if not section["findings"]:
        out.append("No findings: every node passed a pair test.")
    out += ["", "| round | pair | leaves | bus bandwidth GB/s | status |", "|---|---|---|---|---|"]
    leaves = section.get("leaves") or {}
    for p in section["pairs"]:
        a, b = p["nodes"]
        out.append("| %s | %s | %s | %s | %s |" % (
            count(p["round"]), cell("%s <-> %s" % (a, b)), cell("%s / %s" % (leaves.get(a) or "-", leaves.get(b) or "-")),
            number(p["busbw_gbps"]) if p["busbw_gbps"] is not None else cell(p.get("error") or "-"),
            p["status"].upper()))
    return "\n".join(out) + "\n"


def render(report):
    report = printable_tree(report)
    times = run_times(report)
    took = " (took %s)" % times["duration"] if times["duration"] else ""
    out = ["# GPU fleet report %s%s" % (report["run_id"], " (INTERRUPTED)" if report.get("interrupted") else ""), ""]
    if report.get("interrupted"):
        out += ["> **Interrupted run.** The run stopped before it finished: this report holds what it had found by "
                "then. Nodes marked `RUN_INTERRUPTED` did not finish their checks and the gate was not applied. Rerun "
                "for a complete report.", ""]
    out += ["- playbook: %s" % (report.get("playbook") or "-"),
            "- started: %s, finished: %s%s" % (times["started"], times["finished"], took),
            "- %s" % counts_line(report), "", "## Summary", "", summary_table(report), ""]
    if report.get("cadence"):
        from ansible_collections.kentino.gpufleet.plugins.plugin_utils.cadence import markdown

        out.append(markdown(report["cadence"]))
    if report.get("fabric"):
        out.append(fabric_markdown(report["fabric"]))
    for node in report["nodes"]:
        out += ["## %s: %s" % (text(node["host"]), _ICON.get(node["verdict"], text(node["verdict"]))), ""]
        if node.get("stage"):
            out.append("Stage reached: %s" % code(node["stage"]))
            out.append("")
        lost = [(g, lost_finding(g)) for g in node.get("gpus") or []]
        lost = [(g, f) for g, f in lost if f is not None]
        if lost:
            out += ["Lost GPUs: %s" % ", ".join("GPU %s (%s) LOST: %s" % (count(g["index"]), text(g.get("pci") or
                                                                                                  "PCI unknown"),
                                                                           text(f["code"])) for g, f in lost), ""]
        checks = node.get("checks") or {}
        if checks:
            out += ["| check | verdict | figures |", "|---|---|---|"]
            for name in sorted(checks):
                check = checks[name]
                figures = ", ".join("%s=%s" % (k, number(v)) for k, v in sorted(check["figures"].items())
                                    if v is not None)
                out.append("| %s | %s | %s |" % (cell(name), _ICON.get(check["verdict"], check["verdict"]),
                                                 cell(figures, 240)))
            out.append("")
        if not node["findings"]:
            out += ["No findings.", ""]
        for f in node["findings"]:
            where = " GPU %s" % count(f["gpu"]) if f.get("gpu") is not None else ""
            out.append("- **%s** %s%s: %s  " % (text(f["severity"].upper()), code(f["code"]), where,
                                                 text(" ".join(f["message"].split()))))
            out.append("  Action: %s" % text(" ".join(f["action"].split())))
            if f["evidence"]:
                out.append("")
                out.append("  ```")
                out += ["  " + line.replace("```", "'''") for line in f["evidence"]]
                out.append("  ```")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
