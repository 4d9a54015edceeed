# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge a run's figures against the node's own baseline: the Gflop/s of each GPU, the NCCL bus bandwidth and the
checkpoint write speed its first good burn-in measured (stdlib only, pure).

A fleet threshold is set low enough for every node of a platform to pass; a node that loses 20% of its own speed (a
clogged heatsink, a riser renegotiating, a slower firmware) still passes it. Its own first burn-in is the better
reference. Baselines are per GPU identity (UUID): a replaced card starts a new one.

Input (`result`): {"figures": [{"metric", "detail", "unit", "gpu": index or None, "pci", "value",
                                "baseline": {"value", "run_id", "ts"} or None}]}
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, gpu_label
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door

CHECK = "baseline"
# Every finding this judge can return: code -> (severity, what it means). docs/rules.md is generated from these.
CODES = {
    "BELOW_BASELINE": ("warn", "a figure (gpu-burn Gflop/s per GPU, NCCL busbw, checkpoint write MB/s) more than "
                               "gpufleet_baseline_max_drop below the node's own baseline, even when it passes the "
                               "fleet threshold"),
}
METRICS = {
    "burn_gflops": ("gpu-burn throughput", "Gflop/s"),
    "nccl_busbw_gbps": ("NCCL all_reduce bus bandwidth", "GB/s"),
    "storage_write_mb_per_s": ("checkpoint write speed", "MB/s"),
}
ACTIONS = {
    "burn_gflops": "check the cooling of %s (heatsink, fans, inlet temperature), its power cables and clocks "
                   "(nvidia-smi -q -d PERFORMANCE); reseat it if the PCIe link renegotiated",
    "nccl_busbw_gbps": "check the links of %s: nvidia-smi topo -m, each GPU's PCIe gen/width under load, NVLink "
                       "errors; reseat the riser of the slow link",
    "storage_write_mb_per_s": "check the checkpoint drive of %s: NVMe wear and temperature (nvme smart-log), a "
                              "nearly full filesystem, other writers",
}


def _num(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def compare(item, t):
    """(ratio value/baseline or None, below the allowed drop?)."""
    value = _num(item.get("value"))
    base = _num((item.get("baseline") or {}).get("value"))
    if value is None or not base or base <= 0:
        return None, False
    ratio = value / base
    return ratio, ratio < 1.0 - float(t["gpufleet_baseline_max_drop"])


@judge_door(CHECK)
def judge(result, t, host):
    """[finding] for one node's figures against its baselines."""
    out = []
    for item in result.get("figures") or []:
        ratio, below = compare(item, t)
        if not below:
            continue
        metric = item.get("metric")
        what, unit = METRICS.get(metric, (metric, item.get("unit") or ""))
        index, pci = item.get("gpu"), item.get("pci")
        label = gpu_label(host, index, pci) if index is not None else host
        base = item["baseline"]
        when = time.strftime("%Y-%m-%d", time.gmtime(base["ts"])) if _num(base.get("ts")) else "?"
        out.append(finding("warn", "BELOW_BASELINE", "%s: %s %.1f %s is %.0f%% below its own baseline %.1f %s "
                           "(run %s, %s)%s" % (
                               label, what, item["value"], unit, (1.0 - ratio) * 100, base["value"], unit,
                               base.get("run_id") or "?", when,
                               " at %s" % item["detail"] if item.get("detail") else ""),
                           (ACTIONS.get(metric) or "find what slowed %s down") % label,
                           ["%s%s value=%s baseline=%s ratio=%.3f allowed drop=%s" % (
                               metric, "[%s]" % item["detail"] if item.get("detail") else "", item["value"],
                               base["value"], ratio, t["gpufleet_baseline_max_drop"])], index, pci))
    return out
