# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The post-mortem document: postmortem.json (versioned schema, validated before writing), .md and .html from it.

Files are written like the fleet report's (report.write_atomic: temp file, fsync, rename) under
<report_dir>/<run_id>/, JSON last, then <report_dir>/latest is swapped to the run.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.plugin_utils import report as fleet_report
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.packages import require
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import findings as findings_mod
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem.hardware import rel_text
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.render_md import cell, code, text
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.report_format import printable_tree

SCHEMA_VERSION = "2.0"  # 2.0: hardware issues carry judge_xid's code and severity
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "postmortem_schema.json"
GENERATOR = "kentino.gpufleet.job_postmortem"
TEMPLATE = "postmortem.html.j2"
FILES = ("postmortem.json", "postmortem.md", "postmortem.html")


class DocumentError(Exception):
    """A post-mortem that cannot be written as asked (bad run id, invalid JSON against the schema)."""


def _iso(epoch):
    if not isinstance(epoch, (int, float)):
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat(timespec="milliseconds")


def _rank_rows(result):
    flight = result.get("flight") or {}
    root = next((g for g in flight.get("groups") or [] if g["key"] == flight.get("root_group")), None)
    default = next((g for g in flight.get("groups") or [] if g.get("desc") == "default_pg"), None)
    group = root or default
    with_dump = set(flight.get("ranks_with_dump") or [])
    refused = {r["rank"] for r in flight.get("refused") or []}
    culprits = set(result["verdict"].get("ranks") or [])
    ranks = set(result["ranks"]) | with_dump | refused | set((group or {}).get("members") or [])
    if isinstance(result.get("world_size"), int) and result["world_size"] <= 100000:
        ranks |= set(range(result["world_size"]))
    no_evidence = set(result["hosts_without_evidence"])
    rows = []
    for rank in sorted(ranks):
        info = result["ranks"].get(rank) or {}
        cand = next((c for c in result["candidates"] if c["rank"] == rank), None)
        gpu = (cand or {}).get("gpu") or result.get("rank_gpus", {}).get(rank) or {}
        dump = "present" if rank in with_dump else "refused" if rank in refused else \
            "missing" if flight else "none"
        role = "culprit" if rank in culprits else "no_evidence" if info.get("host") in no_evidence else \
            "waiting" if (group and rank in (group.get("status") or {})) or rank in (
                result["logs"].get("ranks_reporting") or []) else "unknown"
        rows.append({"rank": rank, "host": info.get("host"), "local_rank": info.get("local_rank"),
                     "gpu": gpu.get("index"), "pci": gpu.get("pci"), "basis": list(info.get("basis") or []),
                     "dump": dump, "status": (group or {}).get("status", {}).get(rank), "role": role})
    return rows


def _issues(result):
    out = []
    for host, issues in sorted(result["hardware"].items()):
        for i in issues:
            out.append({"host": host, "kind": i["kind"], "code": i["code"], "severity": i["severity"],
                        "gpus": i["gpus"], "pcis": i["pcis"], "xids": i["xids"],
                        "t_rel_s": i["t_rel_s"], "time": _iso(i["epoch"]), "description": i.get("description"),
                        "action": i["action"], "lines": [str(x)[:500] for x in i["lines"]]})
    return out


def _flight(result):
    flight = result.get("flight")
    if not flight:
        return None
    groups = [{k: g[k] for k in ("key", "name", "desc", "stuck_seq", "stuck_op", "never_joined", "late_joined",
                                  "not_started", "missing_dump", "refused_dump", "mismatch")} | {"size": len(g["members"])}
              for g in flight["groups"]]
    return {"ranks_with_dump": flight["ranks_with_dump"], "versions": flight["versions"], "groups": groups,
            "root_group": flight["root_group"], "first_mismatch": flight["first_mismatch"],
            "refused": flight["refused"], "problems": flight["problems"]}


def build(result, run_id, created=None):
    """The post-mortem dict (see postmortem_schema.json) from analysis.analyse()."""
    v = dict(result["verdict"])
    v.pop("t_ref", None)
    found = findings_mod.build(result)
    counts = {}
    for f in found:
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    window = dict(result["window"])
    window.update({"since_iso": _iso(window["since"]), "until_iso": _iso(window["until"]),
                   "t_fire_iso": _iso(window["t_fire"])})
    flight = _flight(result)
    rows = _rank_rows(result)
    hosts = sorted(set(result["hosts_ok"]) | set(result["hosts_without_evidence"]))
    return {
        "schema_version": SCHEMA_VERSION, "generator": GENERATOR, "run_id": str(run_id),
        "created": created or fleet_report.now_iso(),
        "job": {"hosts": hosts, "world_size": result["world_size"], "world_size_basis": result["world_size_basis"],
                "window": window},
        "verdict": v, "findings": found,
        "summary": {"verdict": v["kind"], "confidence": v["confidence"], "findings": counts, "hosts": len(hosts),
                    "hosts_without_evidence": len(result["hosts_without_evidence"]), "ranks": len(rows),
                    "dumps": len((flight or {}).get("ranks_with_dump") or []),
                    "dumps_refused": len((flight or {}).get("refused") or []),
                    "timeouts": result["logs"].get("timeouts") or 0},
        "ranks": rows, "hardware": _issues(result), "flight": flight,
        "logs": {k: result["logs"][k] for k in ("culprit", "silent_ranks", "ranks_reporting", "timeouts",
                                                 "timed_out_seqs", "ops", "heartbeat_kills", "desync", "backends",
                                                 "named")}
        | {"counts": result["merged_counts"], "evidence": result["log_evidence"]},
        "hosts": [{"host": h, "evidence": h in result["hosts_ok"], "reason": result["hosts_without_evidence"].get(h),
                   "errors": list(result["errors"].get(h) or []), "clock_skew_s": result["clock"].get(h)}
                  for h in hosts],
        "notes": list(result["notes"]),
    }


