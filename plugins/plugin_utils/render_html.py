# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""report.html from report.json: ONE self-contained file (inline CSS, inline SVG, a few lines of inline script;
no external assets), rendered with Jinja2 from templates/report.html.j2 with autoescaping on."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import NODE_VERDICTS
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import render_md, render_svg, report_format

TEMPLATES = Path(__file__).with_name("templates")
VERDICT_ORDER = NODE_VERDICTS


def _environment():
    import jinja2  # controller only
    from markupsafe import Markup  # Jinja2's own dependency

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = _fmt
    env.filters["count"] = report_format.count
    return env, Markup


def _fmt(value, digits=1):
    return report_format.number(value, digits)


def _node_charts(node, markup):
    series = node.get("series") or {}
    labels = {str(g["index"]): "GPU %s" % report_format.count(g["index"]) for g in node["gpus"]}
    charts = {}
    temps = series.get("temperature_c") or {}
    limit = series.get("temperature_limit_c")
    charts["temperature"] = markup(render_svg.line_chart(
        temps, "Temperature under load", "°C", "s", threshold=limit,
        threshold_label="limit %s °C" % _fmt(limit) if limit is not None else None, labels=labels))
    gflops = series.get("gflops") or {}
    if gflops:
        # Gflop/s over the burn per GPU: a GPU that drops out or throttles shows where it happened.
        charts["throughput"] = markup(render_svg.line_chart(gflops, "gpu-burn Gflop/s over the burn", "Gflop/s",
                                                            "% of burn", labels=labels))
    else:
        rows = [{"label": "GPU %s" % report_format.count(g["index"]), "value": g["metrics"].get("burn_gflops"),
                 "verdict": g["verdict"], "note": "mean %s Gflop/s, max %s" % (
                     _fmt(g["metrics"].get("burn_gflops")), _fmt(g["metrics"].get("burn_gflops_max")))}
                for g in node["gpus"] if g["metrics"].get("burn_gflops") is not None
                and report_format.lost_finding(g) is None]
        charts["throughput"] = markup(render_svg.hbar_chart(rows, "gpu-burn throughput per GPU (mean)", "Gflop/s"))
    return charts


def _busbw_rows(nodes):
    rows = []
    for node in nodes:
        check = (node.get("checks") or {}).get("nccl_test")
        if not check or check["verdict"] == "skipped":
            continue
        fig = check.get("figures") or {}
        rows.append({"label": node["host"], "value": fig.get("busbw_gbps"), "threshold": fig.get("min_busbw_gbps"),
                     "verdict": check["verdict"], "note": str(fig.get("threshold_source") or "")})
    return rows


def _history(node, markup):
    """The trend view of one node: corrected ECC per day per GPU over the history (the curve that shows the slow
    leak accelerating), the previous run and the changes since. None when the run had no history."""
    hist = node.get("history")
    if not hist:
        return None
    labels = {str(g["index"]): "GPU %s" % g["index"] for g in node["gpus"]}
    chart = render_svg.line_chart(hist.get("ecc_per_day") or {}, "Corrected ECC errors per day (history)",
                                  "/day", "days before this run", labels=labels)
    return {"ecc_chart": markup(chart) if chart else None, "ecc_note": None if chart else _no_curve(node),
            "previous": hist.get("previous"), "changes": hist.get("changes") or [], "lifecycle": hist.get("lifecycle")}


def _no_curve(node):
    """Why there is no ECC curve, true beside the node's own findings: the history may be too short for a curve while
    this run already found the ECC rising (a card must never say "no ECC errors" next to an ECC finding)."""
    ecc = sorted({f["code"] for f in node["findings"] if "ECC" in f["code"] or f["code"].startswith("XID92")})
    if ecc:
        return ("No ECC curve yet: the history holds no two readings of a rising corrected-ECC counter of this node. "
                "This run's ECC findings are below: %s." % ", ".join(ecc))
    return "No rise of corrected ECC between this node's readings in the history."


def _fabric_matrix(section):
    """{nodes (by leaf, then name), cells {a: {b: pair}}}: each pair's latest test, in both halves of the matrix."""
    if not section:
        return {"nodes": [], "cells": {}}
    leaves = section.get("leaves") or {}
    cells = {}
    for pair in section["pairs"]:
        a, b = pair["nodes"]
        cells.setdefault(a, {})[b] = pair
        cells.setdefault(b, {})[a] = pair
    nodes = sorted(set(leaves) | set(cells), key=lambda n: (str(leaves.get(n) or ""), n))
    return {"nodes": nodes, "cells": cells}


def render(report):
    report = report_format.printable_tree(report)  # autoescaping does not touch control characters
    env, markup = _environment()
    nodes = report["nodes"]
    context = {
        "report": report,
        "summary": report["summary"],
        "verdict_order": VERDICT_ORDER,
        "colors": render_svg.VERDICT_COLORS,
        "stack": markup(render_svg.stacked_bar(report["summary"]["verdicts"], VERDICT_ORDER)),
        "gpu_stack": markup(render_svg.stacked_bar(report["summary"]["gpu_verdicts"], VERDICT_ORDER)),
        "busbw": markup(render_svg.hbar_chart(_busbw_rows(nodes), "NCCL all_reduce bus bandwidth vs threshold",
                                              "GB/s")),
        "busbw_rows": _busbw_rows(nodes),
        "timeline": markup(render_svg.xid_timeline(nodes)),
        "charts": {n["host"]: _node_charts(n, markup) for n in nodes},
        "history": {n["host"]: _history(n, markup) for n in nodes},
        "summary_md": render_md.summary_table(report),
        "fabric_matrix": _fabric_matrix(report.get("fabric")),
        "times": report_format.run_times(report),
        # {host: {gpu index: the finding that says it is lost}}: such a card shows LOST, never an older figure.
        "lost": {n["host"]: {g["index"]: f for g in n["gpus"] for f in [report_format.lost_finding(g)] if f}
                 for n in nodes},
    }
    return env.get_template("report.html.j2").render(**context)
