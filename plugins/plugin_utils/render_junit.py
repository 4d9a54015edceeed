# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""junit.xml from report.json for CI gates: one testsuite per node, one testcase per (node, check).

fail findings -> <failure>, error/unreachable -> <error>, skipped checks -> <skipped>; warn findings fail the
testcase only when the report's gate is fail_on=warn (otherwise they go to system-out). Evidence is the body.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

# XML 1.0 cannot carry most control characters, even escaped: tool output sometimes has them.
_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text):
    return _BAD_XML.sub("?", str(text))


def _body(findings):
    parts = []
    for f in findings:
        where = " GPU %s" % f["gpu"] if f.get("gpu") is not None else ""
        parts.append("[%s] %s%s: %s\nAction: %s" % (f["severity"].upper(), f["code"], where, f["message"], f["action"]))
        parts += ["  " + line for line in f["evidence"]]
    return _clean("\n".join(parts))


def render(report):
    fail_on = report["fail_on"]
    root = ET.Element("testsuites", name="gpufleet %s" % (report.get("playbook") or "report"))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for node in report["nodes"]:
        suite = ET.SubElement(root, "testsuite", name=_clean(node["host"]), timestamp=report["finished"])
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        by_check = {}
        for f in node["findings"]:
            by_check.setdefault(f.get("check") or "node", []).append(f)
        names = sorted(set(node.get("checks") or {}) | set(by_check))
        if not node["reachable"] and "reachability" not in names:
            names.append("reachability")
        if not names:
            names = ["node"]
        for name in names:
            case = ET.SubElement(suite, "testcase", classname=_clean("gpufleet.%s" % node["host"]), name=_clean(name))
            counts["tests"] += 1
            findings = by_check.get(name, [])
            failing = [f for f in findings if f["severity"] == "fail" or (fail_on == "warn" and f["severity"] == "warn")]
            errors = [f for f in findings if f["severity"] in ("error", "unreachable")]
            check = (node.get("checks") or {}).get(name) or {}
            if failing:
                el = ET.SubElement(case, "failure", message=_clean(failing[0]["message"])[:500], type=failing[0]["code"])
                el.text = _body(failing + errors)
                counts["failures"] += 1
            elif errors:
                el = ET.SubElement(case, "error", message=_clean(errors[0]["message"])[:500], type=errors[0]["code"])
                el.text = _body(errors)
                counts["errors"] += 1
            elif check.get("verdict") == "skipped":
                ET.SubElement(case, "skipped", message=_clean("; ".join(check.get("reasons") or []) or "skipped"))
                counts["skipped"] += 1
            rest = [f for f in findings if f not in failing and f not in errors]
            if rest:
                ET.SubElement(case, "system-out").text = _body(rest)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
