# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Inline SVG charts for report.html (no external assets, no script needed to draw them).

Each function returns an SVG string; every text that comes from data is escaped here.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from html import escape

from ansible_collections.kentino.gpufleet.plugins.plugin_utils import report_format

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
    pad = (max(ys) - min(ys)) * 0.05
    # A quantity that cannot be negative (temperature in C under load, Gflop/s) never gets an axis below 0.
    low = max(0.0, min(ys) - pad) if min(ys) >= 0 else min(ys) - pad
    yticks = _nice_ticks(low, max(ys) + pad + 1e-9)
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


# A wall-clock axis: ticks on whole steps in UTC, the smallest step whose labels fit side by side. Each step names the
# strftime of its label and of the second line (the date, or the year), shown at the first tick and where it changes.
_TIME_STEPS = (
    [(step, "%H:%M:%S", "%Y-%m-%d") for step in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)]
    + [(step, "%H:%M:%S", "%Y-%m-%d") for step in (1, 2, 5, 10, 15, 30)]
    + [(step, "%H:%M", "%Y-%m-%d") for step in (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)]
    + [(step, "%b %d", "%Y") for step in (86400, 172800, 345600, 604800, 1209600, 2419200)]
    + [(step, "%Y-%m-%d", None) for step in (7776000, 15552000, 31536000, 63072000, 157680000)]
)
# Width of one character of an axis label (11 px sans-serif; generous, so that estimates never undercount).
AXIS_CHAR_PX = 7.0
AXIS_GAP_PX = 10.0
_SEVERITY_RANK = {"info": 0, "warning": 1, "unknown": 2, "critical": 3}


def _tick_label(when, step, fmt):
    if step >= 1:
        return datetime.fromtimestamp(when, tz=timezone.utc).strftime(fmt)
    decimals = 3 if step < 0.01 else 2 if step < 0.1 else 1
    whole, frac = divmod(int(round(when * 10 ** decimals)), 10 ** decimals)
    return datetime.fromtimestamp(whole, tz=timezone.utc).strftime(fmt) + ".%0*d" % (decimals, frac)


def time_ticks(t0, t1, plot_px, char_px=AXIS_CHAR_PX, gap_px=AXIS_GAP_PX):
    """[(epoch seconds, label, second line or '')] for a UTC axis from t0 to t1 drawn `plot_px` wide: the smallest
    step (seconds, minutes, hours, days, years) at which at least two labels fit with `gap_px` between them."""
    span = float(t1) - float(t0)
    if span <= 0:
        return []
    for step, fmt, context in _TIME_STEPS:
        first = math.ceil(t0 / step - 1e-9) * step
        n = int(math.floor((t1 - first) / step + 1e-9)) + 1
        if n < 2 or n > 60:
            continue
        ticks = [first + i * step for i in range(n)]
        labels, previous = [], None
        for when in ticks:
            second = datetime.fromtimestamp(when, tz=timezone.utc).strftime(context) if context else ""
            labels.append((when, _tick_label(when, step, fmt), second if second != previous else ""))
            previous = second
        width = max(max(len(a), len(b)) for _, a, b in labels) * char_px
        if step / span * plot_px >= width + gap_px:
            return labels
    # Nothing fits (a very narrow chart): the two ends, full dates.
    return [(when, datetime.fromtimestamp(when, tz=timezone.utc).strftime("%Y-%m-%d"),
             datetime.fromtimestamp(when, tz=timezone.utc).strftime("%H:%M:%S")) for when in (t0, t1)]


def _cluster_label(events):
    counts = {}
    for e in events:
        counts[e.get("xid")] = counts.get(e.get("xid"), 0) + 1
    parts = ["%s×%d" % (code, n) if n > 1 else str(code) for code, n in counts.items()]
    return ", ".join(parts[:3]) + (", +%d" % (len(parts) - 3) if len(parts) > 3 else "")


def _clusters(marks, radius, char_px):
    """Events of one row as [(x, event)], sorted -> clusters whose circles and labels do not overlap."""
    clusters = [[m] for m in sorted(marks, key=lambda m: m[0])]

    def center(c):
        return (c[0][0] + c[-1][0]) / 2.0

    def width(c):
        return len(_cluster_label([e for _, e in c])) * char_px

    merged = True
    while merged and len(clusters) > 1:
        merged, out = False, [clusters[0]]
        for c in clusters[1:]:
            last = out[-1]
            if center(c) - center(last) < max(2 * radius + 3, (width(last) + width(c)) / 2.0 + 6):
                out[-1] = last + c
                merged = True
            else:
                out.append(c)
        clusters = out
    return [(center(c), [e for _, e in c]) for c in clusters]


