#!/usr/bin/env python3
"""Benchmark: the job post-mortem of a 64-node x 8-rank job (512 ranks) on one machine.

Generates under bench/output/postmortem/ (reused when present): per node a torchrun log (together --log-mb, default
100 MB: loss prints, tqdm frames, NCCL INFO lines, warnings, and the watchdog lines of its 8 ranks in torch 2.5+
form) and 8 flight-recorder dumps of --entries entries each (format 2.10, frames shared as torch writes them), from
the simulator's job writer (sim/gpufleet_sim/job.py; rank 21 stops, node03's GPU 5 fell off the bus at T-40 s).
Then, in a child process that reports peak RSS (resource.getrusage, itself and its workers), times on this machine:
  node side   per node: the log parsed by module_utils/job_sources (torch_watchdog) and its dumps read and base64'd,
              as job_evidence does (a fleet's nodes do this at once, each its share; here --workers at a time);
  controller  the analysis of all 64 results: 512 dumps base64-decoded, unpickled by the restricted unpickler and
              reduced (--workers processes, as the action does with the controller's CPUs), logs merged,
              rank -> node -> GPU, XIDs, verdict, postmortem.json validated and its Markdown/HTML rendered.
CPU seconds are printed beside the wall time: on a shared machine the wall time includes waiting for a CPU.
The verdict must name rank 21 on node03 GPU 5. Goal: node side + controller under 10 s, peak RSS under 500 MB.
The last line is machine-readable:
    postmortem seconds=<node side + controller, wall> peak_rss_mb=<this process + each worker at its peak>
Usage: bench/postmortem.py [--nodes 64] [--log-mb 100] [--entries 2000] [--workers N] [--out-dir bench/output]
"""

import argparse
import json
import os
import pickle
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(REPO / "sim"))

NOISE = [
    "{tee}{{'loss': {loss:.4f}, 'grad_norm': {g:.4f}, 'learning_rate': 1.9e-05, 'epoch': {ep:.2f}}}",
    "{tee} {pct:3d}%|{bar:<10}| {step}/52000 [3:12:{s:02d}<9:41:07,  1.41it/s]",
    "{tee}node{node:02d}:{pid}:{pid} [{local}] NCCL INFO Channel {ch:02d}/24 : 0 1 2 3 4 5 6 7",
    "{tee}node{node:02d}:{pid}:{pid} [{local}] NCCL INFO comm 0x55d4c1e0 rank {rank} nRanks 512 nNodes 64 "
    "localRanks 8 localRank {local} MNNVL 0",
    "{tee}/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:92: UserWarning: None of the inputs have "
    "requires_grad=True. Gradients will be None",
    "{tee}[2025-12-06 10:{s:02d}:11,482] [INFO] [trainer.py:412] step {step} tokens/s 18342.5 mfu 0.41",
    "{tee}Traceback-free retry: dataloader worker {local} restarted after a transient Error reading shard {step}",
]


def generate(out, nodes, log_mb, entries, T):
    from gpufleet_sim import job as sim_job

    job = {"nodes": ["node%02d" % (n + 1) for n in range(nodes)], "nproc_per_node": 8, "timeout_ms": 600000,
           "stuck": {"rank": 21, "mode": "stop", "seq": 40000, "op": "ALLREDUCE", "numel": 4194304},
           "history": entries}
    marker = out / "meta.json"
    if marker.exists() and json.loads(marker.read_text()) == {"nodes": nodes, "log_mb": log_mb, "entries": entries}:
        return json.loads((out / "T.json").read_text())["T"]
    rng = random.Random(7)
    per_node = int(log_mb * 1024 * 1024 / nodes)
    for n, host in enumerate(job["nodes"]):
        d = out / host
        (d / "dumps").mkdir(parents=True, exist_ok=True)
        tail = sim_job.log_lines(job, n, T)
        with open(d / "train.log", "w") as fh:
            size, step = 0, 1000
            while size < per_node:
                local = rng.randrange(8)
                line = rng.choice(NOISE).format(tee="[default%d]:" % local, loss=2 - step / 60000, g=rng.random(),
                                                ep=step / 52000, pct=step * 100 // 52000, bar="#" * (step % 10),
                                                step=step, s=step % 60, node=n + 1, pid=4000 + local, local=local,
                                                ch=step % 24, rank=n * 8 + local)
                fh.write(line + "\n")
                size += len(line) + 1
                step += 1
            fh.write("\n".join(tail) + "\n")
        for local in range(8):
            rank = n * 8 + local
            with open(d / "dumps" / ("nccl_trace_rank_%d" % rank), "wb") as fh:
                pickle.dump(sim_job.dump(job, rank, T), fh, protocol=2)
            os.utime(d / "dumps" / ("nccl_trace_rank_%d" % rank), (T + 1, T + 1))
    (out / "T.json").write_text(json.dumps({"T": T}))
    marker.write_text(json.dumps({"nodes": nodes, "log_mb": log_mb, "entries": entries}))
    return T


