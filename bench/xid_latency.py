#!/usr/bin/env python3
"""How fast an XID line in a followed kernel log reaches the watcher's textfile, and what following costs.

One run: the XID watcher (its entry script, file source, default read and write intervals) follows a log file while
this script appends syslog-style lines: a steady phase (2,000 lines/s with an XID line every 0.5 s) and a burst (10,000
noise lines at once, then an XID line). Every XID line names a new PCI address, so the moment the textfile holds its
series is the moment the watcher counted it. Printed: p50/p99 of write -> textfile delay, the watcher's CPU seconds per
1,000 lines (after its start), its share of one core and peak RSS, and grep's CPU seconds per 1,000 lines over the same
file. Beside the watcher, `tail -F | grep --line-buffered NVRM` follows the same file through the same run: what
following costs when C tools do it (a wake-up and a read per write to the log), against which one grep pass over the
finished file is a floor no follower reaches. A second pair, `tail ---disable-inotify -s 1 -F | grep`, follows on the
watcher's schedule (a look at the file every second instead of a wake-up per write): the cost of C tools on that
schedule.
Beside them a minimal Python follower does the least any Python follower on the watcher's schedule must do: sleep a
second, read what is new into one buffer, search it for NVRM, take each hit's PCI address with a regex, and replace a
small textfile (temp file and rename) at most every 2 s while events come. Its cost is the floor of the interpreter
and the schedule, without the watcher's parsing, state and metrics; watcher/floor says what the watcher adds.
Last line: `xid_latency p50_s=<x> p99_s=<y> cpu_s_per_1k=<z>`. Goal: p99 under 5 s, CPU within 3x of grep.

Usage: bench/xid_latency.py [--steady-seconds 10] [--rate 2000] [--burst 10000]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WATCHER = REPO / "roles" / "gpu_monitoring" / "files" / "gpufleet-xid-watcher"


# The floor (see the docstring): argv[1] the part of the work done (bench/follow_floor.py takes the floor apart; this
# bench runs "write", all of it), argv[2] the log, argv[3] the textfile; the watcher's read and event write intervals.
FLOOR_FOLLOWER = r"""
import os, re, select, sys, time
part, log, out = sys.argv[1], sys.argv[2], sys.argv[3]
buf = bytearray(1 << 20)
view = memoryview(buf)
xid = re.compile(rb"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)")
seen, dirty, last_write = set(), False, 0.0
fh = open(log, "rb", buffering=0)
fh.seek(0, 2)
while True:
    if part != "wake":
        n = fh.readinto(view)
        while n:
            if part != "read":
                i = buf.find(b"NVRM", 0, n)
                while i >= 0:
                    m = xid.match(buf, i, n)
                    if m and m.group(1) not in seen:
                        seen.add(m.group(1))
                        dirty = True
                    i = buf.find(b"NVRM", i + 4, n)
            n = fh.readinto(view) if n == len(buf) else 0
    now = time.monotonic()
    if part in ("write", "tmpfs") and dirty and now - last_write >= 2.0:
        with open(out + ".tmp", "w") as tf:
            tf.write("".join('xid_events_total{pci="%s"} 1\n' % p.decode() for p in sorted(seen)))
        os.rename(out + ".tmp", out)
        dirty, last_write = False, now
    select.select([], [], [], 1.0)
