# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The GPU evidence of the job's window on one node: XIDs and lost GPUs per PCI address, and what to do (pure).

Actions follow docs/failure-modes.md (riser before RMA, PSU rails, memory faults; docs/postmortem.md cites the public sources):
- XID 79 / "fallen off the bus": on riser builds almost always the riser or a loose power connector, not the GPU:
  reseat and recable before any RMA;
- several GPUs of one PSU rail lost within RAIL_WINDOW_S: the PSU feeding that rail (split rails are not redundancy);
- XID 48 (double-bit ECC), 63/64 (page retirement / row remapping and its failure): the card (RMA);
- 94/95 (contained / uncontained ECC), 92 (single-bit ECC rate), 74 (NVLink), 119/120 (GSP): see ACTIONS;
- application XIDs (13, 31, 43, 45, 68) are the job's own GPU faults: evidence, not a hardware cause.
"""

from __future__ import annotations

import datetime

RAIL_WINDOW_S = 1.0
LOST = "reseat the riser and recable the GPU's power (both ends) before any RMA, then burn the node in again " \
       "(kentino.gpufleet.burn_in)"
ACTIONS = {
    48: ("rma", "replace the card (RMA) with this evidence: double-bit ECC error"),
    63: ("rma", "replace the card (RMA) with this evidence: ECC page retirement / row remapping"),
    64: ("rma", "replace the card (RMA) with this evidence: row remapping failed"),
    94: ("ecc", "contained uncorrectable ECC error: reset the GPU and watch it; RMA if it repeats"),
    95: ("ecc", "uncontained uncorrectable ECC error: reset the GPU (or reboot); RMA if it repeats"),
    92: ("ecc", "high single-bit ECC rate: schedule a replacement before it turns into XID 48"),
    74: ("nvlink", "NVLink error: inspect and reseat the NVLink bridge/baseboard, then contact the vendor"),
    119: ("firmware", "GSP firmware timeout: reset the GPU; update the driver if it recurs"),
    120: ("firmware", "GSP firmware error: reset the GPU; update the driver if it recurs"),
}
APPLICATION = frozenset([13, 31, 43, 45, 68])
SEVERITY = {"gpu_lost": 3, "psu_rail": 4, "rma": 3, "ecc": 2, "nvlink": 2, "firmware": 2, "other": 1,
            "application": 0}


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


def issues(events, gpus_by_pci, rails=None, t_ref=None):
    """Per-GPU and per-rail issues of one node: [{kind, pcis, gpus, xids, epoch, t_rel_s, action, lines}].

    gpus_by_pci: {pci: gpu index}; rails: {"A": [0, 1, 2, 3], ...} from the inventory (gpufleet_psu_rails).
    """
    by_pci = {}
    for event in events:
        by_pci.setdefault(event.get("pci"), []).append(event)
    found = []
    lost_at = {}
    for pci, evs in sorted(by_pci.items(), key=lambda kv: str(kv[0])):
        evs.sort(key=lambda e: (e["epoch"] is None, e["epoch"] or 0))
        codes = sorted({e.get("xid") for e in evs if isinstance(e.get("xid"), int)})
        first = evs[0]
        if 79 in codes:
            lost = [e for e in evs if e.get("xid") == 79][0]
            kind, action, first = "gpu_lost", LOST, lost
            lost_at[pci] = lost["epoch"]
        else:
            ranked = [ACTIONS[c] for c in codes if c in ACTIONS]
            ranked.sort(key=lambda ka: -SEVERITY[ka[0]])
            if ranked:
                kind, action = ranked[0]
                first = [e for e in evs if ACTIONS.get(e.get("xid"), (None,))[0] == kind][0]
            elif all(c in APPLICATION for c in codes):
                kind, action = "application", "the job's own GPU fault (application XID): see the job's exception"
            else:
                kind = "other"
                act = first.get("action") or {}
                action = "NVIDIA's catalog: %s (then %s)" % (act.get("immediate") or "see the XID catalog",
                                                            act.get("investigatory") or "-")
        description = "GPU fell off the bus" if kind == "gpu_lost" else (first.get("mnemonic") or first.get("message"))
        found.append({"kind": kind, "pcis": [pci], "gpus": [gpus_by_pci.get(pci)], "xids": codes,
                      "xid": first.get("xid"), "epoch": first["epoch"], "t_rel_s": _rel(first["epoch"], t_ref),
                      "description": description, "action": action,
                      "lines": [e.get("line") for e in evs if e.get("line")][:6]})
    for rail, members in sorted((rails or {}).items()):
        try:
            indices = {int(i) for i in members}
        except (TypeError, ValueError):
            continue
        gone = [(pci, t) for pci, t in lost_at.items() if gpus_by_pci.get(pci) in indices and t is not None]
        if len(gone) >= 2 and max(t for _p, t in gone) - min(t for _p, t in gone) <= RAIL_WINDOW_S:
            gone.sort(key=lambda pt: pt[1])
            gpus = sorted(gpus_by_pci.get(p) for p, _t in gone)
            found.append({"kind": "psu_rail", "pcis": [p for p, _t in gone], "gpus": gpus, "xids": [79], "xid": 79,
                          "epoch": gone[0][1], "t_rel_s": _rel(gone[0][1], t_ref), "rail": str(rail),
                          "description": "GPUs %s of PSU rail %s lost within %.3f s" % (
                              ", ".join(str(g) for g in gpus), rail, gone[-1][1] - gone[0][1]),
                          "action": "check and replace the PSU feeding rail %s (GPUs %s); split rails are not "
                                    "redundancy" % (rail, ", ".join(str(g) for g in sorted(indices))),
                          "lines": [line for i in found if set(i["pcis"]) & {p for p, _t in gone} for line in
                                    i["lines"]][:8]})
    found.sort(key=lambda i: (-SEVERITY[i["kind"]], i["epoch"] or 0))
    return found