def _kernel(T):
    """node03's kernel log: GPU 5 (bus a1) fell off the bus at T-40 s, through the collection's XID parser."""
    from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import XidScanner

    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(T - 40)) + ",%06d+00:00" % round((T % 1) * 1e6)
    scanner = XidScanner()
    scanner.feed_line("%s NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the "
                      "bus." % stamp)
    facts = scanner.result()
    return {"source": "journal", "error": None, "events": facts["events"], "lost_gpus": facts["lost_gpus"],
            "gpu_ids": {}, "unparsed": {}}


def collect(args):
    """One node's share, as job_evidence does it: the log parsed, the dumps read and base64'd."""
    out, n, T = args
    from ansible_collections.kentino.gpufleet.plugins.module_utils.job_sources import collect_dumps, read_log_file

    buses = ["01", "21", "41", "61", "81", "a1", "c1", "e1"]
    host = "node%02d" % (n + 1)
    t0 = time.perf_counter()
    me = os.getuid()  # the bench wrote the files: its user is the job's
    log = read_log_file(str(out / host / "train.log"), job_uid=me)
    dumps, _notes = collect_dumps([str(out / host / "dumps" / "nccl_trace_rank_")], 64 << 20, 256 << 20, job_uid=me)
    lost = [5] if host == "node03" else []
    evidence = {"host": host, "now": T + 60, "logs": [log], "dumps": dumps, "errors": [], "notes": [],
                "kernel": _kernel(T) if host == "node03" else {"events": [], "lost_gpus": []},
                "gpus": [{"index": i, "pci": "0000:%s:00" % buses[i], "uuid": "GPU-%d-%d" % (n, i),
                          "name": "RTX 5090", "lost": False} for i in range(8) if i not in lost],
                "gpu_problems": [{"kind": "lost", "pci": "0000:a1:00", "message": "GPU is lost"}] if lost else [],
                "processes": []}
    return host, evidence, time.perf_counter() - t0, log["bytes"], sum(d["bytes"] for d in dumps)


