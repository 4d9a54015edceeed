"""judge_trend, judge_drift, judge_baseline and judge_snapshot: each code at its boundary, the thresholds change the
answer, a healthy history says nothing, and input of the wrong shape is one error finding, never an exception."""

import copy
import math
import os
import sys

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import (
    judge_baseline,
    judge_drift,
    judge_snapshot,
    judge_trend,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULTS
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "judges"))
from judgelib import HOST, check_shape, codes  # noqa: E402

DAY = 86400.0
T0 = 1.8e9
PCI = "0000:47:00"


def t(**over):
    out = copy.deepcopy(DEFAULTS)
    out.update(over)
    return out


def sample(day, **values):
    row = {"ts": T0 + day * DAY}
    row.update(values)
    return row


def leak_history(days=21, rate=lambda d: 0.143 * math.exp(0.213 * d)):
    """Daily samples of a GPU whose corrected ECC and XID 92 grow like the slow leak."""
    samples, xids, total, n = [], [], 0.0, 0.0
    for d in range(days + 1):
        total += 40 * rate(d)
        samples.append(sample(d, ecc_corr_agg=int(total), ecc_corr_vol=int(total)))
    day = 0.0
    while day < days:
        day += 1.0 / rate(day)
        if day <= days:
            xids.append(T0 + day * DAY)
            n += 1
    return samples, xids


def trend_input(samples, xids=(), now_day=None, **node):
    now = samples[-1]["ts"] if now_day is None else T0 + now_day * DAY
    return {"now_ts": now, "gpus": [{"index": 2, "pci": PCI, "uuid": "GPU-x", "samples": samples,
                                     "xid92_ts": list(xids)}], "node": node}


# ---- trend ---------------------------------------------------------------------------------------------------------
def test_accelerating_leak_fails_on_ecc_and_xid92_naming_the_gpu():
    samples, xids = leak_history(21)
    found = check_shape(judge_trend.judge(trend_input(samples, xids), t(), HOST))
    assert ("ECC_LEAK_ACCELERATING", 2) in codes(found) and ("XID92_ACCELERATING", 2) in codes(found)
    for f in found:
        assert f["pci"] == PCI and "GPU 2" in f["message"] and "replace" in f["action"]
    xid = next(f for f in found if f["code"] == "XID92_ACCELERATING")
    assert any(e.startswith("gaps between them:") for e in xid["evidence"])


def test_the_leak_is_caught_early_and_the_factor_decides():
    samples, xids = leak_history(14)
    assert "XID92_ACCELERATING" in [c for c, _ in codes(judge_trend.judge(trend_input(samples, xids), t(), HOST))]
    quiet = judge_trend.judge(trend_input(samples, xids), t(gpufleet_trend_acceleration_factor=50.0), HOST)
    assert not [c for c, _ in codes(quiet) if c.endswith("ACCELERATING")]


def test_an_accelerating_leak_stays_flagged_while_it_does_not_slow_down():
    # day 14: 3 events in the last 3 days against 2 in the 11 before: 1.0/day vs 0.18/day, accelerating
    xids = [T0 + d * DAY for d in (3.0, 8.0, 11.5, 12.5, 13.5)]
    samples = [sample(d) for d in range(15)]
    assert codes(judge_trend.judge(trend_input(samples, xids), t(), HOST)) == [("XID92_ACCELERATING", 2)]
    # day 16: 2 in the last 3 days (0.67/day) against 0.31/day before: 2.1x, below the factor of 3 ...
    later = [sample(d) for d in range(17)]
    xids16 = xids + [T0 + 15.5 * DAY]
    assert judge_trend.judge(trend_input(later, xids16), t(), HOST) == []
    # ... unless the previous nights already flagged it: then it stays flagged, said so
    for s in later[12:16]:
        s["codes"] = "ECC_LEAK,XID92_ACCELERATING"
    (f,) = check_shape(judge_trend.judge(trend_input(later, xids16), t(), HOST))
    assert f["code"] == "XID92_ACCELERATING" and "flagged since" in f["message"] and "not slowing down" in f["message"]
    # a leak that slowed below its earlier rate is released
    calm = [sample(d) for d in range(40)]
    for s in calm[12:39]:
        s["codes"] = "XID92_ACCELERATING"
    assert judge_trend.judge(trend_input(calm, xids + [T0 + 37.5 * DAY]), t(), HOST) == []