def validation_errors(doc):
    jsonschema = require("jsonschema")  # controller only

    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        schema = json.load(fh)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    return ["%s: %s" % ("/".join(str(p) for p in e.absolute_path) or "<root>", e.message) for e in errors]


def validate(doc):
    errors = validation_errors(doc)
    if errors:
        raise DocumentError("postmortem.json does not match postmortem_schema.json %s: %s"
                            % (SCHEMA_VERSION, "; ".join(errors[:10])))


def to_json(doc):
    return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False, default=str) + "\n"


def summary_line(doc):
    v = printable_tree(doc["verdict"])
    return "Job post-mortem %s: %s (confidence %s): %s" % (doc["run_id"], v["kind"].upper(), v["confidence"],
                                                          v["message"])


def render_md(doc):
    doc = printable_tree(doc)
    v, w = doc["verdict"], doc["job"]["window"]
    out = ["# Job post-mortem %s" % doc["run_id"], "",
           "- hosts: %s" % (text(", ".join(doc["job"]["hosts"])) or "-"),
           "- world size: %s (%s)" % (doc["job"]["world_size"] or "unknown", doc["job"]["world_size_basis"] or "-"),
           "- window: %s .. %s (%s); T = %s, when the watchdog fired" % (
               w["since_iso"] or "-", w["until_iso"] or "-", w["basis"] or "no timestamps", w["t_fire_iso"] or "?"),
           "", "## Verdict: %s (confidence %s)" % (v["kind"].upper(), v["confidence"]), "", text(v["message"]), "",
           "**Action:** %s" % text(v["action"]), ""]
    if v["evidence"]:
        out += ["```"] + [line.replace("```", "'''") for line in v["evidence"]] + ["```", ""]
    out += ["## Findings", "", "| severity | code | message | action |", "|---|---|---|---|"]
    for f in doc["findings"]:
        out.append("| %s | %s | %s | %s |" % (f["severity"].upper(), code(f["code"]), cell(f["message"], 300),
                                              cell(f["action"], 300)))
    if doc["hardware"]:
        out += ["", "## GPU events in the window", "", "| node | GPU | PCI | XID | when | what |", "|---|---|---|---|---|---|"]
        for i in doc["hardware"]:
            out.append("| %s | %s | %s | %s | %s | %s |" % (cell(i["host"]), ",".join(str(g) for g in i["gpus"]),
                                                            cell(",".join(str(p) for p in i["pcis"])),
                                                            ",".join(str(x) for x in i["xids"]), rel_text(i["t_rel_s"]),
                                                            cell(i["description"], 300)))
    out += ["", "## Ranks", "", "| rank | node | local | GPU | PCI | dump | enqueued | completed | role |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["ranks"][:1024]:
        st = r["status"] or {}
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["rank"], cell(r["host"] or "?"), _dash(r["local_rank"]), _dash(r["gpu"]), cell(r["pci"]), cell(r["dump"]),
            _dash(st.get("last_enqueued")), _dash(st.get("last_completed")), r["role"]))
    return "\n".join(out).rstrip() + "\n"


def _dash(value):
    return "-" if value is None else str(value)




def render_html(doc):
    import jinja2  # controller only
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.render_html import TEMPLATES

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["rel"] = rel_text
    env.filters["dash"] = _dash
    doc = printable_tree(doc)  # autoescaping does not touch control characters
    return env.get_template(TEMPLATE).render(doc=doc, v=doc["verdict"], w=doc["job"]["window"])


def write(doc, report_dir, latest=True):
    """Validate, render, write atomically under report_dir/run_id, then swap report_dir/latest."""
    if not fleet_report.RUN_ID_RE.match(doc["run_id"]):
        raise DocumentError("run_id %r is not a safe directory name (letters, digits, . _ -)" % doc["run_id"])
    validate(doc)
    rendered = {"postmortem.md": render_md(doc), "postmortem.html": render_html(doc), "postmortem.json": to_json(doc)}
    run_dir = Path(report_dir) / doc["run_id"]
    run_dir.mkdir(parents=True, exist_ok=True)
    files = {name: str(fleet_report.write_atomic(run_dir / name, rendered[name])) for name in FILES[1:] + FILES[:1]}
    link = None
    if latest:
        link = Path(report_dir) / "latest"
        fleet_report.swap_link(link, doc["run_id"])
    return {"run_dir": str(run_dir), "files": files, "latest": str(link) if link else None}
