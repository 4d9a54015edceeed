# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Alertmanager's webhook alerts (controller side): which alert of a node's group is the finding to quarantine for.

Alertmanager writes `startsAt` as Go's time.Time in JSON (RFC 3339 with nanoseconds, trailing zeros dropped): one
alert says `10:00:00Z`, the next `10:00:00.5Z` or `10:00:00.123456789Z`, and other senders give offsets
(`+01:00`). Sorted as text those order wrongly ('Z' sorts after '.', 11:00+01:00 after 10:30Z), so the time is
parsed, to the nanosecond, before the newest alert is chosen.

An alert keeps its `startsAt` while it fires, also through a second XID of the same code on the same GPU. The XID
rules' annotation `last_event_epoch` (the watcher's time of the newest such XID, at each evaluation; Alertmanager's
repeats carry the newest annotations) is that second fault's time: an alert's fault time is the later of the two.
"""

from __future__ import annotations

import calendar
import datetime
import math
import re

RFC3339 = re.compile(r"\A(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))\Z")


class AlertError(ValueError):
    """An alert the quarantine cannot act on: the message names the alert and what is wrong."""


def rfc3339_ns(text):
    """An RFC 3339 time as integer nanoseconds since the epoch (exact, so a nanosecond apart still orders)."""
    found = RFC3339.match(text) if isinstance(text, str) else None
    if not found:
        raise AlertError("%r is not an RFC 3339 time (such as 2026-12-01T10:00:00.5Z or 2026-12-01T11:00:00+01:00)"
                         % (text,))
    year, month, day, hour, minute, second = (int(found.group(i)) for i in range(1, 7))
    try:  # a leap second (60) is allowed, as RFC 3339 does
        datetime.datetime(year, month, day, hour, minute, min(second, 59))
    except ValueError:
        raise AlertError("%r is not a valid RFC 3339 time" % (text,)) from None
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if found.group(9):
        offset = int(found.group(10)) * 3600 + int(found.group(11)) * 60
        seconds -= offset if found.group(9) == "+" else -offset
    return seconds * 10**9 + int((found.group(7) or "").ljust(9, "0"))


def last_event_ns(alert):
    """The alert's `last_event_epoch` annotation as integer nanoseconds, or None where it is absent or empty (rules
    older than it, or a series gone at that evaluation)."""
    text = (alert.get("annotations") or {}).get("last_event_epoch")
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise AlertError("annotation last_event_epoch %r is not a time in epoch seconds (such as 1764583200.250)"
                         % (text,))
    return int(round(value * 1e9))


def newest(alerts):
    """The alert with the latest fault time (the later of `startsAt` and `last_event_epoch`; the first of equals),
    checked: a list of alerts, each with labels. Returns (alert, its fault time in ns)."""
    if not isinstance(alerts, list) or not alerts:
        raise AlertError("expected Alertmanager's alerts (a non-empty list), got %r" % (alerts,))
    best, best_ns = None, None
    for alert in alerts:
        if not isinstance(alert, dict) or not isinstance(alert.get("labels"), dict):
            raise AlertError("an alert without labels: %r" % (alert,))
        name = "alert %s of %s" % (alert["labels"].get("alertname", "?"), alert["labels"].get("instance", "?"))
        try:
            ns = rfc3339_ns(alert.get("startsAt"))
        except AlertError as exc:
            raise AlertError("%s: startsAt %s" % (name, exc)) from None
        try:
            ns = max(ns, last_event_ns(alert) or 0)
        except AlertError as exc:
            raise AlertError("%s: %s" % (name, exc)) from None
        if best_ns is None or ns > best_ns:
            best, best_ns = alert, ns
    return best, best_ns


def finding(alerts):
    """What the quarantine records for a node's alerts: the newest alert's XID as the finding code, its GPU, its
    summary, and when its fault happened (`started`, epoch seconds, for the lifecycle's already-handled rule; `at`,
    the same in UTC for messages)."""
    alert, ns = newest(alerts)
    labels = alert["labels"]
    xid = str(labels.get("xid") or "")
    return {"code": "XID_%s" % xid if xid.isdigit() else "XID_CRITICAL", "gpu": str(labels.get("gpu") or ""),
            "reason": "Alertmanager %s: %s" % (labels.get("alertname", "alert"),
                                               (alert.get("annotations") or {}).get("summary", "")),
            "started": ns / 1e9, "startsAt": alert["startsAt"],
            "at": datetime.datetime.fromtimestamp(ns // 10**9, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