def test_steady_leak_warns_without_acceleration_and_low_rate_is_silent():
    steady = [sample(d, ecc_corr_agg=100 * d) for d in range(20)]
    assert codes(judge_trend.judge(trend_input(steady), t(), HOST)) == [("ECC_RATE_HIGH", 2)]
    assert judge_trend.judge(trend_input(steady), t(gpufleet_trend_ecc_rate_warn_per_day=101.0), HOST) == []
    slow = [sample(d, ecc_corr_agg=d) for d in range(20)]
    assert judge_trend.judge(trend_input(slow), t(), HOST) == []


def test_healthy_gpu_and_short_histories_say_nothing():
    healthy = [sample(d, ecc_corr_agg=0, ecc_corr_vol=0, retired_sbe=0, retired_dbe=0, remap_uncorr=0,
                      banks_low=0, banks_none=0, temperature_c=40 + (d % 2), power_w=300.0, power_limit_w=700.0,
                      pcie_replays=3) for d in range(30)]
    assert judge_trend.judge(trend_input(healthy), t(), HOST) == []
    # audits minutes apart: no rate per day can be called from them
    close = [{"ts": T0 + i * 60.0, "ecc_corr_agg": i * 1000} for i in range(5)]
    assert judge_trend.judge(trend_input(close), t(), HOST) == []


def test_a_volatile_counter_reset_is_not_a_negative_rate_and_its_new_value_counts():
    incs = judge_trend.increments([sample(0, ecc_corr_vol=500), sample(1, ecc_corr_vol=520),
                                   sample(2, ecc_corr_vol=30)], ("ecc_corr_vol",))
    assert [i[2] for i in incs] == [20, 30]


def test_spares_projected_to_run_out_warn_with_the_days_left():
    pages = [sample(d, retired_sbe=2 * d, retired_dbe=0) for d in range(15)]
    f = check_shape(judge_trend.judge(trend_input(pages), t(), HOST))
    (retired,) = [x for x in f if x["code"] == "RETIRED_PAGES_TREND"]
    assert "limit of 64" in retired["message"] and "~18 days" in retired["message"]
    assert judge_trend.judge(trend_input(pages), t(gpufleet_trend_exhaustion_days=10.0), HOST) == []
    rows = [sample(d, remap_uncorr=30 * d) for d in range(15)]
    assert codes(judge_trend.judge(trend_input(rows), t(), HOST)) == [("REMAPPED_ROWS_TREND", 2)]


def test_banks_reaching_low_or_none_warn():
    rows = [sample(d, banks_low=0 if d < 10 else 2, banks_none=0) for d in range(15)]
    assert codes(judge_trend.judge(trend_input(rows), t(), HOST)) == [("REMAP_BANKS_DECLINING", 2)]


def test_temperature_creep_at_equal_load_only():
    rows = [sample(d, temperature_c=60 if d < 12 else 70, power_w=600.0, power_limit_w=700.0) for d in range(16)]
    (f,) = check_shape(judge_trend.judge(trend_input(rows), t(), HOST))
    assert f["code"] == "TEMPERATURE_CREEP" and "80-100%" in f["message"]
    # hotter only because it works harder (another power band): no creep
    busy = [sample(d, temperature_c=40 if d < 12 else 70, power_w=100.0 if d < 12 else 650.0, power_limit_w=700.0)
            for d in range(16)]
    assert judge_trend.judge(trend_input(busy), t(), HOST) == []
    assert judge_trend.judge(trend_input(rows), t(gpufleet_trend_temp_rise_c=11.0), HOST) == []


def test_pcie_replays_rising():
    rows = [sample(d, pcie_replays=500 * d) for d in range(10)]
    assert codes(judge_trend.judge(trend_input(rows), t(), HOST)) == [("PCIE_REPLAYS_RISING", 2)]
    assert judge_trend.judge(trend_input(rows), t(gpufleet_trend_pcie_replays_per_day=600.0), HOST) == []


def test_an_unreachable_node_without_a_good_audit_is_stale_not_healthy():
    base = {"now_ts": T0 + 10 * DAY, "gpus": []}
    never = judge_trend.judge(dict(base, node={"reachable": False, "last_pass_ts": None}), t(), HOST)
    assert codes(never) == [("HISTORY_STALE", None)] and "since never" in never[0]["message"]
    old = judge_trend.judge(dict(base, node={"reachable": False, "last_pass_ts": T0}), t(), HOST)
    assert codes(old) == [("HISTORY_STALE", None)]
    recent = judge_trend.judge(dict(base, node={"reachable": False, "last_pass_ts": T0 + 9.5 * DAY}), t(), HOST)
    assert recent == []


