# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge XID events and lost GPUs: a riser, a PSU rail, an RMA, a slow ECC leak, or another catalogued XID.

Why the actions read as they do (docs/failure-modes.md): on riser builds an XID 79 is almost always the riser or a
power connector loosened by thermal cycling, so the card is reseated and recabled before any RMA; when the GPUs of
one PSU rail vanish together it is that PSU, and split ATX rails are not redundancy; XID 48/63/64 are real memory
faults that end in an RMA; XID 92 is the slow single-bit leak that precedes them. Stdlib only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime

from ansible_collections.kentino.gpufleet.plugins.module_utils import xid_policy
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, gpu_label
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete, unreadable
from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci

CHECK = "xid_facts"
MAX_TIMELINE = 300
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads.
THRESHOLDS = ("gpufleet_lost_xids", "gpufleet_rma_xids", "gpufleet_ecc_leak_xids", "gpufleet_xid_severity_overrides",
              "gpufleet_psu_rails", "gpufleet_psu_loss_window_s")

BUCKET_WORDS = {
    "RESTART_APP": "restart the application; the GPU is fine unless it repeats",
    "RESET_GPU": "reset the GPU (nvidia-smi -r, or reboot) and rerun the checks",
    "RESTART_BM": "power-cycle the node (the GPU is gone from PCIe until then) and rerun the checks",
    "RESTART_VM": "restart the VM and rerun the checks",
    "CHECK_MECHANICALS": "check the GPU power cables and riser seating",
    "CONTACT_SUPPORT": "contact NVIDIA support with the kernel log",
    "UPDATE_SWFW": "update the driver/firmware",
    "WORKFLOW_XID_48": "reset the GPU, then check the SRAM threshold; RMA the card if it is exceeded",
    "WORKFLOW_NVLINK_ERR": "reset the GPU and check the NVLink/NVSwitch fabric",
}

CODES = {
    "GPU_LOST": ("fail", "fell off the bus: XID 79, a lost-GPU line without an Xid, or nvidia-smi/the sampler/the burn "
                         "saying the GPU is lost"),
    "PSU_RAIL_LOSS": ("fail", "the GPUs of one rail of gpufleet_psu_rails lost within gpufleet_psu_loss_window_s, or "
                              "the whole rail in the run"),
    "GPU_GROUP_LOST": ("fail", "2+ GPUs lost within the window and no rail map"),
    "GPU_UNDERPOWERED": ("fail", "nvidia-smi says the GPU is insufficiently powered"),
    "GPU_INIT_FAILED": ("fail", "the driver could not initialise the GPU (RmInitAdapter failed)"),
    "XID_RMA": ("fail", "an XID of gpufleet_rma_xids (48, 63, 64) whose severity (xid_policy: catalog, line, "
                        "gpufleet_xid_severity_overrides) is critical"),
    "ECC_LEAK": ("warn", "an XID of gpufleet_ecc_leak_xids (92) whose severity is warning or unknown"),
    "XID_CRITICAL": ("fail", "any other XID whose severity is critical (the alert GpuXidCritical pages on it)"),
    "XID_WARNING": ("warn", "any other XID whose severity is warning or unknown (the alert GpuXidWarning tickets it)"),
}
# The policy's severity -> the finding's verdict: the report fails exactly what pages, warns what tickets; an info
# XID is on the timeline only. One table for the report, the watcher's label and the alerts (xid_policy.py).
FINDING_SEVERITY = {"critical": "fail", "warning": "warn", "unknown": "warn"}


def event_time(event):
    """Epoch seconds of an event (its ISO `time`), else None. Seconds since boot are not comparable across GPUs'
    sources, so they are used only when no event has a wall-clock time (see judge())."""
    text = event.get("time")
    if isinstance(text, str) and text:
        text = text.strip().replace(",", ".")
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            return datetime.datetime.fromisoformat(text).timestamp()
        except ValueError:
            return None
    return None


