# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""junit.xml from report.json for CI gates: one testsuite per node, one testcase per (node, check).

Findings whose severity trips the report's gate (findings.GATE_VERDICTS: the same table the gate uses) -> <failure>,
except error/unreachable -> <error>; skipped checks -> <skipped>; the rest go to system-out. Evidence is the body.
Times: a testcase is its check's tool time, a suite the sum, the whole file the run's start to finish.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.report_format import printable_tree


def _body(findings):
    parts = []
    for f in findings:
        where = " GPU %s" % f["gpu"] if f.get("gpu") is not None else ""
        parts.append("[%s] %s%s: %s\nAction: %s" % (f["severity"].upper(), f["code"], where, f["message"], f["action"]))
        parts += ["  " + line for line in f["evidence"]]
    return "\n".join(parts)


def _seconds(iso):
    try:
        return datetime.fromisoformat(iso).timestamp()
    except (TypeError, ValueError):
        return None


def render(report):
    from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import GATE_VERDICTS

    report = printable_tree(report)  # XML 1.0 cannot carry most control characters, even escaped
    gated = GATE_VERDICTS[report["fail_on"]]
    root = ET.Element("testsuites", name="gpufleet %s" % (report.get("playbook") or "report"))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for node in report["nodes"]:
        suite = ET.SubElement(root, "testsuite", name=str(node["host"]), timestamp=report["finished"])
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        node_seconds = 0.0
        by_check = {}
        for f in node["findings"]:
            by_check.setdefault(f.get("check") or "node", []).append(f)
        names = sorted(set(node.get("checks") or {}) | set(by_check))
        if not node["reachable"] and "reachability" not in names:
            names.append("reachability")
        if not names:
            names = ["node"]
        for name in names:
            case = ET.SubElement(suite, "testcase", classname=str("gpufleet.%s" % node["host"]), name=str(name))
            counts["tests"] += 1
            findings = by_check.get(name, [])
            errors = [f for f in findings if f["severity"] in ("error", "unreachable")]
            failing = [f for f in findings if f["severity"] in gated and f not in errors]
            check = (node.get("checks") or {}).get(name) or {}
            seconds = (check.get("figures") or {}).get("duration_s") or 0.0
            case.set("time", "%.3f" % seconds)
            node_seconds += seconds
            if failing:
                el = ET.SubElement(case, "failure", message=str(failing[0]["message"])[:500], type=failing[0]["code"])
                el.text = _body(failing + errors)
                counts["failures"] += 1
            elif errors:
                el = ET.SubElement(case, "error", message=str(errors[0]["message"])[:500], type=errors[0]["code"])
                el.text = _body(errors)
                counts["errors"] += 1
            elif check.get("verdict") == "skipped":
                ET.SubElement(case, "skipped", message=str("; ".join(check.get("reasons") or []) or "skipped"))
                counts["skipped"] += 1
            rest = [f for f in findings if f not in failing and f not in errors]
            if rest:
                ET.SubElement(case, "system-out").text = _body(rest)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("time", "%.3f" % node_seconds)
    for key, value in totals.items():
        root.set(key, str(value))
    start, end = _seconds(report.get("started")), _seconds(report.get("finished"))
    root.set("time", "%.3f" % (max(0.0, end - start) if start is not None and end is not None else 0.0))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