# What is not a mapping at all is refused at the judges' door; the mappings these judges read are built by the
# history's rules from the store (rules/history.py), and a judge that raises on one is a bug the history step reports.
BAD = [None, [], "x", 5]


@pytest.mark.parametrize("judge", [judge_trend.judge, judge_drift.judge, judge_baseline.judge, judge_snapshot.judge])
@pytest.mark.parametrize("bad", BAD)
def test_what_is_not_a_mapping_is_one_error_finding(judge, bad):
    found = judge(bad, t(), HOST)
    assert [f["code"] for f in found] == ["CHECK_ERROR"] and found[0]["severity"] == "error"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.fixed_dictionaries({"ts": st.floats(T0, T0 + 40 * DAY) | st.none(),
                                       "ecc_corr_agg": st.integers(-5, 10**9) | st.none(),
                                       "retired_sbe": st.integers(0, 100) | st.none(),
                                       "temperature_c": st.floats(-50, 150) | st.none(),
                                       "power_w": st.floats(0, 1000) | st.none(),
                                       "power_limit_w": st.floats(0, 1000) | st.none(),
                                       "pcie_replays": st.integers(0, 10**7) | st.none()}), max_size=30),
       st.lists(st.floats(T0, T0 + 40 * DAY), max_size=30))
def test_any_history_is_judged_without_raising(samples, xids):
    found = judge_trend.judge(trend_input(samples, xids, now_day=40), t(), HOST)
    check_shape(found)
    judge_trend.figures(trend_input(samples, xids, now_day=40), t())


# ---- drift ---------------------------------------------------------------------------------------------------------
def node_versions(driver="570.133.20", bios="2.1", board="X13DEG-OAD", vbios="96.00.99.00.01"):
    return {"driver": driver, "dcgm": "4.2.3", "kernel": "6.1.0-28-amd64", "bios": bios, "board": board,
            "vbios": {str(i): vbios for i in range(8)}, "inforom": {str(i): "G520.0200.00.05" for i in range(8)}}


def drift_input(mine, others):
    peers = [{"host": HOST, "versions": mine}] + [{"host": "peer%d" % i, "versions": v} for i, v in enumerate(others)]
    return {"group": "NVIDIA H100 80GB HBM3", "versions": mine, "peers": peers}


def test_a_driver_behind_its_group_majority_is_drift():
    mine = node_versions(driver="570.86.15")
    (f,) = check_shape(judge_drift.judge(drift_input(mine, [node_versions(), node_versions()]), t(), HOST))
    assert f["code"] == "VERSION_DRIFT" and "570.86.15" in f["message"] and "570.133.20" in f["message"]
    assert "2 of 3 nodes" in f["message"]


def test_no_majority_or_too_small_a_group_says_nothing():
    mine = node_versions(driver="570.86.15")
    assert judge_drift.judge(drift_input(mine, [node_versions()]), t(), HOST) == []
    assert judge_drift.judge(drift_input(mine, [node_versions(), node_versions(driver="580.1")]), t(), HOST) == []
    assert judge_drift.judge(drift_input(mine, [node_versions()] * 2), t(gpufleet_drift_min_nodes=4), HOST) == []


def test_golden_versions_win_over_the_majority():
    mine = node_versions()
    found = judge_drift.judge(drift_input(mine, [node_versions()] * 3), t(gpufleet_golden_versions={
        "driver": "580.65.06"}), HOST)
    assert codes(found) == [("VERSION_NOT_GOLDEN", None)] and "golden 580.65.06" in found[0]["message"]


def test_bios_is_compared_between_boards_of_one_model_only():
    mine = node_versions(bios="10.11", board="PRO WS W790E")
    assert judge_drift.judge(drift_input(mine, [node_versions(), node_versions()]), t(), HOST) == []
    same_board = [node_versions(bios="1003", board="PRO WS W790E")] * 2
    assert codes(judge_drift.judge(drift_input(mine, same_board), t(), HOST)) == [("VERSION_DRIFT", None)]


def test_one_gpu_on_another_vbios_names_that_gpu():
    mine = node_versions()
    mine["vbios"]["5"] = "96.00.74.00.0B"
    found = judge_drift.judge(drift_input(mine, []), t(), HOST)  # a lone node: its own GPUs' majority
    assert codes(found) == [("VERSION_DRIFT", 5)] and "own GPUs" in found[0]["message"]


