# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Inline SVG charts for report.html (no external assets, no script needed to draw them).

Each function returns an SVG string; every text that comes from data is escaped here.
"""

from __future__ import annotations

import math
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d",
           "#475569", "#ea580c", "#0d9488", "#9333ea")
VERDICT_COLORS = {"pass": "#1a7f37", "warn": "#b58100", "error": "#8250df", "fail": "#cf222e",
                  "unreachable": "#57606a", "skipped": "#8c959f", "info": "#8c959f", "critical": "#cf222e",
                  "warning": "#b58100", "unknown": "#8250df"}


def _nice_ticks(lo, hi, count=5):
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    value = start
    while True:
        ticks.append(round(value, 10))
        if value >= hi - step * 0.001:
            return ticks
        value += step


def _fmt(value):
    if abs(value) >= 1000:
        return "%.0f" % value
    if float(value).is_integer():
        return "%d" % value
    return "%.1f" % value


def line_chart(series, title, y_unit, x_unit="s", threshold=None, threshold_label=None, width=600, height=220,
               labels=None):
    """series: {name: [[x, y], ...]}; a dashed red line at `threshold`. Returns '' when there is nothing to draw."""
    points = {k: [(float(x), float(y)) for x, y in v if y is not None] for k, v in series.items()}
    points = {k: v for k, v in points.items() if v}
    if not points:
        return ""
    xs = [x for v in points.values() for x, _ in v]
    ys = [y for v in points.values() for _, y in v]
    if threshold is not None:
        ys.append(float(threshold))
    x0, x1 = min(xs), max(xs)
    if x1 <= x0:
        x1 = x0 + 1.0
    yticks = _nice_ticks(min(ys) - (max(ys) - min(ys)) * 0.05, max(ys) + (max(ys) - min(ys)) * 0.05 + 1e-9)
    y0, y1 = yticks[0], yticks[-1]
    left, right, top, bottom = 46, 12, 40, 30
    legend_h = 18 * math.ceil(len(points) / 6)
    pw, ph = width - left - right, height - top - bottom

    def sx(x):
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y):
        return top + ph - (y - y0) / (y1 - y0) * ph

    out = ['<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" role="img" aria-label="%s">'
           % (width, height + legend_h, escape(title)),
           '<text x="%d" y="16" class="ctitle">%s</text>' % (left, escape(title))]
    for tick in yticks:
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="grid"/>' % (left, left + pw, sy(tick), sy(tick)))
        out.append('<text x="%d" y="%.1f" class="tick" text-anchor="end">%s</text>' % (left - 5, sy(tick) + 4,
                                                                                      escape(_fmt(tick))))
    for tick in _nice_ticks(x0, x1, 6):
        if x0 <= tick <= x1:
            out.append('<text x="%.1f" y="%d" class="tick" text-anchor="middle">%s</text>' % (
                sx(tick), top + ph + 16, escape(_fmt(tick))))
    out.append('<text x="%d" y="%d" class="tick" text-anchor="end">%s</text>' % (left + pw, top + ph + 28,
                                                                                escape(x_unit)))
    out.append('<text x="%d" y="%d" class="tick" text-anchor="end">%s</text>' % (left - 5, top - 12, escape(y_unit)))
    if threshold is not None:
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="limit"><title>%s</title></line>' % (
            left, left + pw, sy(threshold), sy(threshold), escape(threshold_label or "limit %s" % threshold)))
        out.append('<text x="%d" y="%.1f" class="limitlabel" text-anchor="end">%s</text>' % (
            left + pw - 2, sy(threshold) - 4, escape(threshold_label or _fmt(threshold))))
    for i, (name, pts) in enumerate(sorted(points.items(), key=lambda kv: _sort_key(kv[0]))):
        color = PALETTE[i % len(PALETTE)]
        path = " ".join("%s%.1f,%.1f" % ("M" if j == 0 else "L", sx(x), sy(y)) for j, (x, y) in enumerate(pts))
        label = (labels or {}).get(name, name)
        out.append('<path d="%s" stroke="%s" class="series"><title>%s: max %s %s</title></path>' % (
            path, color, escape(label), _fmt(max(y for _, y in pts)), escape(y_unit)))
        lx, ly = left + (i % 6) * 92, height + 6 + 18 * (i // 6)
        out.append('<rect x="%d" y="%d" width="12" height="4" fill="%s"/><text x="%d" y="%d" class="tick">%s</text>'
                   % (lx, ly, color, lx + 16, ly + 6, escape(label)))
    out.append("</svg>")
    return "\n".join(out)


def _sort_key(name):
    try:
        return (0, float(name), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(name))


def hbar_chart(rows, title, unit, width=640):
    """rows: [{label, value, threshold, verdict, note}] -> horizontal bars with the threshold as a tick mark."""
    rows = [r for r in rows if r.get("value") is not None or r.get("threshold") is not None]
    if not rows:
        return ""
    top, row_h, left, right = 28, 28, 150, 150
    height = top + row_h * len(rows) + 20
    vmax = max([r.get("value") or 0 for r in rows] + [r.get("threshold") or 0 for r in rows]) * 1.08 or 1.0
    pw = width - left - right
    out = ['<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" role="img" aria-label="%s">'
           % (width, height, escape(title)), '<text x="8" y="16" class="ctitle">%s</text>' % escape(title)]
    for i, r in enumerate(rows):
        y = top + i * row_h
        color = VERDICT_COLORS.get(r.get("verdict"), "#2563eb")
        out.append('<text x="%d" y="%d" class="tick" text-anchor="end">%s</text>' % (left - 8, y + 15,
                                                                                    escape(str(r["label"]))))
        out.append('<rect x="%d" y="%d" width="%d" height="18" class="track"/>' % (left, y + 2, pw))
        if r.get("value") is not None:
            w = max(1.0, r["value"] / vmax * pw)
            out.append('<rect x="%d" y="%d" width="%.1f" height="18" fill="%s" rx="2"><title>%s</title></rect>' % (
                left, y + 2, w, color, escape(r.get("note") or "")))
        if r.get("threshold") is not None:
            tx = left + r["threshold"] / vmax * pw
            out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" class="limit2"><title>threshold %s %s</title>'
                       '</line>' % (tx, tx, y, y + 22, _fmt(r["threshold"]), escape(unit)))
        text = "%s %s" % (_fmt(r["value"]), unit) if r.get("value") is not None else "no figure"
        if r.get("threshold") is not None:
            text += " / min %s" % _fmt(r["threshold"])
        out.append('<text x="%d" y="%d" class="tick">%s</text>' % (left + pw + 8, y + 15, escape(text)))
    out.append("</svg>")
    return "\n".join(out)


def xid_timeline(nodes, width=900):
    """One row per node with XID events; x is time (seconds, relative to the earliest event)."""
    rows = [(n["host"], [e for e in n.get("xid_timeline") or [] if e.get("time_s") is not None]) for n in nodes]
    rows = [(h, ev) for h, ev in rows if ev]
    if not rows:
        return ""
    t0 = min(e["time_s"] for _, ev in rows for e in ev)
    t1 = max(e["time_s"] for _, ev in rows for e in ev)
    span = max(t1 - t0, 1.0)
    left, right, top, row_h = 150, 30, 30, 34
    height = top + row_h * len(rows) + 30
    pw = width - left - right
    out = ['<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" role="img" '
           'aria-label="XID timeline">' % (width, height),
           '<text x="8" y="16" class="ctitle">XID events (time since the first one)</text>']
    for tick in _nice_ticks(0, span, 8):
        if tick <= span:
            x = left + tick / span * pw
            out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" class="grid"/>' % (x, x, top, height - 24))
            out.append('<text x="%.1f" y="%d" class="tick" text-anchor="middle">%s s</text>' % (x, height - 10,
                                                                                           escape(_fmt(tick))))
    for i, (host, events) in enumerate(rows):
        y = top + i * row_h + row_h / 2
        out.append('<text x="%d" y="%.1f" class="tick" text-anchor="end">%s</text>' % (left - 8, y + 4, escape(host)))
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="grid"/>' % (left, left + pw, y, y))
        for e in events:
            x = left + (e["time_s"] - t0) / span * pw
            color = VERDICT_COLORS.get(str(e.get("severity") or "").lower(), "#cf222e")
            tip = "XID %s GPU %s %s: %s" % (e.get("xid"), e.get("gpu") if e.get("gpu") is not None else "?",
                                           e.get("pci") or "", e.get("message") or "")
            out.append('<circle cx="%.1f" cy="%.1f" r="7" fill="%s" class="xid"><title>%s</title></circle>' % (
                x, y, color, escape(tip)))
            out.append('<text x="%.1f" y="%.1f" class="xidlabel" text-anchor="middle">%s</text>' % (
                x, y - 10, escape(str(e.get("xid")))))
    out.append("</svg>")
    return "\n".join(out)


def stacked_bar(counts, order):
    """Verdict counts as one horizontal bar (HTML flex boxes: text stays crisp at any width)."""
    total = sum(counts.get(k, 0) for k in order)
    if not total:
        return ""
    out = ['<div class="stack" role="img" aria-label="verdicts">']
    for key in order:
        n = counts.get(key, 0)
        if n:
            out.append('<div style="flex:%d;background:%s" title="%d %s">%s</div>' % (
                n, VERDICT_COLORS.get(key, "#999"), n, escape(key), "%d %s" % (n, escape(key)) if n / total > 0.06
                else ""))
    out.append("</div>")
    return "".join(out)
