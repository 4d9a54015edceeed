# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""report.md from report.json: the fleet summary table (node, verdict, worst finding, action), then per node its
findings with evidence. summary_table() is also what the action returns as summary_md for the playbook's debug."""

from __future__ import annotations

_ICON = {"pass": "PASS", "warn": "WARN", "error": "ERROR", "fail": "FAIL", "unreachable": "UNREACHABLE",
         "skipped": "skipped"}


def _cell(text, limit=160):
    text = " ".join(str(text if text is not None else "").split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|") or "-"


def counts_line(report):
    s = report["summary"]
    parts = ["%d %s" % (s["verdicts"].get(v, 0), v) for v in ("pass", "warn", "fail", "error", "unreachable")
             if s["verdicts"].get(v, 0)]
    return "%d node(s), %d GPU(s): %s" % (s["nodes"], s["gpus"], ", ".join(parts) or "none")


def summary_table(report):
    lines = ["| node | verdict | stage | worst finding | action |", "|---|---|---|---|---|"]
    for node in report["nodes"]:
        worst = node.get("worst")
        lines.append("| %s | %s | %s | %s | %s |" % (
            _cell(node["host"]), _ICON.get(node["verdict"], node["verdict"]), _cell(node.get("stage")),
            _cell(("%s: %s" % (worst["code"], worst["message"])) if worst else "no findings"),
            _cell(node.get("action") or "none")))
    gate = report["summary"]["gate"]
    footer = "Gate (fail_on=%s): %s" % (
        gate["fail_on"], ("FAILED: " + ", ".join(gate["nodes"])) if gate["failed"] else "passed")
    title = "Fleet report %s%s: %s" % (report["run_id"], " (INTERRUPTED: what the run had when it stopped)"
                                       if report.get("interrupted") else "", counts_line(report))
    return "\n".join([title, ""] + lines + ["", footer])


def render(report):
    out = ["# GPU fleet report %s%s" % (report["run_id"], " (interrupted)" if report.get("interrupted") else ""), "",
           "- playbook: %s" % (report.get("playbook") or "-"),
           "- started: %s, finished: %s" % (report["started"], report["finished"]),
           "- %s" % counts_line(report), "", "## Summary", "", summary_table(report), ""]
    if report.get("cadence"):
        from ansible_collections.kentino.gpufleet.plugins.plugin_utils.cadence import markdown

        out.append(markdown(report["cadence"]))
    for node in report["nodes"]:
        out += ["## %s: %s" % (node["host"], _ICON.get(node["verdict"], node["verdict"])), ""]
        if node.get("stage"):
            out.append("Stage reached: `%s`" % node["stage"])
            out.append("")
        checks = node.get("checks") or {}
        if checks:
            out += ["| check | verdict | figures |", "|---|---|---|"]
            for name in sorted(checks):
                check = checks[name]
                figures = ", ".join("%s=%s" % (k, v) for k, v in sorted(check["figures"].items()) if v is not None)
                out.append("| %s | %s | %s |" % (_cell(name), _ICON.get(check["verdict"], check["verdict"]),
                                                 _cell(figures, 240)))
            out.append("")
        if not node["findings"]:
            out += ["No findings.", ""]
        for f in node["findings"]:
            where = " GPU %s" % f["gpu"] if f.get("gpu") is not None else ""
            out.append("- **%s** `%s`%s: %s  " % (f["severity"].upper(), f["code"], where, " ".join(f["message"].split())))
            out.append("  Action: %s" % " ".join(f["action"].split()))
            if f["evidence"]:
                out.append("")
                out.append("  ```")
                out += ["  " + line.replace("```", "'''") for line in f["evidence"]]
                out.append("  ```")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