# ---- baseline ------------------------------------------------------------------------------------------------------
def item(value, base, metric="burn_gflops", gpu=3, samples=None, last=None):
    return {"metric": metric, "detail": "", "unit": "Gflop/s", "gpu": gpu, "pci": "0000:5d:00" if gpu is not None
            else None, "value": value, "baseline": {"value": base, "run_id": "burnin-1", "ts": T0,
                                                    "samples": samples or [], "last": last}}


def test_twenty_percent_below_warns_when_it_repeats_fifteen_does_not():
    # One run is no spread: a first low reading is noted (low), not flagged; the same again in the next run warns.
    assert judge_baseline.assess(item(40960.0, 51200.0), t())["low"]
    assert judge_baseline.judge({"figures": [item(40960.0, 51200.0)]}, t(), HOST) == []
    (f,) = check_shape(judge_baseline.judge({"figures": [item(40960.0, 51200.0, last="low")]}, t(), HOST))
    assert f["code"] == "BELOW_BASELINE" and f["gpu"] == 3 and "20% below" in f["message"]
    assert "burnin-1" in f["message"] and "cooling" in f["action"] and "previous run too" in f["message"]
    assert judge_baseline.judge({"figures": [item(44000.0, 51200.0, last="low")]}, t(), HOST) == []
    assert judge_baseline.judge({"figures": [item(40960.0, 51200.0, last="low")]},
                                t(gpufleet_baseline_max_drop=0.25), HOST) == []


def test_the_reference_is_the_median_of_the_first_runs_and_their_spread_decides():
    steady = [51000.0, 51200.0, 50900.0, 51100.0, 51300.0]
    ref = judge_baseline.reference({"value": 51000.0, "samples": steady + [51050.0] * 5 + [10.0] * 20})
    assert ref["value"] == 51050.0 and ref["runs"] == judge_baseline.BASELINE_RUNS  # the first ten runs only
    (f,) = judge_baseline.judge({"figures": [item(40960.0, 51000.0, samples=steady)]}, t(), HOST)
    assert "beyond 3 times its spread" in f["message"] and "median of 5 good burn-in(s)" in f["message"]
    # A noisy figure (a shared disk: 95 to 453 MB/s) needs a repeat even far below its median.
    noisy = [453.0, 300.0, 120.0, 410.0, 95.0]
    a = judge_baseline.assess(item(70.0, 453.0, "storage_write_mb_per_s", None, noisy), t())
    assert a["low"] and not a["beyond_spread"] and not a["flag"] and a["reference"]["value"] == 300.0
    # Two runs: no spread yet.
    assert judge_baseline.reference({"value": 1.0, "samples": [2.0, 4.0]}) == {"value": 3.0, "spread": None, "runs": 2}


def test_node_figures_and_missing_baselines():
    busbw = item(250.0, 368.0, "nccl_busbw_gbps", gpu=None, last="low")
    (f,) = judge_baseline.judge({"figures": [busbw, dict(item(1.0, 1.0), baseline=None)]}, t(), HOST)
    assert f["gpu"] is None and "bus bandwidth" in f["message"]


# ---- snapshot ------------------------------------------------------------------------------------------------------
def test_snapshot_parts_budget_and_banks():
    result = {"budget_s": 30, "parts": {"gpus": {"ok": True, "duration_s": 2.0, "error": None},
                                        "xid": {"ok": False, "duration_s": 0.1, "error": "journalctl exited 1"},
                                        "env": {"ok": False, "duration_s": 0.0, "error": None, "skipped": "budget"}},
              "gpus": [{"index": 2, "pci": PCI, "remap_banks": {"max": 600, "high": 30, "partial": 7, "low": 2,
                                                                "none": 1}}]}
    found = check_shape(judge_snapshot.judge(result, t(), HOST))
    assert sorted(codes(found)) == [("REMAP_BANKS_LOW", 2), ("SNAPSHOT_BUDGET", None), ("SNAPSHOT_PART_ERROR", None)]
    assert any("journalctl exited 1" in f["message"] for f in found)
    healthy = {"budget_s": 30, "parts": {"gpus": {"ok": True, "error": None}},
               "gpus": [{"index": 0, "pci": PCI, "remap_banks": {"max": 640, "low": 0, "none": 0}}]}
    assert judge_snapshot.judge(healthy, t(), HOST) == []