# Epoch seconds before 2000 are not wall-clock times (seconds since boot, say): never drawn as a date in 1970.
_EPOCH_FLOOR = 946684800


def _wall_clock(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and value >= _EPOCH_FLOOR


def xid_timeline(nodes, width=900):
    """One row per node with timed XID events on a wall-clock axis (UTC, from the events' epoch `time_s`). Events
    closer than their marks are drawn as one mark labelled with each code and its count; the tooltip lists them."""
    rows = [(n["host"], [e for e in n.get("xid_timeline") or [] if _wall_clock(e.get("time_s"))]) for n in nodes]
    rows = [(h, ev) for h, ev in rows if ev]
    if not rows:
        return ""
    first = min(e["time_s"] for _, ev in rows for e in ev)
    last = max(e["time_s"] for _, ev in rows for e in ev)
    pad = (last - first) * 0.04 if last > first else 30.0
    t0, t1 = first - pad, last + pad
    left, right, top, row_h, radius = 150, 44, 46, 34, 7
    pw = width - left - right
    height = top + row_h * len(rows) + 40
    axis_y = top + row_h * len(rows)

    def sx(t):
        return left + (t - t0) / (t1 - t0) * pw

    span_text = "%s to %s" % (report_format.epoch_text(first), report_format.epoch_text(last)) if last > first \
        else report_format.epoch_text(first, with_ms=True)
    out = ['<svg class="chart xid-timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" role="img" '
           'aria-label="XID timeline">' % (width, height),
           '<text x="8" y="16" class="ctitle">XID events by time (UTC)</text>',
           '<text x="8" y="32" class="tick">%s</text>' % escape(span_text)]
    for when, label, second in time_ticks(t0, t1, pw):
        x = sx(when)
        out.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" class="grid"/>' % (x, x, top, axis_y))
        out.append('<text x="%.1f" y="%d" class="tick axis" text-anchor="middle">%s</text>' % (
            x, axis_y + 16, escape(label)))
        if second:
            out.append('<text x="%.1f" y="%d" class="tick axis" text-anchor="middle">%s</text>' % (
                x, axis_y + 30, escape(second)))
    out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" class="axisline"/>' % (left, left + pw, axis_y, axis_y))
    char_px = 6.5  # the marks' 10 px bold labels
    for i, (host, events) in enumerate(rows):
        y = top + i * row_h + row_h / 2
        out.append('<text x="%d" y="%.1f" class="tick" text-anchor="end">%s</text>' % (left - 8, y + 4, escape(host)))
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" class="grid"/>' % (left, left + pw, y, y))
        for x, group in _clusters([(sx(e["time_s"]), e) for e in events], radius, char_px):
            worst = max((str(e.get("severity") or "unknown").lower() for e in group),
                        key=lambda s: _SEVERITY_RANK.get(s, 2))
            color = VERDICT_COLORS.get(worst, "#cf222e")
            tips = ["%s XID %s GPU %s%s: %s" % (
                report_format.epoch_text(e["time_s"], with_ms=True), e.get("xid"),
                e.get("gpu") if e.get("gpu") is not None else "?", " (%s)" % e["pci"] if e.get("pci") else "",
                e.get("message") or "") for e in group[:12]]
            if len(group) > 12:
                tips.append("... and %d more" % (len(group) - 12))
            out.append('<circle cx="%.1f" cy="%.1f" r="%d" fill="%s" class="xid"><title>%s</title></circle>' % (
                x, y, radius, color, escape("\n".join(tips))))
            label = _cluster_label(group)
            half = len(label) * char_px / 2.0
            anchor, lx = "middle", x
            if x - half < left:
                anchor, lx = "start", max(x - radius, left - 4)
            elif x + half > left + pw:
                anchor, lx = "end", min(x + radius, left + pw + 4)
            out.append('<text x="%.1f" y="%.1f" class="xidlabel" text-anchor="%s">%s</text>' % (
                lx, y - 10, anchor, escape(label)))
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
