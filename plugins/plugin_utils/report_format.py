# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""How the report's values read to a person, shared by report.md, report.html and the console summary: times in
UTC with the zone, the run's duration, counts as integers, figures without float noise, whether a GPU was lost, and
text from nodes made safe to show (printable: every renderer passes its document through printable_tree).

Nothing here judges: a GPU is "lost" when a judge said so with one of LOST_CODES on that GPU.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone

# Findings that mean the GPU is gone from the bus (judge_xid): its card shows LOST, never a figure it had before.
LOST_CODES = ("GPU_LOST", "PSU_RAIL_LOSS", "GPU_GROUP_LOST")


def parse_time(value):
    """An ISO 8601 time (report.json's started/finished) as an aware UTC datetime, else None. A time without a zone
    is taken as UTC (the collection writes every time in UTC)."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc)


def utc_text(value):
    """'2026-11-29 09:00:00 UTC' for an ISO time; the value as it is when it is not one (never raises)."""
    when = parse_time(value)
    if when is None:
        return str(value) if value not in (None, "") else "unknown"
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def epoch_text(seconds, with_ms=False):
    """'2026-11-29 09:00:05 UTC' for epoch seconds (the XID timeline's time_s)."""
    when = datetime.fromtimestamp(float(seconds), tz=timezone.utc)
    if with_ms:
        return when.strftime("%Y-%m-%d %H:%M:%S.") + "%03d UTC" % (when.microsecond // 1000)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def duration_text(seconds):
    """'45 s', '2 min 13 s', '1 h 12 min', '3 d 4 h': two units at most, the larger first."""
    if seconds is None or not isinstance(seconds, (int, float)) or math.isnan(seconds) or seconds < 0:
        return "unknown"
    seconds = int(round(seconds))
    if seconds < 60:
        return "%d s" % seconds
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return "%d min %d s" % (minutes, sec) if sec else "%d min" % minutes
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return "%d h %d min" % (hours, minutes) if minutes else "%d h" % hours
    days, hours = divmod(hours, 24)
    return "%d d %d h" % (days, hours) if hours else "%d d" % days


def run_times(report):
    """{started, finished, duration}: UTC texts and the run's duration (None when the start is not known: a report
    whose start was never recorded carries its finish time as both)."""
    start, end = parse_time(report.get("started")), parse_time(report.get("finished"))
    duration = None
    if start is not None and end is not None and end > start:
        duration = duration_text((end - start).total_seconds())
    return {"started": utc_text(report.get("started")), "finished": utc_text(report.get("finished")),
            "duration": duration}


def count(value):
    """A count as an integer text: 2.0 (which JSON Schema's "integer" accepts) reads '2', never '2.0'."""
    if isinstance(value, bool) or value is None:
        return "0" if value is None else str(int(value))
    if isinstance(value, (int, float)) and not (isinstance(value, float) and (math.isnan(value) or
                                                                          math.isinf(value))):
        return "%d" % int(round(value))
    return str(value)


def number(value, digits=None):
    """A figure for people: integers as integers (30.0 -> '30'), other floats with at most `digits` decimals
    (default: as stored, which the judges already rounded); None -> '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value.is_integer():
            return "%d" % value
        if digits is not None:
            text = ("%." + str(int(digits)) + "f") % value
            return text.rstrip("0").rstrip(".") if "." in text else text
        return repr(value)
    return str(value)


def lost_finding(gpu):
    """The finding that says this report GPU is lost (GPU_LOST, PSU_RAIL_LOSS, GPU_GROUP_LOST on it), else None."""
    for f in gpu.get("findings") or []:
        if f.get("code") in LOST_CODES:
            return f
    return None


# Terminal escape sequences (CSI "ESC [ ... letter", OSC "ESC ] ... BEL or ESC \", two-byte "ESC x"): a tool's
# colours, cursor moves, window titles and links; `cat report.md` would replay them. Dropped.
_ESCAPE_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]{0,4096}(?:\x07|\x1b\\)?|[ -/]*[0-~])")
# Every other control character but tab and newline (C0, DEL, C1 such as the one-byte CSI 0x9b), the bidirectional
# overrides that reorder what a reader sees, and what XML 1.0 cannot carry.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ufffe\uffff]")


def _written_out(match):
    code = ord(match.group(0))
    return "\\x%02x" % code if code < 0x100 else "\\u%04x" % code


def printable(text):
    """Text from a node as it may be shown anywhere: escape sequences dropped, other control characters written out
    (\\x07, \\u202e), so the evidence still says what the tool printed but nothing in it acts on a terminal or a
    reader."""
    return _CONTROL.sub(_written_out, _ESCAPE_SEQUENCE.sub("", text))


def printable_tree(value):
    """printable() on every string of a JSON-like document (keys too); the document itself is left as it was."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_tree(k): printable_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_tree(v) for v in value]
    return value
