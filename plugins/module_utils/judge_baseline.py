# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge a run's figures against the node's own baseline: the Gflop/s of each GPU, the NCCL bus bandwidth and the
checkpoint write speed of its good burn-ins (stdlib only, pure).

A fleet threshold is set low enough for every node of a platform to pass; a node that loses 20% of its own speed (a
clogged heatsink, a riser renegotiating, a slower firmware) still passes it. Its own burn-ins are the better
reference. Baselines are per GPU identity (UUID): a replaced card starts a new one.

One measurement is not a reference: a write test in a busy moment or a burn next to a hot neighbour reads low once.
So the reference is the median of the node's first BASELINE_RUNS good burn-ins since the baseline started (its first
good burn-in, or gpufleet_baseline_reset), and their spread is the median absolute deviation (MAD, scaled to a
standard deviation). A figure more than gpufleet_baseline_max_drop below the median is LOW; it warns when it is also
beyond SPREAD_FACTOR spreads below the median (a spread known from at least MIN_RUNS_FOR_SPREAD runs), or when the
figure was low in the node's previous run too (the deviation repeats). A single low reading against too few runs to
know the spread is noted (the history records it as low), not flagged.

Input (`result`): {"figures": [{"metric", "detail", "unit", "gpu": index or None, "pci", "value",
                                "baseline": {"value", "run_id", "ts", "samples": [values of the good runs, oldest
                                             first], "last": "low" | "ok" | None (the previous run's state)}
                                            or None}]}
A baseline without samples (a history written before samples were kept) is its one value.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import statistics
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, gpu_label
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door

BASELINE_RUNS = 10
MIN_RUNS_FOR_SPREAD = 3
SPREAD_FACTOR = 3.0
_MAD_TO_SIGMA = 1.4826  # MAD x this estimates the standard deviation of normally distributed figures

CHECK = "baseline"
# Every finding this judge can return: code -> (severity, what it means). docs/rules.md is generated from these.
CODES = {
    "BELOW_BASELINE": ("warn", "a figure (gpu-burn Gflop/s per GPU, NCCL busbw, checkpoint write MB/s) more than "
                               "gpufleet_baseline_max_drop below the median of the node's own good burn-ins, and "
                               "beyond their spread or low in the previous run too, even when it passes the fleet "
                               "threshold"),
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


def reference(baseline):
    """{value: median, spread: scaled MAD or None, runs} of a baseline (None without a usable value)."""
    baseline = baseline or {}
    samples = [v for v in baseline.get("samples") or [] if _num(v) is not None and v > 0][:BASELINE_RUNS]
    if not samples and _num(baseline.get("value")) is not None and baseline["value"] > 0:
        samples = [baseline["value"]]
    if not samples:
        return None
    median = statistics.median(samples)
    spread = None
    if len(samples) >= MIN_RUNS_FOR_SPREAD:
        spread = _MAD_TO_SIGMA * statistics.median(abs(v - median) for v in samples)
    return {"value": median, "spread": spread, "runs": len(samples)}


def assess(item, t):
    """How one figure stands against its baseline: {ratio, reference, low, beyond_spread, repeated, flag}, or None
    when there is nothing to compare (no figure, no baseline). `low` is what the history records for the next run's
    `last`; `flag` is the finding."""
    value = _num(item.get("value"))
    ref = reference(item.get("baseline"))
    if value is None or ref is None:
        return None
    ratio = value / ref["value"]
    low = ratio < 1.0 - float(t["gpufleet_baseline_max_drop"])
    beyond = ref["spread"] is not None and ref["value"] - value > SPREAD_FACTOR * ref["spread"]
    repeated = (item.get("baseline") or {}).get("last") == "low"
    return {"ratio": ratio, "reference": ref, "low": low, "beyond_spread": beyond, "repeated": repeated,
            "flag": low and (beyond or repeated)}


def _why(a):
    ref = a["reference"]
    if a["beyond_spread"]:
        return "beyond %g times its spread of %.1f" % (SPREAD_FACTOR, ref["spread"])
    return "and low in the previous run too"


@judge_door(CHECK)
def judge(result, t, host):
    """[finding] for one node's figures against its baselines."""
    out = []
    for item in result.get("figures") or []:
        a = assess(item, t)
        if a is None or not a["flag"]:
            continue
        metric = item.get("metric")
        what, unit = METRICS.get(metric, (metric, item.get("unit") or ""))
        index, pci = item.get("gpu"), item.get("pci")
        label = gpu_label(host, index, pci) if index is not None else host
        base, ref = item["baseline"], a["reference"]
        when = time.strftime("%Y-%m-%d", time.gmtime(base["ts"])) if _num(base.get("ts")) else "?"
        out.append(finding("warn", "BELOW_BASELINE", "%s: %s %.1f %s is %.0f%% below its own baseline %.1f %s "
                           "(the median of %d good burn-in(s) since run %s, %s), %s%s" % (
                               label, what, item["value"], unit, (1.0 - a["ratio"]) * 100, ref["value"], unit,
                               ref["runs"], base.get("run_id") or "?", when, _why(a),
                               " at %s" % item["detail"] if item.get("detail") else ""),
                           (ACTIONS.get(metric) or "find what slowed %s down") % label,
                           ["%s%s value=%s baseline_median=%s spread=%s runs=%d ratio=%.3f allowed drop=%s "
                            "previous=%s" % (
                                metric, "[%s]" % item["detail"] if item.get("detail") else "", item["value"],
                                round(ref["value"], 3), None if ref["spread"] is None else round(ref["spread"], 3),
                                ref["runs"], a["ratio"], t["gpufleet_baseline_max_drop"], base.get("last"))],
                           index, pci))
    return out
