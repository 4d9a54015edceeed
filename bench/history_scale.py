#!/usr/bin/env python3
"""The history store at a year's scale: nightly audits of 1,000 nodes x 8 GPUs for 365 days written through the
store's own record() (one transaction per night, as the fleet report writes it), then the queries the product runs:
one GPU's trend (`gpufleet history NODE --gpu N`: the GPU by index, its readings of the year and its XID 92 events),
what the report's trend rules read for one node (8 GPUs over the trend window), the fleet summary, and a CSV export
of one node. Counters grow like a fleet's: most GPUs flat, some leaking; a few XID 92 events.

    .venv/bin/python bench/history_scale.py [--nodes 1000] [--gpus 8] [--days 365]

Prints insert and query times and the file size; last line
`history_scale gpu_trend_ms=<median> insert_s=<total> size_mb=<size> open_ms=<median>` (goal: gpu_trend_ms < 50;
open_ms is the integrity check every open makes).
"""

import argparse
import io
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import FILE_NAME, History  # noqa: E402

DAY = 86400.0
GOAL_MS = 50.0


def night(day, nodes, gpus, start, rng, leaking):
    ts = start + day * DAY
    out = []
    for n in range(nodes):
        host = "gpu-node-%04d" % n
        rows, xids = [], []
        for g in range(gpus):
            leak = (n, g) in leaking
            # A leak ramps for four weeks and the card is replaced (its counter capped here) - not exp(day) forever.
            corr = int(40 * 0.143 / 0.2 * (pow(2.718, 0.2 * min(day, 28)) - 1)) if leak else (day // 90)
            rows.append({"pci": "0000:%02x:00" % (0x18 + g * 0x10), "idx": g, "uuid": "GPU-%04d-%d" % (n, g),
                         "serial": "16540%05d%d" % (n, g), "name": "NVIDIA H100 80GB HBM3", "verdict": "pass", "ts": ts,
                         "temperature_c": 40 + rng.random() * 25, "power_w": 100 + rng.random() * 500,
                         "power_limit_w": 700.0, "util_pct": rng.choice((0, 100)), "ecc_corr_vol": corr,
                         "ecc_uncorr_vol": 0, "ecc_corr_agg": corr, "ecc_uncorr_agg": 0, "remap_corr": corr // 300,
                         "remap_uncorr": 0, "remap_pending": 0, "remap_failure": 0, "banks_max": 2560, "banks_high": 0,
                         "banks_partial": 0, "banks_low": 0, "banks_none": 0, "pcie_replays": rng.randrange(3),
                         "pcie_gen": 5, "pcie_width": 16, "pcie_gen_max": 5, "pcie_width_max": 16, "vbios":
                         "96.00.99.00.01", "inforom": "G520.0200.00.05"})
            if leak and rng.random() < min(1.0, 0.143 * pow(2.718, 0.1 * min(day, 28)) / 4):
                xids.append({"pci": rows[-1]["pci"], "xid": 92, "ts": ts - 3600, "severity": "critical",
                             "digest": "%s-%d-%d" % (host, g, day)})
        out.append({"host": host, "ts": ts, "verdict": "pass", "reachable": 1, "stage": "done", "grp": "h100",
                    "driver": "570.133.20", "dcgm": "4.2.3", "kernel": "6.1.0-28-amd64", "bios": "2.1",
                    "board_serial": "B%06d" % n, "product": "SYS-821GE-TNHR", "gpu_count": gpus, "codes": None,
                    "figures": None, "versions": {"driver": "570.133.20", "dcgm": "4.2.3"}, "gpus": rows, "xids": xids,
                    "baselines": [], "doc": None})
    return {"run_id": "audit-%03d" % day, "playbook": "audit", "started": None, "finished": None, "ts": ts,
            "verdict": "pass"}, out


def timed(fn, repeat):
    times = []
    result = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times), max(times), result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--dir", help="where to write the history (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="gpufleet-history-scale."))
    path = work / FILE_NAME
    rng = random.Random(7)
    leaking = set((rng.randrange(args.nodes), rng.randrange(args.gpus)) for _ in range(max(1, args.nodes // 100)))
    start = time.time() - args.days * DAY
    print("history_scale: %d nodes x %d GPUs, %d nightly audits -> %s" % (args.nodes, args.gpus, args.days, path))
    nights = []
    written = 0
    begin = time.perf_counter()
    with History(path) as history:
        for day in range(args.days):
            run, nodes = night(day, args.nodes, args.gpus, start, rng, leaking)
            t0 = time.perf_counter()
            written += history.record(run, nodes)
            nights.append(time.perf_counter() - t0)
            if day % 73 == 72:
                print("  night %3d written (%.2f s for %d GPU rows)" % (day + 1, nights[-1], args.nodes * args.gpus))
    insert_s = time.perf_counter() - begin
    size_mb = (os.path.getsize(path) + (os.path.getsize(str(path) + "-wal") if os.path.exists(str(path) + "-wal")
                                        else 0)) / 1e6
    print("insert: %d GPU rows in %.1f s (%.0f rows/s); one night %.2f s median, %.2f s max" % (
        written, insert_s, written / insert_s, statistics.median(nights), max(nights)))
    host, gpu_index = "gpu-node-%04d" % sorted(leaking)[0][0], sorted(leaking)[0][1]
    # Every open reads the whole file once (PRAGMA quick_check): a damaged history is refused before it is used.
    open_ms, open_max, _ = timed(lambda: History(path, readonly=True).close(), 3)
    with History(path, readonly=True) as history:
        def gpu_trend():
            (gpu,) = history.gpus_of(host, index=gpu_index)
            return history.gpu_series(gpu["id"]), history.xid_events(gpu["id"], [92])

        trend_ms, trend_max, (rows, xids) = timed(gpu_trend, 25)
        now = start + (args.days - 1) * DAY

        def node_window():
            out = []
            for g in history.gpus_of(host):
                out.append(history.gpu_series(g["id"], since=now - 18 * DAY))
                out.append(history.xid_events(g["id"], [92], now - 18 * DAY))
            return out

        window_ms, window_max, _ = timed(node_window, 25)
        summary_ms, summary_max, summary = timed(history.fleet_summary, 5)
        export_ms, _x, _ = timed(lambda: history.export("csv", io.StringIO(), host=host), 3)
    print("query: one GPU's trend (%d readings, %d XID 92): %.1f ms median, %.1f ms max" % (
        len(rows), len(xids), trend_ms, trend_max))
    print("query: one node's trend window for the report (8 GPUs, 18 days): %.1f ms median, %.1f ms max" % (
        window_ms, window_max))
    print("query: fleet summary (%d nodes): %.0f ms median, %.0f ms max" % (len(summary), summary_ms, summary_max))
    print("export: one node's year as CSV: %.0f ms" % export_ms)
    print("open: quick_check of the whole file: %.0f ms median, %.0f ms max (%.0f MB/s)" % (
        open_ms, open_max, size_mb / (open_ms / 1000.0)))
    print("file: %.1f MB (%.0f bytes per GPU reading)" % (size_mb, size_mb * 1e6 / written))
    print("goal: one GPU's trend < %.0f ms (%s)" % (GOAL_MS, "met" if trend_ms < GOAL_MS else "NOT met"))
    if not args.dir:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    print("history_scale gpu_trend_ms=%.1f insert_s=%.1f size_mb=%.1f open_ms=%.0f" % (trend_ms, insert_s, size_mb,
                                                                                   open_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