def measure(out, nodes, T, workers):
    import concurrent.futures

    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import analysis, document

    hosts, node_times, log_bytes, dump_bytes = {}, [], 0, 0
    start_all, cpu_all = time.perf_counter(), os.times()
    # The nodes of a fleet collect at the same time, each its own share: here `workers` at a time.
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        for host, evidence, seconds, lb, db in pool.map(collect, [(out, n, T) for n in range(nodes)]):
            hosts[host] = evidence
            node_times.append(seconds)
            log_bytes, dump_bytes = log_bytes + lb, dump_bytes + db
    node_side = time.perf_counter() - start_all
    mid = os.times()
    t0 = time.perf_counter()
    result = analysis.analyse(hosts, now=T + 60, workers=workers)
    doc = document.build(result, "bench")
    document.validate(doc)
    md, html = document.render_md(doc), document.render_html(doc)
    controller = time.perf_counter() - t0
    end = os.times()

    def cpu(a, b):
        return (b.user - a.user) + (b.system - a.system) + (b.children_user - a.children_user) + \
            (b.children_system - a.children_system)

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    # Node-side workers are this process's children; the dump readers are the fork server's, and report themselves.
    pool = (result.get("flight") or {}).get("workers") or {}
    kids = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0, pool.get("peak_rss_mb") or 0)
    v = doc["verdict"]
    return {"node_side_s": round(node_side, 3), "node_max_s": round(max(node_times), 3),
            "node_sum_s": round(sum(node_times), 3), "controller_s": round(controller, 3),
            "node_cpu_s": round(cpu(cpu_all, mid), 3),
            "controller_cpu_s": round(cpu(mid, end) + (pool.get("cpu_s") or 0), 3),
            "load": os.getloadavg()[0], "workers": workers,
            "log_mb": round(log_bytes / 1048576, 1),
            "dump_mb": round(dump_bytes / 1048576, 1), "lines": result["merged_counts"]["lines_read"],
            "dumps": doc["summary"]["dumps"], "verdict": v["kind"], "rank": v["rank"], "host": v["host"],
            "gpu": v["gpu"], "message": v["message"][:120], "md_kb": len(md) // 1024, "html_kb": len(html) // 1024,
            "own_rss_mb": round(own, 1), "worker_rss_mb": round(kids, 1),
            # An upper bound of the memory in use at once: this process plus every worker at its own peak.
            "peak_rss_mb": round(own + workers * kids, 1)}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--log-mb", type=float, default=100)
    p.add_argument("--entries", type=int, default=2000)
    p.add_argument("--out-dir", default=str(REPO / "bench" / "output"))
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1),
                   help="processes for the node side and the dump reading (default: the CPUs, at most 4)")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    out = Path(a.out_dir) / "postmortem"
    if a.measure:
        T = json.loads((out / "T.json").read_text())["T"]
        print(json.dumps(measure(out, a.nodes, T, max(1, a.workers))))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    generate(out, a.nodes, a.log_mb, a.entries, time.time() - 3600)
    print("inputs ready in %.1f s under %s" % (time.perf_counter() - t0, out))
    child = subprocess.run([sys.executable, __file__, "--measure", "--nodes", str(a.nodes), "--out-dir", a.out_dir,
                            "--workers", str(a.workers)], capture_output=True, text=True)
    if child.returncode != 0:
        sys.stderr.write(child.stderr)
        return 1
    r = json.loads(child.stdout.strip().splitlines()[-1])
    print("%d nodes x 8 ranks: %.1f MB of logs (%d lines), %d dumps (%.1f MB, %d entries each)"
          % (a.nodes, r["log_mb"], r["lines"], r["dumps"], r["dump_mb"], a.entries))
    print("node side (64 shares: log parsed, dumps read + base64), %d at a time: %.2f s wall, %.2f s CPU; one node "
          "alone %.3f s at most (the sum of all shares %.2f s)" % (r["workers"], r["node_side_s"], r["node_cpu_s"],
                                                                   r["node_max_s"], r["node_sum_s"]))
    print("controller (512 dumps decoded + unpickled in %d processes, analysis, postmortem.json/md/html): %.2f s wall, "
          "%.2f s CPU" % (r["workers"], r["controller_s"], r["controller_cpu_s"]))
    print("memory: this process %.0f MB peak, each worker %.0f MB peak" % (r["own_rss_mb"], r["worker_rss_mb"]))
    print("machine load average during the run: %.1f on %d CPUs (wall time includes waiting for the CPU)"
          % (r["load"], os.cpu_count() or 1))
    print("verdict: %s rank %s on %s GPU %s: %s..." % (r["verdict"], r["rank"], r["host"], r["gpu"], r["message"]))
    ok = (r["rank"], r["host"], r["gpu"]) == (21, "node03", 5)
    total = r["node_side_s"] + r["controller_s"]  # everything, on this one machine
    print("goal: < 10 s and < 500 MB: %s; verdict %s" % (
        "met" if total < 10 and r["peak_rss_mb"] < 500 else "MISSED", "right" if ok else "WRONG"))
    print("postmortem seconds=%.2f peak_rss_mb=%.0f" % (total, r["peak_rss_mb"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