"""


def cpu_seconds(pid):
    """CPU time of every thread of pid, in ns resolution (/proc/<pid>/task/*/schedstat; /proc/<pid>/stat counts in
    10 ms ticks, too coarse for a few milliseconds of work)."""
    total = 0
    for task in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/schedstat" % (pid, task)) as fh:
            total += int(fh.read().split()[0])
    return total / 1e9


def c_follower(log, *tail_options):
    """`tail <tail_options> -n 0 -F log | grep --line-buffered -F NVRM`: (tail, grep) processes."""
    tail = subprocess.Popen(["tail", *tail_options, "-n", "0", "-F", str(log)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    grep = subprocess.Popen(["grep", "--line-buffered", "-F", "NVRM"], stdin=tail.stdout, stdout=subprocess.DEVNULL)
    tail.stdout.close()
    return tail, grep


def pids_cpu(procs):
    return sum(cpu_seconds(p.pid) for p in procs)


def peak_rss_mib(pid):
    with open("/proc/%d/status" % pid) as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def stamp():
    return time.strftime("%b %e %H:%M:%S")


def noise(i):
    return "%s gpu-node-01 kernel: [%12.6f] igb 0000:c5:00.0 eno1: Reset adapter, queue %d stalled for %d ms\n" % (
        stamp(), 1000 + i / 1000.0, i % 64, i % 997)


def marker(bus):
    return "%s gpu-node-01 kernel: [%12.6f] NVRM: Xid (PCI:0000:%02x:00): 31, pid=4242, name=python3, Ch 00000010, " \
           "intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_1c000000\n" % (stamp(), 2000.0, bus)


class Seen(threading.Thread):
    """Polls the textfile every 5 ms and notes when each marker's PCI address first appears."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = path
        self.first = {}
        self.stop = False

    def run(self):
        while not self.stop:
            try:
                text = self.path.read_text()
            except OSError:
                text = ""
            now = time.monotonic()
            for line in text.splitlines():
                if line.startswith("gpufleet_xid_events_total{"):
                    pci = line.split('pci="', 1)[1].split('"', 1)[0]
                    self.first.setdefault(pci, now)
            time.sleep(0.005)


def percentile(values, q):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steady-seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=2000, help="lines per second in the steady phase")
    parser.add_argument("--burst", type=int, default=10000, help="noise lines in the burst")
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    log = root / "kern.log"
    log.write_text(noise(0))
    (root / "m").mkdir()
    config = root / "monitoring.json"
    config.write_text(json.dumps({"source": "file", "log_file": str(log), "metrics_directory": str(root / "m"),
                                  "state_directory": str(root / "s"), "nvidia_smi": ""}))
    prom = root / "m" / "gpufleet_xid.prom"
    proc = subprocess.Popen([sys.executable, str(WATCHER), "--config", str(config)], stderr=subprocess.DEVNULL,
                            env=dict(os.environ, GPUFLEET_LIB=str(REPO / "collections")))
    # The same following done by C tools over the same lines at the same moments: tail -F (inotify) piped into grep,
    # and tail looking once a second (the watcher's schedule).
    follow = c_follower(log)
    poll = c_follower(log, "---disable-inotify", "-s", "1")
    floor = subprocess.Popen([sys.executable, "-c", FLOOR_FOLLOWER, "write", str(log), str(root / "floor.prom")])
    try:
        deadline = time.monotonic() + 30
        while not prom.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not prom.exists():
            raise SystemExit("the watcher wrote no textfile within 30 s")
        seen = Seen(prom)
        seen.start()
        cpu0 = cpu_seconds(proc.pid)
        wall0 = time.monotonic()
        follow0, poll0 = pids_cpu(follow), pids_cpu(poll)
        floor0 = cpu_seconds(floor.pid)
        written = {}  # pci -> monotonic time of its write
        bus = 1
        lines = 0
        with open(log, "a", buffering=1024 * 1024) as fh:
            batch = max(1, args.rate // 20)  # 20 writes a second
            start = time.monotonic()
            next_marker = start + 0.5
            while time.monotonic() - start < args.steady_seconds:
                fh.write("".join(noise(lines + i) for i in range(batch)))
                lines += batch
                if time.monotonic() >= next_marker:
                    fh.write(marker(bus))
                    fh.flush()
                    written["0000:%02x:00" % bus] = time.monotonic()
                    bus += 1
                    lines += 1
                    next_marker += 0.5
                fh.flush()
                time.sleep(0.05)
            time.sleep(1.0)
            burst_text = "".join(noise(lines + i) for i in range(args.burst)) + marker(bus)
            cpu_burst0 = cpu_seconds(proc.pid)
            fh.write(burst_text)
            fh.flush()
            written["0000:%02x:00" % bus] = time.monotonic()
            burst_pci = "0000:%02x:00" % bus
            lines += args.burst + 1
        while burst_pci not in seen.first and time.monotonic() - written[burst_pci] < 15:
            time.sleep(0.01)
        cpu_burst = cpu_seconds(proc.pid) - cpu_burst0  # one read of the burst, its scan, one event write
        deadline = time.monotonic() + 15
        while set(written) - set(seen.first) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        cpu = cpu_seconds(proc.pid) - cpu0
        wall = time.monotonic() - wall0
        follow_cpu, poll_cpu = pids_cpu(follow) - follow0, pids_cpu(poll) - poll0
        floor_cpu = cpu_seconds(floor.pid) - floor0
        rss = peak_rss_mib(proc.pid)
        seen.stop = True
    finally:
        for p in (proc, *follow, *poll, floor):
            p.terminate()
            p.wait(30)
    missing = sorted(set(written) - set(seen.first))
    delays = [seen.first[p] - t for p, t in written.items() if p in seen.first]
    total_lines = lines + 1

    def grep_cpu(path, runs=20):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(runs):
            subprocess.run(["grep", "-F", "NVRM", str(path)], stdout=subprocess.DEVNULL, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) / runs

    runs = 20
    grep_all = grep_cpu(log, runs)
    burst_file = root / "burst.log"
    burst_file.write_text(burst_text)
    grep_burst = grep_cpu(burst_file, runs)

    per_1k = cpu / total_lines * 1000
    grep_per_1k = grep_all / total_lines * 1000
    burst_lines = args.burst + 1
    burst_per_1k = cpu_burst / burst_lines * 1000
    grep_burst_per_1k = grep_burst / burst_lines * 1000

    def ratio(a, b):
        return a / b if b else float("inf")

    print("lines followed          %d (%d steady at %d/s over %.0f s, %d in one burst), %d XID lines"
          % (total_lines, total_lines - burst_lines, args.rate, args.steady_seconds, args.burst, len(written)))
    print("XID -> textfile delay   p50 %.3f s  p99 %.3f s  max %.3f s  burst line %.3f s  (missing: %s)"
          % (percentile(delays, 0.5), percentile(delays, 0.99), max(delays) if delays else float("nan"),
             seen.first.get(burst_pci, float("nan")) - written[burst_pci], missing or "none"))
    print("watcher CPU, whole run  %.4f s = %.5f s per 1,000 lines (waits, reads, scans, textfile writes for %d "
          "events, state saves); peak RSS %.1f MiB" % (cpu, per_1k, len(written), rss))
    print("watcher CPU share       %.3f%% of one core over the %.1f s it followed %d lines/s (what the node pays)"
          % (100.0 * cpu / wall, wall, args.rate))
    print("watcher CPU, the burst  %.4f s = %.5f s per 1,000 lines (its reads and scans, one event write)"
          % (cpu_burst, burst_per_1k))
    print("grep -F NVRM CPU        %.5f s per 1,000 lines over the whole file, %.5f over the burst (process start "
          "included; mean of %d passes)" % (grep_per_1k, grep_burst_per_1k, runs))
    print("ratio watcher/grep      whole run %.1fx, burst %.1fx (goal: within 3x); p99 goal: under 5 s"
          % (ratio(per_1k, grep_per_1k), ratio(burst_per_1k, grep_burst_per_1k)))
    print("tail -F | grep CPU      %.5f s per 1,000 lines over the whole run (%.1fx grep: the same following in C, "
          "woken by each write); watcher/that %.1fx" % (follow_cpu / total_lines * 1000, ratio(follow_cpu, grep_all),
                                                       ratio(cpu, follow_cpu)))
    print("tail -s 1 | grep CPU    %.5f s per 1,000 lines over the whole run (%.1fx grep: C tools on the watcher's "
          "1 s schedule); watcher/that %.1fx" % (poll_cpu / total_lines * 1000, ratio(poll_cpu, grep_all),
                                                ratio(cpu, poll_cpu)))
    print("minimal Python follower %.5f s per 1,000 lines over the whole run (%.1fx grep: the floor of a Python "
          "follower on this schedule); watcher/that %.1fx" % (floor_cpu / total_lines * 1000,
                                                              ratio(floor_cpu, grep_all), ratio(cpu, floor_cpu)))
    print("xid_latency p50_s=%.3f p99_s=%.3f cpu_s_per_1k=%.5f" % (percentile(delays, 0.5), percentile(delays, 0.99),
                                                                   per_1k))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