def _action_words(event):
    action = event.get("action")
    if isinstance(action, dict):
        action = action.get("immediate") or action.get("investigatory")
    if not action:
        return "look the code up in NVIDIA's XID catalog"
    return BUCKET_WORDS.get(str(action), str(action))


class _Lost:
    def __init__(self, gpus, host):
        self.gpus = gpus
        self.host = host
        self.entries = {}

    def mark(self, index, pci, when, line, why):
        pci = normalize_pci(pci) if pci else None
        index = index if isinstance(index, int) and not isinstance(index, bool) else None
        when = when if isinstance(when, (int, float)) and not isinstance(when, bool) else None
        if index is None and pci:
            index = self.gpus.get(pci)
        key = index if index is not None else (pci or "?%d" % len(self.entries))
        entry = self.entries.setdefault(key, {"index": index, "pci": pci, "time": when, "evidence": [], "why": why})
        if entry["pci"] is None and pci:
            entry["pci"] = pci
        if when is not None and (entry["time"] is None or when < entry["time"]):
            entry["time"] = when
        if line:
            entry["evidence"].append(line)

    def infer_indices(self):
        """nvidia-smi numbers GPUs in PCI bus order: when every known GPU's index equals its position among the known
        and the lost addresses, a lost GPU's index is its position."""
        missing = [e for e in self.entries.values() if e["index"] is None and e["pci"]]
        if not missing:
            return
        order = sorted(set(self.gpus) | set(e["pci"] for e in missing))
        if any(order.index(pci) != index for pci, index in self.gpus.items()):
            return
        for e in missing:
            e["index"] = order.index(e["pci"])
            e["why"] += ", index %d inferred from PCI bus order" % e["index"]


def judge(events, lost, t, host, gpus=None):
    """(findings, timeline). Never raises: events or lost of the wrong shape give one CHECK_ERROR finding.

    events: xid_facts events of the run (deduplicated by the caller); lost: [{index, pci, time_s, line, why}] from every
    source that saw a GPU vanish (xid_facts lost_gpus, nvidia-smi "GPU is lost", the sampler, the burn); gpus:
    {pci: index} of the GPUs nvidia-smi showed. Thresholds: gpufleet_lost_xids, gpufleet_rma_xids,
    gpufleet_ecc_leak_xids, gpufleet_xid_severity_overrides, gpufleet_psu_rails, gpufleet_psu_loss_window_s.
    """
    for name, value in (("events", events), ("lost", lost)):
        if not isinstance(value, (list, tuple)):
            return [unreadable(CHECK, host, "%s is %s, not a list" % (name, type(value).__name__))], []
    return _judge(events, lost, complete(t), host, gpus)


def _classify(event, gpus, overrides, t, tracker, timeline, rma, leak, other):
    """Put one XID event on the timeline and in the bucket its code and its policy severity belong to: the lists
    (lost, RMA, leak) choose the finding and its action only where the policy's severity is the finding's own; the
    site's override of a code's severity moves it to XID_CRITICAL or XID_WARNING (or the timeline, for info)."""
    code = event.get("xid")
    pci = normalize_pci(event.get("pci")) if event.get("pci") else None
    index = gpus.get(pci) if pci else None
    when = event_time(event)
    line = str(event.get("line") or "XID %s at %s" % (code, pci))
    level, basis = xid_policy.severity(code, event.get("details"), event.get("correlated_with"), overrides,
                                       synthetic=event.get("synthetic") is True)
    timeline.append({"time_s": when, "xid": code, "gpu": index, "pci": pci, "severity": level,
                     "message": line[:300]})
    if event.get("counted") is False:  # a consequence of another event (XID 45 after 79): timeline only
        return
    verdict = FINDING_SEVERITY.get(level)
    if code in t["gpufleet_lost_xids"]:
        tracker.mark(index, pci, when, line, "XID %s" % code)
    elif code in t["gpufleet_rma_xids"] and verdict == CODES["XID_RMA"][0]:
        rma.setdefault((index, pci), []).append((code, line))
    elif code in t["gpufleet_ecc_leak_xids"] and verdict == CODES["ECC_LEAK"][0]:
        leak.setdefault((index, pci), []).append((code, line))
    elif verdict is not None:
        other.append((index, pci, code, line, level, basis, event))


