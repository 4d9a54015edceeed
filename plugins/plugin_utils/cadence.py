# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Checkpoint cadence and the cost of failures (controller side, pure functions; docs/training.md).

From the job's size (GPUs), the failure rate (GPU-hours per interruption), the checkpoint write time (checkpoint size
over the write speed the checkpoint_storage check measured) and the restart time:

    MTBF of the job            M = gpu_hours_per_failure / gpus                      (hours)
    interruptions per day        = 24 / M
    checkpoint write time      d = checkpoint_size / write_speed                     (seconds)
    optimal interval (Young)   t* = sqrt(2 d M)
    share of GPU time lost     W(t) = d / t  +  (t / 2 + R) / M
                                      ^ writing checkpoints  ^ work redone after an interruption (half an interval on
                                                               average) and the restart R itself
    GPU-hours lost per day       = gpus x 24 x W(t),   cost = that x price per GPU-hour

Assumptions (first order, as in Young 1974): interruptions arrive at a constant rate (exponential inter-arrival
times), a checkpoint stops training while it is written (synchronous), d and R are small against M, and a restart
resumes from the last complete checkpoint. Daly 2006 gives a higher-order optimum; within these assumptions it differs
from Young's by a few percent and is shown for reference.

The failure rate is the inventory's gpufleet_failure_gpu_hours when set; else the fleet's own rate from the audit
history when there is one (failure_rate, history.failure_observations); else the constant below.
"""

from __future__ import annotations

import math

DEFAULT_GPU_HOURS_PER_FAILURE = 50000.0
HISTORY_DAYS = 90
SETTINGS = ("gpufleet_cadence_gpus", "gpufleet_failure_gpu_hours", "gpufleet_restart_min", "gpufleet_gpu_hour_price")


def _num(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def mtbf_hours(gpus, gpu_hours_per_failure):
    return gpu_hours_per_failure / gpus


def interruptions_per_day(gpus, gpu_hours_per_failure):
    return 24.0 * gpus / gpu_hours_per_failure


def checkpoint_write_s(checkpoint_size_gb, write_mb_per_s):
    return checkpoint_size_gb * 1000.0 / write_mb_per_s


def young_interval_s(write_s, mtbf_s):
    return math.sqrt(2.0 * write_s * mtbf_s)


def daly_interval_s(write_s, mtbf_s):
    """Daly's higher-order optimum (FGCS 22(3), 2006), for write_s < 2 x MTBF; the MTBF itself beyond."""
    if write_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = write_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * write_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - write_s


def lost_share(interval_s, write_s, mtbf_s, restart_s):
    """(share of GPU time spent writing checkpoints, share lost to interruptions: rework and restarts)."""
    return write_s / interval_s, (interval_s / 2.0 + restart_s) / mtbf_s


def at_interval(interval_s, gpus, write_s, mtbf_s, restart_s, price):
    writing, failures = lost_share(interval_s, write_s, mtbf_s, restart_s)
    gpu_hours = gpus * 24.0 * (writing + failures)
    return {
        "interval_min": round(interval_s / 60.0, 2),
        "checkpoint_overhead_pct": round(100.0 * writing, 4),
        "lost_pct": round(100.0 * (writing + failures), 4),
        "lost_gpu_hours_per_day": round(gpu_hours, 3),
        "lost_to_checkpoints_gpu_hours_per_day": round(gpus * 24.0 * writing, 3),
        "lost_to_interruptions_gpu_hours_per_day": round(gpus * 24.0 * failures, 3),
        "cost_per_day": round(gpu_hours * price, 2) if price is not None else None,
        "worst_case_lost_min": round(interval_s / 60.0 + restart_s / 60.0, 2),
    }


