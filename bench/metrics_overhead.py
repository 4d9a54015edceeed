#!/usr/bin/env python3
"""What gpufleet_metrics costs a training step.

The helper's step() runs once per step; at most once per min_interval_s (1 s by default) it samples memory and
replaces its textfile (render, write, fsync, rename). Measured here in one run, in this process, on a real directory
(--dir, default under /var/tmp: a disk, like node_exporter's textfile directory):

- step() on a step clock of --step-ms (a monotonic clock the bench advances, so the helper throttles exactly as it
  would at that step time) over --steps steps: mean and p99 wall time per call, and the mean cost of a call that wrote;
- the same with compute() around each step;
- as a share of a --step-ms step.

Last line: `metrics_overhead us_per_step=<x> pct_of_step=<y> write_us=<z> step_ms=<m>`. Goal: under 1% of a 100 ms
step.

Usage: bench/metrics_overhead.py [--steps 20000] [--step-ms 100] [--dir /var/tmp/...]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.kentino.gpufleet.plugins.module_utils.gpufleet_metrics import TrainingMetrics  # noqa: E402


class StepClock:
    def __init__(self, step_s):
        self.t = 1000.0
        self.step_s = step_s

    def __call__(self):
        return self.t


def measure(directory, steps, step_s, with_compute):
    clock = StepClock(step_s)
    m = TrainingMetrics(str(directory), job="bench", rank=0, local_rank=0, world_size=8, monotonic=clock)
    durations, writes = [], []
    for step in range(1, steps + 1):
        clock.t += step_s
        before = m.writes
        started = time.perf_counter()
        if with_compute:
            with m.compute():
                pass
        m.step(step, 2.0 / step)
        spent = time.perf_counter() - started
        durations.append(spent)
        if m.writes != before:
            writes.append(spent)
    if m.write_errors:
        raise SystemExit("the helper could not write: %s" % m.last_error)
    durations.sort()
    return {"mean_us": 1e6 * statistics.mean(durations), "p99_us": 1e6 * durations[int(0.99 * len(durations))],
            "write_us": 1e6 * statistics.mean(writes), "writes": len(writes)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--step-ms", type=float, default=100.0)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-metrics.", dir=args.dir or "/var/tmp") as tmp:
        plain = measure(Path(tmp), args.steps, args.step_ms / 1000.0, False)
        timed = measure(Path(tmp), args.steps, args.step_ms / 1000.0, True)
    for name, r in (("step()", plain), ("compute() + step()", timed)):
        print("%-20s mean %7.1f us  p99 %7.1f us  %d writes of %.1f us each (one per %.0f steps)" % (
            name, r["mean_us"], r["p99_us"], r["writes"], r["write_us"], args.steps / max(r["writes"], 1)))
    pct = 100.0 * timed["mean_us"] / (args.step_ms * 1000.0)
    print("goal: under 1%% of a %.0f ms step: %s (%.4f%%)" % (args.step_ms, "met" if pct < 1.0 else "NOT MET", pct))
    print("metrics_overhead us_per_step=%.1f pct_of_step=%.4f write_us=%.1f step_ms=%.0f" % (
        timed["mean_us"], pct, timed["write_us"], args.step_ms))
    return 0 if pct < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
