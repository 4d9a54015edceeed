# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The fleet report (controller side): nodes judged by rules.py -> report.json (the source of truth, validated
against report_schema.json) -> report.md, report.html, junit.xml, all rendered from that JSON.

Files are written atomically (temp file in the same directory, fsync, os.replace, fsync of the directory) under
<report_dir>/<run_id>/, and <report_dir>/latest is swapped to the new run only after every file is in place: an
interrupted run leaves the previous report and the latest link as they were.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import GATE_VERDICTS, NODE_VERDICTS
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.packages import require
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.schema_inline import inline_refs

SCHEMA_VERSION = "1.0"
SCHEMA_PATH = Path(__file__).with_name("report_schema.json")
GENERATOR = "kentino.gpufleet.fleet_report"
FAIL_ON = tuple(GATE_VERDICTS)
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
FILES = ("report.json", "report.md", "report.html", "junit.xml")


class ReportError(Exception):
    """A report that cannot be written as asked (bad run id, invalid JSON against the schema)."""


def now_iso():
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def default_run_id(when=None):
    """Time plus a random suffix: two runs started in the same second never share a directory."""
    return "%s-%s" % ((when or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ"), secrets.token_hex(3))


def summarize(nodes, fail_on):
    verdicts = {v: 0 for v in NODE_VERDICTS}
    gpu_verdicts, findings, codes = {}, {}, {}
    gpus = 0
    for node in nodes:
        verdicts[node["verdict"]] = verdicts.get(node["verdict"], 0) + 1
        for gpu in node["gpus"]:
            gpus += 1
            gpu_verdicts[gpu["verdict"]] = gpu_verdicts.get(gpu["verdict"], 0) + 1
        for finding in node["findings"]:
            findings[finding["severity"]] = findings.get(finding["severity"], 0) + 1
            codes[finding["code"]] = codes.get(finding["code"], 0) + 1
    gated = [n["host"] for n in nodes if n["verdict"] in GATE_VERDICTS[fail_on]]
    return {
        "nodes": len(nodes),
        "gpus": gpus,
        "verdict": rules.worst(n["verdict"] for n in nodes),
        "verdicts": verdicts,
        "gpu_verdicts": gpu_verdicts,
        "findings": findings,
        "codes": codes,
        "gate": {"fail_on": fail_on, "failed": bool(gated), "nodes": gated},
    }


def build_report(nodes, run_id, playbook=None, started=None, finished=None, fail_on="fail", interrupted=False):
    """The report dict from evaluated nodes (rules.evaluate_node); sorted worst first, then by host. An interrupted
    run keeps its gpufleet_fail_on and never passes its gate: every node that did not finish fails it."""
    if fail_on not in FAIL_ON:
        raise ReportError("fail_on must be one of %s, got %r" % (", ".join(FAIL_ON), fail_on))
    if not RUN_ID_RE.match(str(run_id)):
        raise ReportError("run_id %r is not a safe directory name (letters, digits, . _ -; at most 128)" % (run_id,))
    ordered = sorted(nodes, key=lambda n: (-rules.rank(n["verdict"]), n["host"]))
    finished = finished or now_iso()
    summary = summarize(ordered, fail_on)
    if interrupted:
        stopped = [n["host"] for n in ordered if any(f["code"] == "RUN_INTERRUPTED" for f in n["findings"])]
        summary["gate"]["nodes"] = [h for h in [n["host"] for n in ordered]
                                    if h in stopped or h in summary["gate"]["nodes"]]
        summary["gate"]["failed"] = True
    doc = {
        "schema_version": SCHEMA_VERSION,
        "run_id": str(run_id),
        "started": started or finished,
        "finished": finished,
        "playbook": playbook,
        "fail_on": fail_on,
        "generator": GENERATOR,
        "summary": summary,
        "nodes": ordered,
    }
    if interrupted:
        doc["interrupted"] = True
    return doc


def add_fabric(doc, search):
    """The fabric section of a fabric search (rules/fabric.py), and its findings on no node's row in the gate: a
    blamed leaf switch fails the run like a node would. A search that does not match its schema is an error
    section naming the key (the nodes show RESULT_INVALID)."""
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import fabric, reading

    errors = reading.schema_errors("fabric", search) if isinstance(search, dict) else ["not a mapping"]
    if errors:
        section = {"version": fabric.SECTION_VERSION, "verdict": "error", "rounds": 0, "pairs": [], "findings": [],
                   "leaves": {}, "error": "the fabric search does not match its schema: %s" % "; ".join(errors[:5])}
    else:
        section = fabric.section(search)
    doc["fabric"] = section
    gate = doc["summary"]["gate"]
    # Findings on a node's row gate through that node; what is on no row (a leaf, a search that could not be read)
    # gates here.
    unplaced = [f["severity"] for f in section["findings"] if not f["nodes"]] + (["error"] if errors else [])
    gate["fabric"] = rules.worst(unplaced, default="pass") in GATE_VERDICTS[gate["fail_on"]]
    gate["failed"] = gate["failed"] or gate["fabric"]
    doc["summary"]["verdict"] = rules.worst([doc["summary"]["verdict"], section["verdict"]])
    return doc


def load_schema():
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        return json.load(fh)


@functools.lru_cache(maxsize=None)
def _validator():
    jsonschema = require("jsonschema")  # controller only: a dependency of the project, not of the nodes or Ansible

    # Refs inlined once (schema_inline.py): their lookups were half of a 32-node report's validation.
    return jsonschema.Draft202012Validator(inline_refs(load_schema()))


def validation_errors(report):
    """Every schema violation as 'path: message' (empty list = valid)."""
    errors = sorted(_validator().iter_errors(report), key=lambda e: list(e.absolute_path))
    return ["%s: %s" % ("/".join(str(p) for p in e.absolute_path) or "<root>", e.message) for e in errors]


def validate_report(report):
    errors = validation_errors(report)
    if errors:
        raise ReportError("report.json does not match report_schema.json %s: %s" % (
            SCHEMA_VERSION, "; ".join(errors[:10])))


def to_json(report):
    return json.dumps(report, indent=2, sort_keys=False, ensure_ascii=False, allow_nan=False) + "\n"


# --------------------------------------------------------------------------------------------------------------------
# atomic files


def _fsync_dir(path):
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename itself is still atomic
    finally:
        os.close(fd)


def write_atomic(path, text):
    """Write text to path so that readers see either the old file or the complete new one, never a torn file."""
    path = Path(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, str(path))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def swap_link(link, target):
    """Point `link` at `target` (relative) atomically: a new link under a temp name, then rename over the old one."""
    link = Path(link)
    tmp = link.with_name(".%s.%d.tmp" % (link.name, os.getpid()))
    try:
        os.unlink(str(tmp))
    except OSError:
        pass
    os.symlink(str(target), str(tmp))
    try:
        if link.is_dir() and not link.is_symlink():
            raise ReportError("%s is a real directory, not the latest link: move it away" % link)
        os.replace(str(tmp), str(link))
    except BaseException:
        try:
            os.unlink(str(tmp))
        except OSError:
            pass
        raise
    _fsync_dir(link.parent)


def render_all(report):
    """{file name: text} for every file of the report, rendered from the (validated) report dict."""
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils import render_html, render_junit, render_md

    return {
        "report.json": to_json(report),
        "report.md": render_md.render(report),
        "report.html": render_html.render(report),
        "junit.xml": render_junit.render(report),
    }


def write_report(report, report_dir, latest=True, inputs=None, validate=True):
    """Validate, render, write every file atomically under report_dir/run_id, then swap report_dir/latest.

    validate=False: the caller validated this very document (validation is most of the writing's time at 32 nodes).
    inputs: the per-host observations the report judged ({host: gpufleet_* data}), kept as inputs.json so that the
    verdicts can be recomputed later (other thresholds, a newer rule) and test fixtures recorded from real runs.
    Returns {"run_dir", "files": {name: path}, "latest"}.
    """
    if validate:
        validate_report(report)
    rendered = render_all(report)
    report_dir = Path(report_dir)
    run_dir = report_dir / report["run_id"]
    run_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    if inputs is not None:
        files["inputs.json"] = str(write_atomic(run_dir / "inputs.json", json.dumps(
            {"run_id": report["run_id"], "playbook": report.get("playbook"), "hosts": inputs}, sort_keys=True,
            default=str) + "\n"))
    # report.json last: a run directory with report.json is a complete report.
    for name in ("report.md", "report.html", "junit.xml", "report.json"):
        files[name] = str(write_atomic(run_dir / name, rendered[name]))
    link = None
    if latest:
        link = report_dir / "latest"
        swap_link(link, report["run_id"])
    return {"run_dir": str(run_dir), "files": files, "latest": str(link) if link else None}


def evaluate_fleet(hosts, hostvars, play_hosts=None):
    """hosts: names; hostvars: {host: plain dict}; play_hosts: hosts still in the play (None when unknown)."""
    nodes = []
    for host in hosts:
        in_play = None if play_hosts is None else host in play_hosts
        nodes.append(rules.evaluate_node(host, hostvars.get(host) or {}, in_play))
    return nodes
