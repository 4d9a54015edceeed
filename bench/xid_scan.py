#!/usr/bin/env python3
"""Benchmark: the XID parser against `grep -c 'NVRM: Xid'` on a synthetic kernel log, plain and gzipped.

Generates bench/output/kern-<N>mb.log (a realistic syslog mix, about 1 line in 1,000 an Xid; reused when present) and
its .gz, then times, on the same files:
    grep -c 'NVRM: Xid' FILE          zcat FILE.gz | grep -c 'NVRM: Xid'
    the parser (XidScanner.scan_binary), each in a child process that reports its peak RSS (resource.getrusage)
The parser must find exactly the lines grep counts. A second, smaller file shows that memory does not grow with the
file size. Goal: parser/grep <= 3 on the plain file. The last line is machine-readable:
    xid_scan ratio=<parser/grep, plain> peak_rss_mb=<parser peak RSS on the big file>
Usage: bench/xid_scan.py [--size-mb 256] [--small-mb 16] [--repeat 3] [--out-dir bench/output]
"""

import argparse
import gzip
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT_DEFAULT = REPO / "bench" / "output"
PATTERN = "NVRM: Xid"

_NOISE = [
    "{host} kernel: [{up:>12.6f}] EXT4-fs (nvme0n1p2): re-mounted. Opts: errors=remount-ro",
    "{host} kernel: [{up:>12.6f}] audit: type=1400 audit({ts}.{ms:03d}:{n}): apparmor=\"DENIED\" operation=\"open\" "
    "profile=\"snap.lxd\" name=\"/proc/{n}/mounts\" pid={pid} comm=\"python3\" requested_mask=\"r\"",
    "{host} kernel: [{up:>12.6f}] IPv4: martian source 10.0.{a}.{b} from 10.0.{b}.{a}, on dev enp65s0f1",
    "{host} kernel: [{up:>12.6f}] mlx5_core 0000:41:00.0 enp65s0f0np0: Link up",
    "{host} kernel: [{up:>12.6f}] pcieport 0000:00:01.1: AER: Corrected error message received from 0000:01:00.0",
    "{host} kernel: [{up:>12.6f}] nvidia 0000:01:00.0: PCIe Bus Error: severity=Correctable, type=Physical Layer, "
    "(Receiver ID)",
    "{host} systemd[1]: Started session-{n}.scope - Session {n} of User train.",
    "{host} CRON[{pid}]: (root) CMD (command -v debian-sa1 > /dev/null && debian-sa1 1 1)",
    "{host} kernel: [{up:>12.6f}] nvidia-nvlink: Nvlink Core is being initialized, major device number 511",
    "{host} kernel: [{up:>12.6f}] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,"
    "task=python3,pid={pid},uid=1000",
    "{host} sshd[{pid}]: Accepted publickey for train from 10.0.{a}.{b} port {n} ssh2: ED25519 SHA256:q0aZ{n}",
]
_XIDS = [
    "{host} kernel: [{up:>12.6f}] NVRM: Xid (PCI:0000:{bus}:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.",
    "{host} kernel: [{up:>12.6f}] NVRM: Xid (PCI:0000:{bus}:00): 13, pid={pid}, name=python3, Graphics SM Warp "
    "Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    "{host} kernel: [{up:>12.6f}] NVRM: Xid (PCI:0000:{bus}:00): 31, pid={pid}, name=python3, Ch 0000000c, intr 10000000. "
    "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    "{host} kernel: [{up:>12.6f}] NVRM: Xid (PCI:0000:{bus}:00): 92, pid={pid}, name=python3, High single-bit ECC error "
    "rate detected.",
    "{host} kernel: [{up:>12.6f}] NVRM: Xid (PCI:0000:{bus}:00): 63, pid={pid}, Row Remapper: New row (0x00000000004f4c48) "
    "marked for remapping, reset gpu to activate.",
]
# After an Xid the driver often adds NVRM lines that are not events (GPU identity, XID 119's RPC history).
_FOLLOW_ONS = [
    "{host} kernel: [{up:>12.6f}] NVRM: GPU at PCI:0000:{bus}:00: GPU-5a1c7e2b-3f4d-4e21-9c0a-{n:012d}",
    "{host} kernel: [{up:>12.6f}] NVRM: GPU Board Serial Number: 1652{n:09d}",
    "{host} kernel: [{up:>12.6f}] NVRM: GPU0 RPC history (CPU -> GSP):",
]
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def generate(path, size_mb, seed=1):
    """Write a synthetic syslog kern.log of about size_mb MiB; returns the number of Xid lines written."""
    rng = random.Random(seed)
    target = size_mb * 1024 * 1024
    written = 0
    xids = 0
    up = 10.0
    ts = 1733000000
    buses = ["%02x" % b for b in (0x1B, 0x3B, 0x5E, 0x86, 0xAF, 0xB3, 0xD8, 0xDB)]
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        batch = ["Dec  1 00:00:05 gpu-node-07 kernel: [    5.120000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  "
                 "550.127.05  Tue Oct  8 03:22:07 UTC 2024\n"]
        while written < target:
            up += rng.random() * 0.05
            ts_s = int(ts + up)
            day = 1 + (ts_s // 86400) % 28
            stamp = "%s %2d %02d:%02d:%02d " % (_MONTHS[11], day, ts_s // 3600 % 24, ts_s // 60 % 60, ts_s % 60)
            is_xid = rng.randrange(1000) == 0
            template = rng.choice(_XIDS) if is_xid else rng.choice(_NOISE)
            line = stamp + template.format(host="gpu-node-07", up=up, ts=ts_s, ms=rng.randrange(1000),
                                           n=rng.randrange(100000), pid=rng.randrange(1, 4000000),
                                           a=rng.randrange(256), b=rng.randrange(256), bus=rng.choice(buses)) + "\n"
            xids += is_xid
            batch.append(line)
            written += len(line)
            if is_xid:
                for follow in _FOLLOW_ONS:
                    line = stamp + follow.format(host="gpu-node-07", up=up, n=rng.randrange(100000),
                                                 bus=rng.choice(buses)) + "\n"
                    batch.append(line)
                    written += len(line)
            if len(batch) >= 20000:
                fh.write("".join(batch))
                batch = []
        fh.write("".join(batch))
    os.replace(tmp, path)
    return xids


def ensure_files(size_mb, out):
    out.mkdir(parents=True, exist_ok=True)
    plain = out / ("kern-%dmb.log" % size_mb)
    gz = out / ("kern-%dmb.log.gz" % size_mb)
    if not plain.exists():
        started = time.monotonic()
        generate(plain, size_mb)
        print("generated %s (%.1f MiB) in %.1f s" % (plain, plain.stat().st_size / 2**20, time.monotonic() - started))
    if not gz.exists() or gz.stat().st_mtime < plain.stat().st_mtime:
        with open(plain, "rb") as src, gzip.open(str(gz) + ".tmp", "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 8 * 1024 * 1024)
        os.replace(str(gz) + ".tmp", gz)
    return plain, gz


def child(path):
    """Run in a child process: scan one file, print JSON with the counts, the scan time and the peak RSS."""
    sys.path.insert(0, str(REPO / "collections"))
    from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import XidScanner
    from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import open_log

    started = time.monotonic()
    scanner = XidScanner(max_events=1000)
    with open_log(path) as fh:
        scanner.scan_binary(fh)
    result = scanner.result()
    elapsed = time.monotonic() - started
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"xid_lines": result["summary"]["xid_lines"], "events": result["summary"]["events"],
                      "scan_s": elapsed, "peak_rss_mb": peak_kb / 1024.0}))


