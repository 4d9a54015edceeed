#!/usr/bin/env python3
"""Where a Python follower's CPU goes, against one grep pass: the parts of bench/xid_latency.py's floor, measured apart.

Five copies of that floor (xid_latency.FLOOR_FOLLOWER, a look at the file once a second) follow the same log through
the same run as bench/xid_latency.py writes it (2,000 lines/s with an XID line every 0.5 s for 10 s, then a 10,000-line
burst and an XID line), each doing one more part of the work than the one before:
  wake     wakes once a second and does nothing else
  read     + reads what is new (one buffer, as the watcher does)
  scan     + searches it for NVRM and takes each new XID's PCI address with a regex
  write    + replaces a small textfile (temp file and rename) at most every 2 s while events come, in the log's
             directory (a disk file system here)
  tmpfs    the same, with the textfile on /dev/shm (tmpfs)
Printed: each one's CPU over the run in ms and in x one `grep -F NVRM` over the finished file (process start included,
mean of 20 passes). The step from one line to the next is what that part costs. Last line:
`follow_floor wake=<x> read=<x> scan=<x> write=<x> tmpfs=<x>` (x grep).

Usage: bench/follow_floor.py
"""

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import xid_latency  # noqa: E402

PARTS = ("wake", "read", "scan", "write", "tmpfs")


def main():
    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    shm = Path(tempfile.mkdtemp(prefix="gpufleet-bench-", dir="/dev/shm"))
    log = root / "kern.log"
    log.write_text(xid_latency.noise(0))
    procs = [subprocess.Popen([sys.executable, "-c", xid_latency.FLOOR_FOLLOWER, part, str(log),
                               str((shm if part == "tmpfs" else root) / (part + ".prom"))]) for part in PARTS]
    try:
        time.sleep(1.5)  # started and waiting: their start is not counted
        before = [xid_latency.cpu_seconds(p.pid) for p in procs]
        lines, bus = 0, 1
        with open(log, "a", buffering=1 << 20) as fh:
            start = time.monotonic()
            next_marker = start + 0.5
            while time.monotonic() - start < 10.0:
                fh.write("".join(xid_latency.noise(lines + i) for i in range(100)))
                lines += 100
                if time.monotonic() >= next_marker:
                    fh.write(xid_latency.marker(bus))
                    bus += 1
                    next_marker += 0.5
                fh.flush()
                time.sleep(0.05)
            time.sleep(1.0)
            fh.write("".join(xid_latency.noise(lines + i) for i in range(10000)) + xid_latency.marker(bus))
            fh.flush()
        time.sleep(2.5)  # each has read the burst and written its last event
        cpu = [xid_latency.cpu_seconds(p.pid) - b for p, b in zip(procs, before, strict=True)]
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
    runs = 20
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(runs):
        subprocess.run(["grep", "-F", "NVRM", str(log)], stdout=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    grep = ((after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)) / runs
    print("log                     %.1f MiB, %d XID lines; grep -F NVRM over it: %.2f ms"
          % (os.path.getsize(log) / 1048576.0, bus, grep * 1e3))
    for part, value in zip(PARTS, cpu, strict=True):
        print("%-8s                %6.2f ms  %4.1fx grep" % (part, value * 1e3, value / grep))
    print("follow_floor " + " ".join("%s=%.1f" % (part, value / grep) for part, value in zip(PARTS, cpu, strict=True)))
    for path in (root, shm):
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