def plan(gpus, gpu_hours_per_failure, write_s=None, interval_min=None, restart_min=2.0, price=None):
    """Every figure of the plan; the keys that need a missing input are None and `missing` says why. Never raises."""
    out = {"status": "ok", "missing": [], "interruptions_per_day": None, "mtbf_hours": None, "checkpoint_write_s": None,
           "optimal_interval_min": None, "daly_interval_min": None, "current": None, "optimal": None,
           "saving_gpu_hours_per_day": None, "saving_per_day": None}
    if not (_num(gpus) and gpus > 0):
        out["missing"].append("the number of GPUs (gpufleet_cadence_gpus, or a report with GPUs)")
    if not (_num(gpu_hours_per_failure) and gpu_hours_per_failure > 0):
        out["missing"].append("a failure rate > 0 (gpufleet_failure_gpu_hours)")
    if out["missing"]:
        out["status"] = "incomplete"
        return out
    mtbf_h = mtbf_hours(gpus, gpu_hours_per_failure)
    out["mtbf_hours"] = round(mtbf_h, 3)
    out["interruptions_per_day"] = round(interruptions_per_day(gpus, gpu_hours_per_failure), 5)
    if not (_num(write_s) and write_s > 0):
        out["missing"].append("the checkpoint write time: a checkpoint_storage result with a measured write speed and "
                              "gpufleet_checkpoint_size_gb, or --checkpoint-gb and --write-mb-s")
        out["status"] = "incomplete"
        return out
    restart_s = 60.0 * restart_min if _num(restart_min) and restart_min >= 0 else 120.0
    price = price if _num(price) and price >= 0 else None
    mtbf_s = mtbf_h * 3600.0
    best = young_interval_s(write_s, mtbf_s)
    out["checkpoint_write_s"] = round(write_s, 3)
    out["optimal_interval_min"] = round(best / 60.0, 2)
    out["daly_interval_min"] = round(daly_interval_s(write_s, mtbf_s) / 60.0, 2)
    out["optimal"] = at_interval(best, gpus, write_s, mtbf_s, restart_s, price)
    if _num(interval_min) and interval_min > 0:
        out["current"] = at_interval(60.0 * interval_min, gpus, write_s, mtbf_s, restart_s, price)
        out["saving_gpu_hours_per_day"] = round(out["current"]["lost_gpu_hours_per_day"]
                                                - out["optimal"]["lost_gpu_hours_per_day"], 3)
        if price is not None:
            out["saving_per_day"] = round(out["saving_gpu_hours_per_day"] * price, 2)
    else:
        out["missing"].append("the current checkpoint interval (gpufleet_checkpoint_interval_min, --interval-min)")
    return out


def failure_rate(inventory_value=None, history=None, default=DEFAULT_GPU_HOURS_PER_FAILURE):
    """(GPU-hours per failure, source words). inventory_value: the operator's figure, used as given. history: the
    store's observations {failures, gpu_hours, window_days}; the fleet's own rate, with one pseudo-failure at the
    default rate so that a short or failure-free history does not claim an infinite MTBF:
        (gpu_hours + default) / (failures + 1)."""
    if _num(inventory_value) and inventory_value > 0:
        return float(inventory_value), "inventory gpufleet_failure_gpu_hours"
    if isinstance(history, dict) and _num(history.get("gpu_hours")) and isinstance(history.get("failures"), int) \
            and history["gpu_hours"] >= 0 and history["failures"] >= 0:
        rate = (history["gpu_hours"] + default) / (history["failures"] + 1)
        return rate, "audit history: %d interruption(s) in %.0f GPU-hours over %s days, with one at the default " \
                     "rate of 1 per %.0f GPU-hours" % (history["failures"], history["gpu_hours"],
                                                        history.get("window_days", "?"), default)
    return default, "the default, from Llama 3 405B training (2024)"


def history_observations(history_dir, days=HISTORY_DAYS):
    """The history's failure observations, or (None, why): without a history the plan uses the inventory's or the
    default rate, and a broken history never loses the report."""
    if not history_dir:
        return None, "no gpufleet_history_dir"
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils import history

    try:
        obs = history.failure_observations(history_dir, days)
    except Exception as exc:  # noqa: BLE001 (a damaged or foreign file, a newer schema: said in the plan's notes)
        return None, "the history could not be read: %s" % exc
    return obs, None if obs else "no GPU-hours in the history yet"


def write_time_from_report(report):
    """(seconds, node, write MB/s, interval min) of the slowest node's checkpoint, from report.json's
    checks.checkpoint_storage.figures (estimated_checkpoint_s, write_mb_per_s, worst_case_lost_min)."""
    slowest, interval = None, None
    for node in report.get("nodes") or []:
        fig = ((node.get("checks") or {}).get("checkpoint_storage") or {}).get("figures") or {}
        est, rate = fig.get("estimated_checkpoint_s"), fig.get("write_mb_per_s")
        if _num(fig.get("worst_case_lost_min")):
            interval = max(interval or 0.0, fig["worst_case_lost_min"])
        if _num(est) and est > 0 and (slowest is None or est > slowest[0]):
            slowest = (est, node.get("host"), rate)
    if slowest is None:
        return None, None, None, interval
    return slowest[0], slowest[1], slowest[2], interval


def settings_from(hostdata):
    """The cadence settings of the fleet: the first host (by name) whose inventory sets each one."""
    from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import resolve

    out = {}
    for host in sorted(hostdata):
        values, sources, _errors = resolve(hostdata[host] or {}, host)
        for name in SETTINGS + ("gpufleet_history_dir",):
            if name not in out and sources.get(name, "").startswith("inventory"):
                out[name] = values[name]
            elif name == "gpufleet_history_dir" and name not in out and (hostdata[host] or {}).get(name):
                out[name] = str(hostdata[host][name])
    return out