def _judge(events, lost, t, host, gpus):
    gpus = dict(gpus or {})
    overrides = dict((int(k), v) for k, v in (t.get("gpufleet_xid_severity_overrides") or {}).items())
    tracker = _Lost(gpus, host)
    timeline, rma, leak, other = [], {}, {}, []
    skipped = []  # entries of the wrong shape: said in one error finding, never losing the others' findings
    for event in events:
        if not isinstance(event, dict):
            skipped.append("XID event %r is not a mapping" % (event,))
            continue
        _classify(event, gpus, overrides, t, tracker, timeline, rma, leak, other)
    for entry in lost:
        if not isinstance(entry, dict):
            skipped.append("lost GPU %r is not a mapping" % (entry,))
            continue
        tracker.mark(entry.get("index"), entry.get("pci"), entry.get("time_s"), entry.get("line"),
                     entry.get("why") or "lost")
    tracker.infer_indices()

    findings, psu_of = _rails(tracker.entries, t, host)
    for entry in tracker.entries.values():
        label = gpu_label(host, entry["index"], entry["pci"])
        rail = psu_of.get(entry["index"])
        if any("insufficiently powered" in line.lower() for line in entry["evidence"]):
            findings.append(finding("fail", "GPU_UNDERPOWERED", "%s is insufficiently powered (nvidia-smi)" % label,
                                    "connect or reseat the GPU's power cables (all of them, on the card and the PSU), "
                                    "check the PSU rail, then rerun", entry["evidence"], gpu=entry["index"],
                                    pci=entry["pci"]))
            continue
        if rail is not None:
            action = "replace/check PSU %s first (its rail lost several GPUs at once); then retest this GPU" % rail
        else:
            action = "reseat the riser and recable GPU power before any RMA (%s), then rerun the burn-in" % label
        findings.append(finding("fail", "GPU_LOST", "%s fell off the bus (%s)" % (label, entry["why"]), action,
                                entry["evidence"], gpu=entry["index"], pci=entry["pci"]))
    for (index, pci), items in rma.items():
        label = gpu_label(host, index, pci)
        codes = ", ".join(str(c) for c in sorted(set(c for c, _ in items)))
        findings.append(finding("fail", "XID_RMA", "%s logged XID %s (uncorrectable memory error / page retirement / "
                                "remap)" % (label, codes), "replace the card (RMA) with this evidence: %s" % label,
                                [line for _, line in items], gpu=index, pci=pci))
    for (index, pci), items in leak.items():
        label = gpu_label(host, index, pci)
        findings.append(finding("warn", "ECC_LEAK", "%s logged %d single-bit ECC XID(s) %s" % (
            label, len(items), ", ".join(sorted(set(str(c) for c, _ in items)))),
            "slow ECC leak: schedule replacement, watch %s (volatile ECC and XID 92 rate)" % label,
            [line for _, line in items], gpu=index, pci=pci))
    for index, pci, code, line, level, basis, event in other:
        label = gpu_label(host, index, pci)
        message = "%s logged XID %s (%s, severity %s: %s)" % (
            label, code, event.get("mnemonic") or event.get("description") or "?", level, basis)
        action = "%s (NVIDIA XID catalog, XID %s)" % (_action_words(event), code)
        if level == "critical":
            findings.append(finding("fail", "XID_CRITICAL", message, action, [line], gpu=index, pci=pci))
        else:
            findings.append(finding("warn", "XID_WARNING", message, action, [line], gpu=index, pci=pci))
    if skipped:
        findings.append(finding("error", "CHECK_ERROR", "%s: %d XID event(s) or lost-GPU entries could not be read "
                                "(the others are judged): %s" % (host, len(skipped), skipped[0][:200]),
                                "rerun xid_facts on %s with this collection's module; if it persists, report a "
                                "kentino.gpufleet bug with the result" % host, skipped))
    timeline.sort(key=lambda e: (e["time_s"] is None, e["time_s"] or 0))
    return findings, timeline[:MAX_TIMELINE]


