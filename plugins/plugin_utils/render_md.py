# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""report.md from report.json: the fleet summary table (node, verdict, worst finding, action), then per node its
findings with evidence. summary_table() is also what the action returns as summary_md for the playbook's debug."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import NODE_VERDICTS
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.report_format import (
    count,
    lost_finding,
    number,
    run_times,
)

_ICON = {"pass": "PASS", "warn": "WARN", "error": "ERROR", "fail": "FAIL", "unreachable": "UNREACHABLE",
         "skipped": "SKIPPED"}


def verdict_text(node):
    """A node's verdict for the summary tables: a pass of what ran never hides what did not run."""
    skipped = node.get("skipped") or []
    text = _ICON.get(node["verdict"], node["verdict"])
    return "%s (SKIPPED: %s)" % (text, ", ".join(skipped)) if skipped else text


def _cell(text, limit=160):
    text = " ".join(str(text if text is not None else "").split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|") or "-"


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
    return "Gate (fail_on=%s): %s" % (gate["fail_on"], ("FAILED: " + ", ".join(gate["nodes"])) if gate["failed"]
                                      else "passed")


def summary_table(report):
    lines = ["| node | verdict | stage | worst finding | action |", "|---|---|---|---|---|"]
    for node in report["nodes"]:
        worst = node.get("worst")
        lines.append("| %s | %s | %s | %s | %s |" % (
            _cell(node["host"]), _cell(verdict_text(node)), _cell(node.get("stage")),
            _cell(("%s: %s" % (worst["code"], worst["message"])) if worst else "no findings"),
            _cell(node.get("action") or "none")))
    footer = gate_line(report)
    skipped = sum(1 for node in report["nodes"] if node.get("skipped"))
    if skipped:
        footer += "\nSkipped: %d node(s) did not run every check (switched off, refused or check mode): see SKIPPED" % (
            skipped)
    title = "Fleet report %s%s: %s" % (report["run_id"], " (INTERRUPTED: what the run had when it stopped)"
                                       if report.get("interrupted") else "", counts_line(report))
    return "\n".join([title, ""] + lines + ["", footer])


def render(report):
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
    for node in report["nodes"]:
        out += ["## %s: %s" % (node["host"], _ICON.get(node["verdict"], node["verdict"])), ""]
        if node.get("stage"):
            out.append("Stage reached: `%s`" % node["stage"])
            out.append("")
        lost = [(g, lost_finding(g)) for g in node.get("gpus") or []]
        lost = [(g, f) for g, f in lost if f is not None]
        if lost:
            out += ["Lost GPUs: %s" % ", ".join("GPU %s (%s) LOST: %s" % (count(g["index"]), g.get("pci") or "PCI unknown",
                                                                           f["code"]) for g, f in lost), ""]
        checks = node.get("checks") or {}
        if checks:
            out += ["| check | verdict | figures |", "|---|---|---|"]
            for name in sorted(checks):
                check = checks[name]
                figures = ", ".join("%s=%s" % (k, number(v)) for k, v in sorted(check["figures"].items())
                                    if v is not None)
                out.append("| %s | %s | %s |" % (_cell(name), _ICON.get(check["verdict"], check["verdict"]),
                                                 _cell(figures, 240)))
            out.append("")
        if not node["findings"]:
            out += ["No findings.", ""]
        for f in node["findings"]:
            where = " GPU %s" % count(f["gpu"]) if f.get("gpu") is not None else ""
            out.append("- **%s** `%s`%s: %s  " % (f["severity"].upper(), f["code"], where, " ".join(f["message"].split())))
            out.append("  Action: %s" % " ".join(f["action"].split()))
            if f["evidence"]:
                out.append("")
                out.append("  ```")
                out += ["  " + line.replace("```", "'''") for line in f["evidence"]]
                out.append("  ```")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