def time_parser(path, repeat):
    best = None
    for _ in range(repeat):
        started = time.monotonic()
        # -S: the parser is stdlib-only, so skip site-packages (the venv's import hooks cost ~30 ms per start)
        proc = subprocess.run([sys.executable, "-S", str(Path(__file__).resolve()), "--child", str(path)],
                              capture_output=True, text=True, check=True)
        wall = time.monotonic() - started
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        data["wall_s"] = wall
        if best is None or wall < best["wall_s"]:
            best = data
    return best


def time_grep(path, repeat):
    best = None
    for _ in range(repeat):
        started = time.monotonic()
        if str(path).endswith(".gz"):
            zcat = subprocess.Popen(["zcat", str(path)], stdout=subprocess.PIPE)
            out = subprocess.run(["grep", "-c", PATTERN], stdin=zcat.stdout, capture_output=True, text=True)
            zcat.stdout.close()
            zcat.wait()
        else:
            out = subprocess.run(["grep", "-c", PATTERN, str(path)], capture_output=True, text=True)
        wall = time.monotonic() - started
        count = int(out.stdout.strip() or 0)
        if best is None or wall < best[0]:
            best = (wall, count)
    return best


def measure(path, repeat):
    grep_s, grep_count = time_grep(path, repeat)
    parser = time_parser(path, repeat)
    if parser["xid_lines"] != grep_count:
        raise SystemExit("MISMATCH on %s: parser saw %d Xid lines, grep counted %d" % (path, parser["xid_lines"], grep_count))
    ratio = parser["wall_s"] / grep_s if grep_s > 0 else float("inf")
    print("%-32s grep %7.3f s  parser %7.3f s (scan %7.3f s)  ratio %5.2f  xid_lines %6d  events %6d  peak_rss %6.1f MiB"
          % (path.name, grep_s, parser["wall_s"], parser["scan_s"], ratio, grep_count, parser["events"],
             parser["peak_rss_mb"]))
    return ratio, parser["peak_rss_mb"]


def main(argv=None):
    ap = argparse.ArgumentParser(description="XID parser vs grep -c benchmark")
    ap.add_argument("--size-mb", type=int, default=256, help="size of the big synthetic log (MiB)")
    ap.add_argument("--small-mb", type=int, default=16, help="size of the small log that shows flat memory (MiB)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is kept")
    ap.add_argument("--out-dir", type=Path, default=OUT_DEFAULT, help="where the synthetic logs go (gitignored)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    small_mb = min(args.small_mb, args.size_mb)
    big_plain, big_gz = ensure_files(args.size_mb, args.out_dir)
    small_plain, small_gz = ensure_files(small_mb, args.out_dir)
    for path in (big_plain, big_gz, small_plain, small_gz):  # warm the page cache: compare CPU, not the disk
        with open(path, "rb") as fh:
            while fh.read(8 * 1024 * 1024):
                pass
    ratio, rss_big = measure(big_plain, args.repeat)
    gz_ratio, rss_big_gz = measure(big_gz, args.repeat)
    _, rss_small = measure(small_plain, args.repeat)
    _, rss_small_gz = measure(small_gz, args.repeat)
    print("memory: %d MiB file %.1f MiB RSS, %d MiB file %.1f MiB RSS (gz: %.1f / %.1f MiB)"
          % (args.size_mb, rss_big, small_mb, rss_small, rss_big_gz, rss_small_gz))
    print("gz ratio=%.2f" % gz_ratio)
    print("xid_scan ratio=%.2f peak_rss_mb=%.1f" % (ratio, max(rss_big, rss_big_gz)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
