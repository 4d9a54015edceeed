# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge a GPU's history: the slow ECC leak as a trend, memory spares running out, heat and PCIe replays creeping up
(stdlib only, pure: the history store's rows in, findings out).

The silent killer: a GPU corrects more and more single-bit errors and logs XID 92 weekly, then daily, then hourly,
until an uncorrectable error (XID 48) kills a job. Each audit on its own sees one more warning; the history shows the
acceleration. Rates are computed from counters between audits (a counter that goes down was reset: its new value is
all new), over a recent window compared with the window before it. Limits are NVIDIA's (GPU memory error
management): 64 retired pages on pre-Ampere cards; 512 uncorrectable row remaps per framebuffer and 8 per bank on
Ampere and later (the bank histogram's Low/None banks are the ones about to run out).

Input (`result`): {"now_ts": epoch seconds of this run,
                   "gpus": [{"index", "pci", "uuid", "samples": [{"ts", <counter columns>}, ...] oldest first,
                             "xid92_ts": [epoch of each XID 92 event]}],
                   "node": {"reachable": bool, "last_pass_ts": epoch or None}}
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, gpu_label
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door

CHECK = "trend"
# Every finding this judge can return: code -> (severity, what it means). docs/rules.md is generated from these.
CODES = {
    "ECC_LEAK_ACCELERATING": ("fail", "corrected ECC per day in the recent window >= gpufleet_trend_acceleration_factor "
                                      "x the window before, and above gpufleet_trend_ecc_rate_warn_per_day"),
    "ECC_RATE_HIGH": ("warn", "corrected ECC per day at or above gpufleet_trend_ecc_rate_warn_per_day, not (yet) "
                              "accelerating"),
    "XID92_ACCELERATING": ("fail", "XID 92 (excessive single-bit ECC) coming faster: the recent rate >= "
                                   "gpufleet_trend_acceleration_factor x the earlier one"),
    "RETIRED_PAGES_TREND": ("warn", "retired pages growing; at this rate the 64-page limit is reached within "
                                    "gpufleet_trend_exhaustion_days"),
    "REMAPPED_ROWS_TREND": ("warn", "uncorrectable row remaps growing; at this rate the 512-remap limit is reached "
                                    "within gpufleet_trend_exhaustion_days"),
    "REMAP_BANKS_DECLINING": ("warn", "more memory banks at Low/None remap availability than at the start of the window"),
    "TEMPERATURE_CREEP": ("warn", "GPU temperature at equal load (same power band) up by gpufleet_trend_temp_rise_c or "
                                  "more against the earlier window"),
    "PCIE_REPLAYS_RISING": ("warn", "PCIe replays per day at or above gpufleet_trend_pcie_replays_per_day"),
    "HISTORY_STALE": ("error", "the node did not answer and has no passing run for gpufleet_history_stale_days (or "
                               "ever): its health is unknown, not healthy"),
}

DAY_S = 86400.0
# A rate needs this much covered time: audits minutes apart say nothing per day.
MIN_SPAN_DAYS = 0.2
RETIRED_PAGES_LIMIT = 64
REMAP_LIMIT = 512
POWER_BAND = 0.2  # equal load = the same fifth of the power limit


def _num(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sum(sample, keys):
    values = [_num(sample.get(k)) for k in keys]
    return None if all(v is None for v in values) else sum(v for v in values if v is not None)


def increments(samples, keys):
    """[(ts_before, ts, increase)] between consecutive samples that both have the counter (sum of `keys`). A counter
    that went down was reset (driver reload for volatile counters): its new value counts as the increase."""
    out = []
    prev = None
    for sample in samples:
        ts, value = _num(sample.get("ts")), _sum(sample, keys)
        if ts is None or value is None:
            continue
        if prev is not None and ts > prev[0]:
            out.append((prev[0], ts, value - prev[1] if value >= prev[1] else value))
        prev = (ts, value)
    return out


def rate(incs, since, until):
    """(per day, covered days, total increase) over the increments ending in (since, until], or None when the covered
    time is too short to call a rate."""
    inside = [i for i in incs if since < i[1] <= until]
    if not inside:
        return None
    span = (inside[-1][1] - inside[0][0]) / DAY_S
    if span < MIN_SPAN_DAYS:
        return None
    total = sum(i[2] for i in inside)
    return total / span, span, total


def _windows(t, now):
    recent = float(t["gpufleet_trend_recent_days"]) * DAY_S
    earlier = float(t["gpufleet_trend_window_days"]) * DAY_S
    return (now - recent, now), (now - recent - earlier, now - recent)


def _ecc_keys(samples):
    # The lifetime counter survives driver reloads; the volatile one is used where the card has no aggregate.
    last = samples[-1] if samples else {}
    return ("ecc_corr_agg",) if _num(last.get("ecc_corr_agg")) is not None else ("ecc_corr_vol",)


def _day(ts):
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) + "Z"


def _fmt_gap(seconds):
    if seconds >= DAY_S:
        return "%.1f d" % (seconds / DAY_S)
    if seconds >= 3600:
        return "%.1f h" % (seconds / 3600.0)
    return "%.0f min" % (seconds / 60.0)


def _latched(gpu, code):
    """The date this GPU was first flagged with `code` in its run of uninterrupted flags up to the previous reading,
    or None. An accelerating leak stays flagged while it does not slow down: small counts early in a leak would
    otherwise make the verdict flap from one night to the next."""
    since = None
    for sample in reversed((gpu.get("samples") or [])[:-1]):
        codes = sample.get("codes") if isinstance(sample.get("codes"), str) else ""
        if code not in codes.split(","):
            break
        since = _num(sample.get("ts"))
    return since


def _ecc(gpu, t, now, label, index, pci):
    samples = gpu.get("samples") or []
    keys = _ecc_keys(samples)
    incs = increments(samples, keys)
    (r0, r1), (e0, e1) = _windows(t, now)
    recent, earlier = rate(incs, r0, r1), rate(incs, e0, e1)
    warn_rate = float(t["gpufleet_trend_ecc_rate_warn_per_day"])
    if recent is None or recent[0] < warn_rate:
        return []
    counter = keys[0].replace("ecc_corr_agg", "aggregate").replace("ecc_corr_vol", "volatile")
    evidence = ["corrected ECC (%s): %s" % (counter, ", ".join(
        "%s=%s" % (_day(s["ts"]), _sum(s, keys)) for s in samples[-6:] if _num(s.get("ts")) is not None))]
    evidence.append("recent %.1f/day over %.1f d; earlier %s" % (
        recent[0], recent[1], "%.1f/day over %.1f d" % (earlier[0], earlier[1]) if earlier else "no data"))
    replace = ("drain %s and replace the card before an uncorrectable error (XID 48) kills a job: the slow ECC leak; "
               "until then keep jobs on it checkpointing often" % label)
    factor = float(t["gpufleet_trend_acceleration_factor"])
    latched = _latched(gpu, "ECC_LEAK_ACCELERATING")
    if earlier is not None and earlier[0] > 0 and (recent[0] >= factor * earlier[0] or (
            latched is not None and recent[0] >= earlier[0])):
        still = "; flagged since %s and not slowing down" % _day(latched) if latched is not None and \
            recent[0] < factor * earlier[0] else ""
        return [finding("fail", "ECC_LEAK_ACCELERATING", "%s corrects %.0f ECC errors/day now, %.1fx the %.1f/day of "
                        "the %.0f days before: the leak is accelerating%s" % (
                            label, recent[0], recent[0] / earlier[0], earlier[0], earlier[1], still),
                        replace, evidence, index, pci)]
    return [finding("warn", "ECC_RATE_HIGH", "%s corrects %.0f ECC errors/day (>= %g/day)" % (
        label, recent[0], warn_rate), "watch %s: schedule its replacement if the rate keeps growing (a slow ECC "
        "leak); check its XID 92 history" % label, evidence, index, pci)]


def _xid92(gpu, t, now, label, index, pci):
    times = sorted(ts for ts in (_num(x) for x in gpu.get("xid92_ts") or []) if ts is not None and ts <= now)
    if len(times) < int(t["gpufleet_trend_xid92_min_events"]):
        return []
    (r0, r1), (e0, e1) = _windows(t, now)
    first_seen = min([_num(s.get("ts")) for s in gpu.get("samples") or [] if _num(s.get("ts")) is not None]
                     + [times[0]])
    e0 = max(e0, first_seen)
    earlier_days = (e1 - e0) / DAY_S
    recent_days = (r1 - r0) / DAY_S
    recent_n = len([x for x in times if r0 < x <= r1])
    earlier_n = len([x for x in times if e0 <= x <= e1])
    if earlier_days < 1.0 or recent_n < 2 or earlier_n < 1:
        return []
    recent_rate, earlier_rate = recent_n / recent_days, earlier_n / earlier_days
    factor = float(t["gpufleet_trend_acceleration_factor"])
    latched = _latched(gpu, "XID92_ACCELERATING")
    if recent_rate < factor * earlier_rate and (latched is None or recent_rate < earlier_rate):
        return []
    still = "; flagged since %s and not slowing down" % _day(latched) if latched is not None and \
        recent_rate < factor * earlier_rate else ""
    gaps = [times[i + 1] - times[i] for i in range(len(times) - 1)]
    evidence = ["XID 92 at %s" % ", ".join(_day(x) for x in times[-8:]),
                "gaps between them: %s" % ", ".join(_fmt_gap(g) for g in gaps[-8:])]
    return [finding("fail", "XID92_ACCELERATING", "%s logs XID 92 (excessive single-bit ECC rate) %.1f times/day now, "
                    "%.1fx the %.2f/day of the %.0f days before (%d events in all): the slow ECC leak%s" % (
                        label, recent_rate, recent_rate / earlier_rate if earlier_rate else 0.0, earlier_rate,
                        earlier_days, len(times), still),
                    "drain %s and replace the card before XID 48 (an uncorrectable error) kills a job" % label,
                    evidence, index, pci)]


def _projection(gpu, t, now, keys, limit):
    """(current value, per day, days left) of a counter growing toward `limit` over the whole window."""
    samples = gpu.get("samples") or []
    incs = increments(samples, keys)
    (_r0, r1), (e0, _e1) = _windows(t, now)
    got = rate(incs, e0, r1)
    current = next((_sum(s, keys) for s in reversed(samples) if _sum(s, keys) is not None), None)
    if got is None or current is None or got[0] <= 0:
        return None
    return current, got[0], max(0.0, (limit - current) / got[0])


def _spares(gpu, t, now, label, index, pci):
    out = []
    horizon = float(t["gpufleet_trend_exhaustion_days"])
    rma = "plan the replacement of %s (RMA) before the spares run out; drain it when the limit is near" % label
    def words(keys, what, limit):
        got = _projection(gpu, t, now, keys, limit)
        if not got or got[2] > horizon:
            return None
        return ("%s has %d %s, +%.1f/day: the limit of %d is reached in ~%.0f days" % (
            label, got[0], what, got[1], limit, got[2]),
            ["%s=%s at %s" % (what, _sum(s, keys), _day(s["ts"])) for s in (gpu.get("samples") or [])[-5:]
             if _num(s.get("ts")) is not None])

    pages = words(("retired_sbe", "retired_dbe"), "retired pages", RETIRED_PAGES_LIMIT)
    if pages:
        out.append(finding("warn", "RETIRED_PAGES_TREND", pages[0], rma, pages[1], index, pci))
    rows = words(("remap_uncorr",), "uncorrectable row remaps", REMAP_LIMIT)
    if rows:
        out.append(finding("warn", "REMAPPED_ROWS_TREND", rows[0], rma, rows[1], index, pci))
    samples = [s for s in gpu.get("samples") or [] if _sum(s, ("banks_low", "banks_none")) is not None
               and _num(s.get("ts")) is not None]
    (_r0, _r1), (e0, _e1) = _windows(t, now)
    inside = [s for s in samples if s["ts"] >= e0]
    if len(inside) >= 2:
        before, after = _sum(inside[0], ("banks_low", "banks_none")), _sum(inside[-1], ("banks_low", "banks_none"))
        if after > before:
            out.append(finding("warn", "REMAP_BANKS_DECLINING", "%s: %d memory bank(s) at Low/None remap availability, "
                               "%d at %s: spare rows are running out (8 per bank)" % (
                                   label, after, before, _day(inside[0]["ts"])), rma,
                               ["banks low=%s none=%s at %s" % (s.get("banks_low"), s.get("banks_none"),
                                                                _day(s["ts"])) for s in inside[-5:]], index, pci))
    return out


def _median(values):
    values = sorted(values)
    n = len(values)
    return None if not n else (values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2.0)


def _temperature(gpu, t, now, label, index, pci):
    (r0, r1), (e0, e1) = _windows(t, now)
    bands = {}
    for s in gpu.get("samples") or []:
        ts, temp, power, limit = (_num(s.get(k)) for k in ("ts", "temperature_c", "power_w", "power_limit_w"))
        if None in (ts, temp, power) or not limit or limit < 1.0:
            continue
        share = power / limit
        if not 0.0 <= share <= 2.0:  # a reading that is not a GPU's power (garbage, a unit error)
            continue
        band = int(share / POWER_BAND)
        slot = "recent" if r0 < ts <= r1 else ("earlier" if e0 < ts <= e1 else None)
        if slot:
            bands.setdefault(band, {"recent": [], "earlier": []})[slot].append(temp)
    rise_limit = float(t["gpufleet_trend_temp_rise_c"])
    for band in sorted(bands, reverse=True):
        recent, earlier = bands[band]["recent"], bands[band]["earlier"]
        if len(recent) < 2 or len(earlier) < 3:
            continue
        rise = _median(recent) - _median(earlier)
        if rise >= rise_limit:
            low, high = int(band * POWER_BAND * 100), int((band + 1) * POWER_BAND * 100)
            return [finding("warn", "TEMPERATURE_CREEP", "%s runs %.0f C hotter at equal load (%d-%d%% of its power "
                            "limit): median %.0f C now, %.0f C before" % (
                                label, rise, low, high, _median(recent), _median(earlier)),
                            "clean the filters and heatsink of %s, check its fans and the inlet temperature; "
                            "re-paste the card if it persists" % label,
                            ["earlier %s C; recent %s C (power band %d-%d%%)" % (earlier[-6:], recent[-6:], low, high)],
                            index, pci)]
    return []


def _replays(gpu, t, now, label, index, pci):
    incs = increments(gpu.get("samples") or [], ("pcie_replays",))
    (_r0, r1), (e0, _e1) = _windows(t, now)
    got = rate(incs, e0, r1)
    limit = float(t["gpufleet_trend_pcie_replays_per_day"])
    if got is None or got[0] < limit:
        return []
    return [finding("warn", "PCIE_REPLAYS_RISING", "%s: PCIe replays grow by %.0f/day (%d in %.1f days, >= %g/day)" % (
        label, got[0], got[2], got[1], limit), "reseat or replace the riser/cable of %s (or move it to another "
        "slot) before the link degrades or the GPU falls off the bus" % label,
        ["pcie_replays=%s at %s" % (s.get("pcie_replays"), _day(s["ts"])) for s in (gpu.get("samples") or [])[-5:]
         if _num(s.get("ts")) is not None], index, pci)]


@judge_door(CHECK)
def judge(result, t, host):
    """[finding] for one node's history (see the module docstring for the shape)."""
    now = _num(result.get("now_ts"))
    out = []
    node = result.get("node") or {}
    if node.get("reachable") is False:
        last = _num(node.get("last_pass_ts"))
        days = float(t["gpufleet_history_stale_days"])
        if last is None or (now is not None and now - last >= days * DAY_S):
            since = "never" if last is None else "%s (%.1f days ago)" % (_day(last), (now - last) / DAY_S)
            out.append(finding("error", "HISTORY_STALE", "%s: no passing run in the history since %s: its health is "
                               "unknown" % (host, since),
                               "bring %s back (power, network, sshd) and audit it; until then treat it as unhealthy"
                               % host, ["last passing run (pass or warn): %s" % since]))
    if now is None:
        return out
    for gpu in result.get("gpus") or []:
        index, pci = gpu.get("index"), gpu.get("pci")
        label = gpu_label(host, index, pci)
        for part in (_ecc, _xid92, _spares, _temperature, _replays):
            out.extend(part(gpu, t, now, label, index, pci))
    return out


def _no_figures():
    return []


@judge_door(CHECK, empty=_no_figures)
def figures(result, t):
    """Per GPU: the rates the judge compared ([{index, pci, ecc_per_day_recent, ecc_per_day_earlier,
    xid92_events, replays_per_day}]), for the report's trend view."""
    now = _num(result.get("now_ts"))
    out = []
    if now is None:
        return out
    (r0, r1), (e0, e1) = _windows(t, now)
    for gpu in result.get("gpus") or []:
        samples = gpu.get("samples") or []
        incs = increments(samples, _ecc_keys(samples))
        recent, earlier = rate(incs, r0, r1), rate(incs, e0, e1)
        replays = rate(increments(samples, ("pcie_replays",)), e0, r1)
        out.append({"index": gpu.get("index"), "pci": gpu.get("pci"),
                    "ecc_per_day_recent": round(recent[0], 2) if recent else None,
                    "ecc_per_day_earlier": round(earlier[0], 2) if earlier else None,
                    "xid92_events": len(gpu.get("xid92_ts") or []),
                    "replays_per_day": round(replays[0], 2) if replays else None})
    return out


def ecc_rate_series(samples):
    """[[ts, corrected ECC per day]] between consecutive samples (the curve that shows an acceleration)."""
    out = []
    for before, ts, inc in increments(samples, _ecc_keys(samples)):
        span = (ts - before) / DAY_S
        if span >= MIN_SPAN_DAYS / 4:
            out.append([ts, round(inc / span, 3)])
    return out
