"""The slow ECC leak day by day: a GPU's XID 92 rate grows from weekly to hourly, its corrected ECC count with it,
until an uncorrectable error (XID 48, a pending row remap) on `uncorrectable_day` (scenario gpus."<i>".ecc_leak).

It follows the node's clock (`gpufleet-sim clock`, simulated days): an audit run after `clock --advance 1` finds the
day's XID 92 lines in the kernel log, at their own times, and the counters grown. The rate is
lambda(t) = start * exp(k t) events/day, k = ln(end/start) / ramp_days, then `end` per day after the ramp.

    "ecc_leak": {"xid92_per_day_start": 0.143, "xid92_per_day_end": 24, "ramp_days": 24,
                 "corrected_per_xid92": 40, "correctable_remaps_per_xid92": 0.125, "uncorrectable_day": 24}
"""

import math

from . import klog

STATE = "leak.json"
XID48_BODY = ("An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
              "subpartition 0.")
XID63_BODY = "Row Remapper: New row (0x0000000000b2d140) marked for remapping, reset gpu to activate."
XID92_BODY = "High single-bit ECC error rate detected"


def _params(cfg):
    start = float(cfg.get("xid92_per_day_start", 1.0 / 7))
    end = float(cfg.get("xid92_per_day_end", 24.0))
    ramp = float(cfg.get("ramp_days", 24.0))
    k = math.log(end / start) / ramp if end > start and ramp > 0 else 0.0
    return start, end, ramp, k


def events_by(cfg, day):
    """Expected XID 92 events from day 0 to `day` (continuous)."""
    if day <= 0:
        return 0.0
    start, end, ramp, k = _params(cfg)
    if k == 0:
        return start * day
    if day <= ramp:
        return start / k * (math.exp(k * day) - 1.0)
    return start / k * (math.exp(k * ramp) - 1.0) + end * (day - ramp)


def event_day(cfg, n):
    """The day of the n-th XID 92 event (1-based)."""
    start, end, ramp, k = _params(cfg)
    if k == 0:
        return n / start
    at_ramp = events_by(cfg, ramp)
    if n <= at_ramp:
        return math.log(1.0 + n * k / start) / k
    return ramp + (n - at_ramp) / end


def counters(cfg, day, banks):
    """What the leak adds to the GPU's ECC bookkeeping on `day`."""
    n = events_by(cfg, day)
    broken = day >= float(cfg.get("uncorrectable_day", 1e9))
    corr_remaps = int(n * float(cfg.get("correctable_remaps_per_xid92", 0.125)))
    return {
        "corrected": int(n * float(cfg.get("corrected_per_xid92", 40))),
        "uncorrected": 1 if broken else 0,
        "remapped_rows_correctable": corr_remaps,
        "remapped_rows_uncorrectable": 1 if broken else 0,
        "remapped_rows_pending": broken,
        "histogram": {"max": max(0, banks - corr_remaps - (1 if broken else 0)), "high": min(banks, corr_remaps),
                      "partial": 0, "low": 1 if broken else 0, "none": 0},
    }


def materialize(node):
    """Append the kernel lines of every leak event due by the node's clock and not yet logged (once per state)."""
    leaking = [(g, g["ecc_leak"]) for g in node.gpus if isinstance(g.get("ecc_leak"), dict)]
    if not leaking:
        return
    day = node.clock_days()
    created = node.info["created"]
    with node.lock():
        done = node.read_json(STATE, {}) or {}
        lines = []
        for gpu, cfg in leaking:
            key = str(gpu["index"])
            written = int(done.get(key, 0))
            due = int(events_by(cfg, day))
            for n in range(written + 1, due + 1):
                when = created + event_day(cfg, n) * 86400.0
                for line in klog.xid_event_lines(gpu, 92, XID92_BODY, first=(n == 1)):
                    lines.append((when, line))
            done[key] = max(written, due)
            broken_day = float(cfg.get("uncorrectable_day", 1e9))
            if day >= broken_day and not done.get(key + ":uncorrectable"):
                when = created + broken_day * 86400.0
                lines.append((when, klog.xid_line(gpu, 48, XID48_BODY)))
                lines.append((when + 0.0004, klog.xid_line(gpu, 63, XID63_BODY)))
                done[key + ":uncorrectable"] = True
        node.write_json(STATE, done)
    lines.sort(key=lambda item: item[0])
    for when, line in lines:
        node.append_kernel([line], when=when)