def report_section(report, hostdata=None, history=None, history_dir=None):
    """The report's `cadence` section from report.json's figures and the inventory's settings (hostdata: the
    gpufleet_* variables per host, as the fleet report reads them). history: observations, or None to ask the store
    in history_dir (the report's history step), else at the inventory's gpufleet_history_dir."""
    from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULTS

    s = settings_from(hostdata or {})
    notes = []
    if history is None:
        history_dir = history_dir or s.get("gpufleet_history_dir")
        history, why = history_observations(history_dir)
        if why and history_dir:
            notes.append(why)
    default = DEFAULTS.get("gpufleet_failure_gpu_hours") or DEFAULT_GPU_HOURS_PER_FAILURE
    rate, rate_source = failure_rate(s.get("gpufleet_failure_gpu_hours"), history, default)
    gpus = s.get("gpufleet_cadence_gpus") or (report.get("summary") or {}).get("gpus")
    write_s, node, write_mb_s, interval = write_time_from_report(report)
    restart_min = s.get("gpufleet_restart_min", DEFAULTS.get("gpufleet_restart_min", 2.0))
    price = s.get("gpufleet_gpu_hour_price")
    out = plan(gpus, rate, write_s, interval, restart_min, price)
    out["inputs"] = {
        "gpus": gpus, "gpus_source": "inventory gpufleet_cadence_gpus" if s.get("gpufleet_cadence_gpus") else
        "the GPUs in this report",
        "gpu_hours_per_failure": round(rate, 1), "failure_source": rate_source,
        "checkpoint_write_s": round(write_s, 3) if write_s else None, "write_mb_per_s": write_mb_s,
        "slowest_node": node, "interval_min": interval, "restart_min": restart_min, "gpu_hour_price": price,
    }
    out["notes"] = notes
    return out


def error_section(why):
    """The section when the plan itself failed: the report is written anyway, with the reason."""
    out = plan(None, None)
    inputs = dict.fromkeys(("gpus", "gpu_hours_per_failure", "checkpoint_write_s", "write_mb_per_s", "slowest_node",
                            "interval_min", "restart_min", "gpu_hour_price"))
    inputs.update(gpus_source="-", failure_source="-")
    out.update({"status": "error", "missing": ["the checkpoint plan could not be computed: %s" % why],
                "inputs": inputs, "notes": []})
    return out


def _fmt(value, unit="", digits=2):
    if value is None:
        return "-"
    return ("%." + str(digits) + "f%s") % (value, unit)


def markdown(section):
    """The report.md section (report.html has its own template, report_cadence.html.j2)."""
    if not section:
        return ""
    i = section.get("inputs") or {}
    lines = ["## Checkpoint cadence", "",
             "%s GPUs (%s); 1 interruption per %s GPU-hours (%s): %s interruptions a day, a job MTBF of %s h." % (
                 i.get("gpus") or "?", i.get("gpus_source"), _fmt(i.get("gpu_hours_per_failure"), digits=0),
                 i.get("failure_source"), _fmt(section.get("interruptions_per_day"), digits=3),
                 _fmt(section.get("mtbf_hours"), digits=1))]
    if section["status"] != "ok":
        lines += ["", "Not computed: " + "; ".join(section["missing"]) + "."]
        return "\n".join(lines) + "\n"
    lines += ["", "Checkpoint write: %s s (slowest node %s at %s MB/s). Young's optimal interval: %s min (Daly: %s "
              "min)." % (_fmt(section["checkpoint_write_s"], digits=1), i.get("slowest_node"),
                         _fmt(i.get("write_mb_per_s"), digits=0), _fmt(section["optimal_interval_min"], digits=1),
                         _fmt(section["daly_interval_min"], digits=1)), "",
              "| interval | checkpoint overhead | lost GPU-hours/day | cost/day | worst case lost |", "|---|---|---|---|---|"]
    for label, row in (("current", section.get("current")), ("optimal", section.get("optimal"))):
        if row:
            lines.append("| %s: %s min | %s | %s | %s | %s min |" % (
                label, _fmt(row["interval_min"], digits=1), _fmt(row["checkpoint_overhead_pct"], "%", 3),
                _fmt(row["lost_gpu_hours_per_day"], digits=3), _fmt(row["cost_per_day"]),
                _fmt(row["worst_case_lost_min"], digits=1)))
    return "\n".join(lines) + "\n"
