# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge nvidia-smi samples taken under load (gpu_sample): sustained heat, thermal throttling, a PCIe link that never
reaches its rated gen/width under load, corrected ECC rising (stdlib only).

Why under load: many GPUs drop their PCIe link to gen 1 at idle, so only samples at or above
gpufleet_load_util_min_pct count for the link; the BEST link seen under load is compared with the maximum (a
momentary dip is not a degraded riser; never reaching the maximum is). Time above the temperature limit is measured
from the samples' own times, each sample standing until the next (a gap in sampling is not evidence of heat).

A long run (a burn of hours) takes more samples than a result should carry to the controller (24 h at 5 s: 17,280
per GPU, about 40 MB of JSON per 8-GPU node). The node then returns compact(result): the per-GPU figures of every
sample (per_gpu), the samples the judge quotes and an even spread of the others for the chart, marked samples_thinned.
The judge reads the figures, never a count of the samples it was handed, so it answers the same for the whole and the
compact result.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, gpu_label
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete, judge_door
from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci

CHECK = "gpu_sample"
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads: what a module passes it.
THRESHOLDS = ("gpufleet_temp_max_c", "gpufleet_temp_sustained_s",
              "gpufleet_load_util_min_pct", "gpufleet_ecc_corrected_rise")

CODES = {
    "THERMAL_SUSTAINED": ("fail", "seconds above gpufleet_temp_max_c >= gpufleet_temp_sustained_s (from sample times)"),
    "THERMAL_THROTTLE": ("warn", "a thermal throttle reason in samples"),
    "PCIE_DEGRADED": ("fail", "the best PCIe gen/width seen under load is below the GPU's maximum"),
    "ECC_CORRECTED_RISING": ("warn", "volatile corrected ECC rose during the run"),
    "SAMPLES_MISSING": ("error", "no sample at all: temperature and link under load were not checked"),
    "SAMPLES_NOT_UNDER_LOAD": ("error", "a load ran (the burn) but no sample caught a GPU loaded: its PCIe link under "
                                        "load was not checked"),
}
MAX_SERIES_POINTS = 240
# A result carries at most this many samples (an hour at the default 5 s), or fewer than the judge quotes (compact).
MAX_RETURNED_SAMPLES = 720
EVIDENCE_ROWS = 5  # rows a finding quotes
_LINE_KEYS = ("temperature_c", "utilization_gpu_pct", "power_w", "pcie_gen_current", "pcie_width_current",
              "throttle_reasons")


def _line(row):
    return "t=%ss GPU %s (%s): %s" % (row.get("_t"), row.get("index"), row.get("pci"),
                                      " ".join("%s=%s" % (k, row.get(k)) for k in _LINE_KEYS if k in row))


def per_gpu_rows(result):
    """{pci or index: [row with _t, its sample's time, and _i, its sample's place]} in time order; a GPU is known by
    its PCI address."""
    per = {}
    for i, sample in enumerate(result.get("samples") or []):
        for gpu in sample.get("gpus") or []:
            key = gpu.get("pci") or gpu.get("index")
            row = dict(gpu)
            row["_t"] = sample.get("t_s")
            row["_i"] = i
            per.setdefault(key, []).append(row)
    return per