def judge_init_failures(init_failures, host, gpus=None):
    """GPU_INIT_FAILED for each GPU the driver could not initialise (RmInitAdapter failed): the GPU is on the bus but
    unusable; usually power, the riser/PCIe link or the wrong kernel module flavour, sometimes the card. Never raises."""
    if not isinstance(init_failures, (list, tuple)):
        return [] if init_failures is None else [unreadable(CHECK, host, "init_failures is %s, not a list" % (
            type(init_failures).__name__))]
    return _init_failures(init_failures, host, gpus)


def _init_failures(init_failures, host, gpus):
    gpus = dict(gpus or {})
    out = []
    for item in init_failures or []:
        pci = normalize_pci(item.get("pci")) if item.get("pci") else None
        index = gpus.get(pci) if pci else None
        where = gpu_label(host, index, pci) if pci else "%s GPU minor %s" % (host, item.get("minor"))
        out.append(finding("fail", "GPU_INIT_FAILED", "%s: the driver could not initialise it (RmInitAdapter failed, "
                           "code %s, %s attempt(s))" % (where, item.get("code"), item.get("count") or 1),
                           "read the kernel lines before it (power cables, riser/PCIe link, open vs proprietary kernel "
                           "module for this GPU), reseat, and RMA the card if it persists",
                           item.get("evidence") or [item.get("line")], gpu=index, pci=pci))
    return out


def _rails(lost, t, host):
    """([PSU_RAIL_LOSS] for the rails whose GPUs were lost together, or GPU_GROUP_LOST without a rail map;
    {gpu index: rail})."""
    out, psu_of = [], {}
    rails = t.get("gpufleet_psu_rails") or {}
    window = t["gpufleet_psu_loss_window_s"]
    for rail, members in sorted(rails.items()):
        on_rail = [e for e in lost.values() if e["index"] in members]
        if len(on_rail) < 2:
            continue
        times = [e["time"] for e in on_rail if e["time"] is not None]
        span = (max(times) - min(times)) if len(times) == len(on_rail) else None
        whole = len(set(e["index"] for e in on_rail)) >= len(set(members))
        if whole or (span is not None and span <= window):
            indices = sorted(set(e["index"] for e in on_rail))
            how = "within %.3f s" % span if span is not None else "in the same run"
            out.append(finding("fail", "PSU_RAIL_LOSS", "%s: GPUs %s (PSU %s rail%s) were lost together %s" % (
                host, ", ".join(map(str, indices)), rail, ", the whole rail" if whole else "", how),
                "replace/check PSU %s on %s (rail %s: GPUs %s); split rails are not redundancy (use 1+1 hot-swap "
                "PSUs)" % (rail, host, rail, ", ".join(str(m) for m in members)),
                [line for e in on_rail for line in e["evidence"]]))
            psu_of.update((i, rail) for i in indices)
    if not rails:
        timed = sorted((e for e in lost.values() if e["time"] is not None), key=lambda e: e["time"])
        if len(timed) >= 2 and timed[-1]["time"] - timed[0]["time"] <= window:
            out.append(finding("fail", "GPU_GROUP_LOST", "%s: %d GPUs fell off the bus within %.3f s" % (
                host, len(timed), timed[-1]["time"] - timed[0]["time"]),
                "check the PSU/power feed these GPUs share on %s (set gpufleet_psu_rails to name the PSU); split "
                "rails are not redundancy" % host, [line for e in timed for line in e["evidence"]]))
    return out, psu_of
