# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge what only the health_snapshot reads (stdlib only): the parts it could not read within its budget, and the
memory banks whose spare rows are nearly gone (remapped_rows.histogram.*).

The snapshot's other parts are judged by the existing judges: the GPU table (judge_gpu_health, judge_busy), the XIDs
(judge_xid), one nvidia-smi reading as a sample (judge_samples: PCIe link under load, throttling), the checkpoint
storage (judge_storage, without the write test) and the training environment (judge_env).

NVIDIA's row remapper keeps spare rows per memory bank (8 for uncorrectable errors); the histogram counts banks by
how many are left: Max (all), High, Partial, Low, None. A bank at None cannot remap its next uncorrectable error: the
remap fails and the card qualifies for RMA.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, gpu_label
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door

CHECK = "health_snapshot"
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads: what a module passes it.
THRESHOLDS = ()

# Every finding this judge can return: code -> (severity, what it means). docs/rules.md is generated from these.
CODES = {
    "SNAPSHOT_PART_ERROR": ("error", "a part of the snapshot (XIDs, storage, environment, versions) could not be read: "
                                     "its reason; unread is not healthy"),
    "SNAPSHOT_BUDGET": ("error", "the snapshot ran out of its time budget: the parts it skipped are named"),
    "REMAP_BANKS_LOW": ("warn", "memory banks at Low or None remap availability (remapped_rows.histogram): spare rows "
                                "nearly or fully used"),
}
# The GPU table's own failure is judged from the facts (GPU_FACTS_UNREADABLE), not twice.
_JUDGED_ELSEWHERE = ("gpus",)


@judge_door(CHECK)
def judge(result, t, host):
    """[finding] for one health_snapshot result."""
    out = []
    parts = result.get("parts") or {}
    skipped = sorted(name for name, part in parts.items() if (part or {}).get("skipped") == "budget")
    if skipped:
        out.append(finding("error", "SNAPSHOT_BUDGET", "%s: the snapshot used its %s s budget before reading %s" % (
            host, result.get("budget_s"), ", ".join(skipped)),
            "find the slow tool on %s (the parts' durations are in the result; a hung nvidia-smi or journal), or "
            "raise gpufleet_audit_budget_s" % host,
            ["%s: %.1f s" % (name, (part or {}).get("duration_s") or 0.0) for name, part in sorted(parts.items())]))
    for name in sorted(parts):
        part = parts[name] or {}
        if name in _JUDGED_ELSEWHERE or not part.get("error"):
            continue
        out.append(finding("error", "SNAPSHOT_PART_ERROR", "%s: the snapshot could not read %s: %s" % (
            host, name, part["error"]), "fix what the message names on %s (root for the kernel log: become: true), "
            "then rerun the audit; unread is not healthy" % host, [part["error"]]))
    for gpu in result.get("gpus") or []:
        banks = gpu.get("remap_banks") or {}
        low, none = banks.get("low") or 0, banks.get("none") or 0
        if low or none:
            index, pci = gpu.get("index"), gpu.get("pci")
            label = gpu_label(host, index, pci)
            out.append(finding("warn", "REMAP_BANKS_LOW", "%s: %d memory bank(s) at Low and %d at None remap "
                               "availability: %s" % (label, low, none, "the next uncorrectable error in a None bank "
                                                     "fails its remap (RMA)" if none else "spare rows running out"),
                               "plan the replacement of %s; drain it if uncorrectable errors or pending remaps appear"
                               % label, ["remapped_rows.histogram max=%s high=%s partial=%s low=%s none=%s" % tuple(
                                   banks.get(k) for k in ("max", "high", "partial", "low", "none"))], index, pci))
    return out