def _seconds_above(rows, limit, interval):
    if not rows:
        return 0.0
    times = [r["_t"] for r in rows]
    steps = sorted(times[i + 1] - times[i] for i in range(len(times) - 1) if times[i + 1] > times[i])
    # A sample stands until the next one, for at most 3 sampling steps. The step is the configured interval, or the
    # spacing the samples really had when nvidia-smi was slower (the lower median, read from 3 steps or more, so one
    # stall of the sampler never becomes the step and is never counted as time above the limit).
    interval = interval if isinstance(interval, (int, float)) and interval > 0 else 0.0
    typical = steps[(len(steps) - 1) // 2] if len(steps) >= 3 else 0.0
    step = max(interval, typical) or (steps[0] if steps else 1.0)
    total = 0.0
    for i, row in enumerate(rows):
        temp = row.get("temperature_c")
        if temp is not None and temp > limit:
            nxt = times[i + 1] - times[i] if i + 1 < len(rows) else step
            total += max(0.0, min(nxt, 3 * step))
    return total


def _lines(rows):
    """The evidence of a finding: the first rows that show it (compact() returns them)."""
    return [_line(r) for r in rows[:EVIDENCE_ROWS]]


def _thermal(reasons):
    return any("thermal" in str(r).lower() for r in reasons or [])


def downsample(points, limit=MAX_SERIES_POINTS):
    if len(points) <= limit:
        return points
    stride = len(points) / float(limit)
    return [points[int(i * stride)] for i in range(limit)]


@judge_door(CHECK, empty=lambda: ([], {}))
def figures(result, t):
    """Per GPU: max temperature and power, seconds above the limit, best PCIe link under load, loaded samples,
    throttle reasons seen; plus the temperature series for the chart. ([per_gpu], {index: [[t, temp]]}). Of a
    compact result (samples_thinned): the node's per_gpu, computed here from every sample, and the series of those
    returned."""
    return _figures(per_gpu_rows(result), result, t)


def _figures(rows_by_gpu, result, t):
    """figures() of the rows per_gpu_rows(result) gave (compact() has them already)."""
    limit = t["gpufleet_temp_max_c"]
    per, series = [], {}
    thinned = bool(result.get("samples_thinned"))
    for rows in rows_by_gpu.values():
        first = rows[0]
        start = rows[0]["_t"] or 0.0
        temps = [r["temperature_c"] for r in rows if r.get("temperature_c") is not None]
        if temps:
            series[str(first.get("index"))] = downsample(
                [[round((r["_t"] or 0.0) - start, 3), r["temperature_c"]] for r in rows
                 if r.get("temperature_c") is not None])
        if thinned:
            continue  # the figures are the node's, from every sample
        powers = [r["power_w"] for r in rows if r.get("power_w") is not None]
        loaded = _loaded_rows(rows, t)
        gens = [r["pcie_gen_current"] for r in loaded if r.get("pcie_gen_current") is not None]
        widths = [r["pcie_width_current"] for r in loaded if r.get("pcie_width_current") is not None]
        corrected = [r["ecc_volatile_corrected"] for r in rows if r.get("ecc_volatile_corrected") is not None]
        reasons = sorted(set(x for r in rows for x in r.get("throttle_reasons") or [] if x != "gpu_idle"))
        per.append({
            "index": first.get("index"), "pci": first.get("pci"), "samples": len(rows), "loaded_samples": len(loaded),
            "max_temperature_c": max(temps) if temps else None, "max_power_w": max(powers) if powers else None,
            "seconds_above_limit_s": round(_seconds_above(rows, limit, result.get("interval_s")), 1),
            "temperature_limit_c": limit,
            "pcie_gen_under_load": max(gens) if gens else None,
            "pcie_width_under_load": max(widths) if widths else None,
            "pcie_gen_max": next((r["pcie_gen_max"] for r in rows if r.get("pcie_gen_max") is not None), None),
            "pcie_width_max": next((r["pcie_width_max"] for r in rows if r.get("pcie_width_max") is not None), None),
            "ecc_corrected_first": corrected[0] if corrected else None,
            "ecc_corrected_last": corrected[-1] if corrected else None,
            "throttle_reasons_seen": reasons,
            "throttled_samples": len(_throttled_rows(rows)),
        })
    if thinned:
        per = [dict(fig) for fig in result.get("per_gpu") or []]
    return per, series


def _hot_rows(rows, limit):
    return [r for r in rows if (r.get("temperature_c") or 0) > limit]


def _throttled_rows(rows):
    return [r for r in rows if _thermal(r.get("throttle_reasons"))]


def _loaded_rows(rows, t):
    return [r for r in rows if r.get("utilization_gpu_pct") is None
            or r["utilization_gpu_pct"] >= t["gpufleet_load_util_min_pct"]]


def compact(result, t, limit=None):
    """The result a node returns: itself up to `limit` (MAX_RETURNED_SAMPLES) samples. Past that, per_gpu from every
    sample, the samples holding a row a finding quotes (each GPU's first hot, thermally throttled and loaded rows, its
    first and last two) and an even spread of the others up to `limit` in all; samples_thinned true, samples_total
    the count taken. judge() and coverage() answer the same for both (tests/unit/judges/test_judge_samples.py)."""
    limit = MAX_RETURNED_SAMPLES if limit is None else limit
    samples = result.get("samples") or []
    if len(samples) <= limit:
        return result
    t = complete(t)
    rows_by_gpu = per_gpu_rows(result)
    keep = set()  # the places of the samples to return
    for rows in rows_by_gpu.values():
        quoted = (_hot_rows(rows, t["gpufleet_temp_max_c"])[:EVIDENCE_ROWS] + _throttled_rows(rows)[:EVIDENCE_ROWS]
                  + _loaded_rows(rows, t)[:EVIDENCE_ROWS] + rows[:1] + rows[-2:])
        keep.update(row["_i"] for row in quoted)
    spread = max(limit - len(keep), 0)
    keep.update(int(k * len(samples) / spread) for k in range(spread))
    out = dict(result)
    out["samples"] = [samples[i] for i in sorted(keep)]
    out["per_gpu"] = _figures(rows_by_gpu, result, t)[0]
    out["samples_thinned"] = True
    out["samples_total"] = len(samples)
    return out


@judge_door(CHECK)
def coverage(result, t, host, lost=()):
    """[SAMPLES_NOT_UNDER_LOAD] for a sampling that ran beside a load which did work (the burn): a GPU never seen
    loaded is a check that did not happen, not a pass. lost: PCI addresses or indexes of GPUs lost during the run;
    whether one was sampled under load before it vanished is timing, and its loss is the finding. A cross-check of
    two results that only the controller sees together: the report files it as its own check, sample_coverage."""
    lost = set(normalize_pci(x) if isinstance(x, str) else x for x in lost)
    out = []
    rows_by_gpu = per_gpu_rows(result)
    for fig in figures(result, t)[0]:
        rows = rows_by_gpu.get(fig["pci"] or fig["index"], [])
        index, pci = fig["index"], fig["pci"]
        gone = index in lost or (pci and normalize_pci(pci) in lost)
        if not fig["loaded_samples"] and not gone:
            out.append(finding("error", "SAMPLES_NOT_UNDER_LOAD", "%s: none of its %d nvidia-smi samples was taken "
                               "while the burn loaded it: its PCIe link and temperature under load were not checked"
                               % (gpu_label(host, index, pci), fig["samples"]),
                               "rerun the burn-in on %s (a longer gpufleet_burn_duration_s or a shorter "
                               "gpufleet_sample_interval_s)" % host, [_line(r) for r in rows[-2:]], index, pci))
    return out


@judge_door(CHECK)
def judge(result, t, host):
    """[finding] for one gpu_sample result (what the module itself can judge: coverage() needs the burn's result)."""
    out = []
    rows_by_gpu = per_gpu_rows(result)
    per, _series = figures(result, t)
    for fig in per:
        rows = rows_by_gpu.get(fig["pci"] or fig["index"], [])
        index, pci = fig["index"], fig["pci"]
        label = gpu_label(host, index, pci)
        limit = t["gpufleet_temp_max_c"]
        if fig["seconds_above_limit_s"] >= t["gpufleet_temp_sustained_s"]:
            out.append(finding("fail", "THERMAL_SUSTAINED", "%s ran above %g C for %.0f s under load (max %g C, "
                               "limit %g s)" % (label, limit, fig["seconds_above_limit_s"], fig["max_temperature_c"],
                                                t["gpufleet_temp_sustained_s"]),
                               "fix the airflow around %s: fans, blanking panels, filters, inlet temperature, card "
                               "spacing" % label, _lines(_hot_rows(rows, limit)), index, pci))
        if fig["throttled_samples"]:
            out.append(finding("warn", "THERMAL_THROTTLE", "%s throttled for temperature in %d of %d samples" % (
                               label, fig["throttled_samples"], fig["samples"]),
                               "check the airflow around %s (fans, blanking panels, inlet temperature)" % label,
                               _lines(_throttled_rows(rows)), index, pci))
        gen, width = fig["pcie_gen_under_load"], fig["pcie_width_under_load"]
        gen_max, width_max = fig["pcie_gen_max"], fig["pcie_width_max"]
        if (gen and gen_max and gen < gen_max) or (width and width_max and width < width_max):
            out.append(finding("fail", "PCIE_DEGRADED", "%s PCIe link under load is gen %s x%s, max gen %s x%s (%d "
                               "samples)" % (label, gen or "?", width or "?", gen_max, width_max,
                                             fig["loaded_samples"]),
                               "reseat or replace the riser of %s, or move the card to another slot; check the slot's "
                               "BIOS link setting" % label, _lines(_loaded_rows(rows, t)), index, pci))
        first, last = fig["ecc_corrected_first"], fig["ecc_corrected_last"]
        if first is not None and last - first >= t["gpufleet_ecc_corrected_rise"]:
            out.append(finding("warn", "ECC_CORRECTED_RISING", "%s volatile corrected ECC rose from %d to %d during "
                               "the run" % (label, first, last), "slow ECC leak: schedule replacement, watch %s" % label,
                               ["ecc_volatile_corrected first=%d last=%d" % (first, last)], index, pci))
    if not per and not result.get("not_run"):
        reason = result.get("stop_reason") or "no sample was taken"
        out.append(finding("error", "SAMPLES_MISSING", "%s: no nvidia-smi sample under load: %s" % (host, reason),
                           "check nvidia-smi on %s; temperatures and the PCIe link under load were not checked" % host,
                           [reason]))
    return out
