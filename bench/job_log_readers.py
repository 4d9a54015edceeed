#!/usr/bin/env python3
"""Benchmark: what reading a job's log for every format of a hang costs on a node, against the watchdog lines alone.

job_evidence parses each log once with job_sources.parse_job_lines: torch_watchdog plus the readers of torch's desync
report, NCCL's RAS status and torch's flight-recorder analyzer output. This times both on one generated log (loss
prints, tqdm frames, NCCL INFO lines, a few watchdog lines and one desync report, in the shapes of
tests/fixtures/postmortem_reports), in one run, CPU seconds (process_time), best of --repeat:

    .venv/bin/python bench/job_log_readers.py [--lines 300000] [--repeat 3]

Last line: `job_log_readers watchdog_s=<s> all_readers_s=<s> ratio=<all/watchdog> mb=<log size>`.
"""

import argparse
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.kentino.gpufleet.plugins.module_utils.job_sources import parse_job_lines  # noqa: E402
from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_watchdog import parse_torch_lines  # noqa: E402

REPORT = (REPO / "tests" / "fixtures" / "postmortem_reports" / "desync_lagging_rank7.log").read_text().splitlines()


def log(n, seed=1):
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        k = rng.random()
        if k < 0.5:
            lines.append("[default%d]:{'loss': %.4f, 'grad_norm': 0.48, 'learning_rate': 2e-05, 'epoch': %.2f}"
                         % (i % 8, rng.random(), i / 1e5))
        elif k < 0.8:
            lines.append(" %d%%|####      | %d/100000 [01:23<04:56, 3.21it/s]" % (i % 100, i))
        else:
            lines.append("node01:1234:5678 [%d] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read" % (i % 8))
    return lines + REPORT


def best(fn, lines, repeat):
    times = []
    for _ in range(repeat):
        started = time.process_time()
        fn(iter(lines))
        times.append(time.process_time() - started)
    return min(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=300000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    lines = log(args.lines)
    mb = sum(len(x) + 1 for x in lines) / 1e6
    assert parse_job_lines(iter(lines))["desync_reports"]["reports"][0]["lagging"][0]["ranks"] == [7]
    watchdog = best(parse_torch_lines, lines, args.repeat)
    everything = best(parse_job_lines, lines, args.repeat)
    print("log: %d lines, %.1f MB" % (len(lines), mb))
    print("torch_watchdog alone: %.3f s CPU (%.0f MB/s)" % (watchdog, mb / watchdog))
    print("every reader (parse_job_lines): %.3f s CPU (%.0f MB/s)" % (everything, mb / everything))
    print("job_log_readers watchdog_s=%.3f all_readers_s=%.3f ratio=%.2f mb=%.1f" % (
        watchdog, everything, everything / watchdog, mb))
    return 0


if __name__ == "__main__":
    sys.exit(main())
