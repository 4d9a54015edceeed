# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The GPU evidence of the job's window on one node: the XIDs and lost GPUs, judged by judge_xid (pure).

The operator reads the same finding and the same action for an XID in the fleet report, in the post-mortem and in
the alerts' runbook: the findings here ARE judge_xid's (riser before RMA, PSU rails, memory faults that end in an
RMA, the slow ECC leak, the catalog's action for every other code; docs/failure-modes.md), judged with the node's
thresholds from the inventory (gpufleet_psu_rails, gpufleet_psu_loss_window_s, the XID lists and the severity
overrides). This module only turns them into the post-mortem's issues (one per GPU, one per rail or group of GPUs
lost together), dated relative to the hang and ranked for the verdict.
"""

from __future__ import annotations

import datetime

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_xid
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete
from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci

# judge_xid's code -> the issue's kind (postmortem_schema.json); XID_CRITICAL and XID_WARNING are "other", or
# "application" when NVIDIA's immediate action says the GPU is fine (restart the application, or ignore) and the
# judge only warns.
KIND = {"PSU_RAIL_LOSS": "psu_rail", "GPU_GROUP_LOST": "gpu_group", "GPU_LOST": "gpu_lost",
        "GPU_UNDERPOWERED": "gpu_lost", "XID_RMA": "rma", "ECC_LEAK": "ecc", "XID_CRITICAL": "other",
        "XID_WARNING": "other", "CHECK_ERROR": "other"}
GROUP_CODES = ("PSU_RAIL_LOSS", "GPU_GROUP_LOST")
APPLICATION_BUCKETS = ("RESTART_APP", "IGNORE")
# How strongly an issue explains a hang (the verdict blames the heaviest issue on a rank's GPU; 2+ is serious).
WEIGHT = {"psu_rail": 4, "gpu_group": 4, "gpu_lost": 3, "rma": 3, "ecc": 2, "other": 1, "application": 0}


def weight(issue):
    """An issue's weight: a failing 'other' XID (critical per the policy) weighs as much as an ECC leak."""
    if issue["kind"] == "other" and issue.get("severity") in ("fail", "error"):
        return 2
    return WEIGHT[issue["kind"]]


def _epoch(text):
    if not isinstance(text, str):
        return None
    try:
        value = datetime.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.timezone.utc)
    return value.timestamp()


def events_in_window(kernel, since=None, until=None):
    """Counted XID events of the node inside [since, until], each with `epoch`; events without a time are kept."""
    out, outside = [], 0
    for event in (kernel or {}).get("events") or []:
        if not isinstance(event, dict) or event.get("counted") is False:
            continue
        when = _epoch(event.get("time"))
        if when is not None and ((since is not None and when < since) or (until is not None and when > until)):
            outside += 1
            continue
        item = dict(event)
        item["epoch"] = when
        out.append(item)
    return out, outside


def _rel(when, t_ref):
    if when is None or t_ref is None:
        return None
    return round(when - t_ref, 1)


def rel_text(seconds):
    if seconds is None:
        return "at an unknown time"
    if abs(seconds) < 0.05:
        return "at T"
    return "at T%s%s s" % ("-" if seconds < 0 else "+", ("%.1f" % abs(seconds)).rstrip("0").rstrip("."))


def _kind(finding, event):
    kind = KIND.get(finding["code"], "other")
    if kind == "other" and finding["severity"] == "warn":
        bucket = ((event or {}).get("action") or {}) if isinstance((event or {}).get("action"), dict) else {}
        if bucket.get("immediate") in APPLICATION_BUCKETS:
            return "application"
    return kind


def _chosen(finding, evs, t):
    """The window's events of one GPU that led to this finding, oldest first."""
    codes = {"GPU_LOST": t["gpufleet_lost_xids"], "XID_RMA": t["gpufleet_rma_xids"],
             "ECC_LEAK": t["gpufleet_ecc_leak_xids"]}.get(finding["code"])
    if codes is not None:
        return [e for e in evs if e.get("xid") in codes and e.get("counted") is not False]
    lines = set(finding["evidence"])
    return [e for e in evs if str(e.get("line") or "")[:400] in lines]


def _gpu_issue(pci, findings, evs, t, t_ref, gpus_by_pci):
    """One GPU's issue: its heaviest finding (kind, code, severity, action) and every event of the window on it."""
    ranked = []
    for f in findings:
        chosen = _chosen(f, evs, t)
        issue = {"kind": _kind(f, chosen[0] if chosen else None), "severity": f["severity"]}
        ranked.append((weight(issue), -len(ranked), f, chosen))
    _w, _order, f, chosen = max(ranked)
    first = chosen[0] if chosen else (evs[0] if evs else {})
    kind = _kind(f, first)
    description = "GPU fell off the bus" if kind == "gpu_lost" else (first.get("mnemonic") or first.get("message")
                                                                      or f["message"])
    return {"kind": kind, "code": f["code"], "severity": f["severity"], "pcis": [pci],
            "gpus": [gpus_by_pci[pci] if pci in gpus_by_pci else f["gpu"]],
            "xids": sorted({e.get("xid") for e in evs if isinstance(e.get("xid"), int)}),
            "xid": first.get("xid"), "epoch": first.get("epoch"), "t_rel_s": _rel(first.get("epoch"), t_ref),
            "description": description, "action": f["action"],
            "lines": [e.get("line") for e in evs if e.get("line")][:6] or list(f["evidence"][:6])}


def _group_issue(f, per_gpu, rails, t_ref):
    """A rail (or a group of GPUs) lost together: the lost GPUs whose evidence the judge put in this finding."""
    evidence = set(f["evidence"])
    members = [i for i in per_gpu if i["kind"] == "gpu_lost" and i["code"] == "GPU_LOST" and i["lines"]
               and set(i["lines"]) & evidence]
    members.sort(key=lambda i: (i["epoch"] is None, i["epoch"] or 0))
    gpus = sorted(g for i in members for g in i["gpus"] if g is not None)
    times = [i["epoch"] for i in members if i["epoch"] is not None]
    span = " within %.3f s" % (max(times) - min(times)) if len(times) >= 2 else ""
    if f["code"] == "PSU_RAIL_LOSS":
        rail = next((str(name) for name, on in sorted(rails.items()) if gpus and set(gpus) <= set(_ints(on))), "?")
        description = "GPUs %s of PSU rail %s lost%s" % (", ".join(map(str, gpus)), rail, span)
        kind = "psu_rail"
    else:
        description = "GPUs %s lost together%s" % (", ".join(map(str, gpus)), span)
        kind = "gpu_group"
    first = members[0] if members else {"epoch": None, "xid": None}
    return {"kind": kind, "code": f["code"], "severity": f["severity"], "pcis": [p for i in members for p in i["pcis"]],
            "gpus": gpus, "xids": sorted({x for i in members for x in i["xids"]}), "xid": first["xid"],
            "epoch": first["epoch"], "t_rel_s": _rel(first["epoch"], t_ref), "description": description,
            "action": f["action"], "lines": [line for i in members for line in i["lines"]][:8] or list(f["evidence"][:8])}


def _ints(values):
    try:
        return {int(v) for v in values}
    except (TypeError, ValueError):
        return set()


def issues(events, gpus_by_pci, t=None, t_ref=None, host="this node"):
    """Per-GPU and per-rail issues of one node: [{kind, code, severity, pcis, gpus, xids, xid, epoch, t_rel_s,
    description, action, lines}], heaviest first.

    events: events_in_window's; gpus_by_pci: {pci: gpu index}; t: the node's thresholds by inventory name (missing ones
    take the defaults; gpufleet_psu_rails {"A": [0, 1, 2, 3], ...} names the rails).
    """
    t = complete(t)
    findings, _timeline = judge_xid.judge(events, [], t, host, gpus_by_pci)
    by_pci = {}
    for event in events:
        pci = normalize_pci(event.get("pci")) if event.get("pci") else None
        by_pci.setdefault(pci, []).append(event)
    for evs in by_pci.values():
        evs.sort(key=lambda e: (e.get("epoch") is None, e.get("epoch") or 0))
    per_gpu, groups, found = {}, [], []
    for f in findings:
        if f["code"] in GROUP_CODES:
            groups.append(f)
        else:
            per_gpu.setdefault(f["pci"], []).append(f)
    for pci, fs in sorted(per_gpu.items(), key=lambda kv: str(kv[0])):
        found.append(_gpu_issue(pci, fs, by_pci.get(pci, []), t, t_ref, gpus_by_pci))
    rails = t.get("gpufleet_psu_rails") if isinstance(t.get("gpufleet_psu_rails"), dict) else {}
    found += [_group_issue(f, found, rails, t_ref) for f in groups]
    found.sort(key=lambda i: (-weight(i), i["epoch"] or 0))
    return found
