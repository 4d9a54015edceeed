#!/usr/bin/env python3
"""How long an elastic job takes to get back to work after a worker dies, and how many steps it loses.

Two nodes on this machine (two launchers, each with its torchrun agent, its checkpoint and metrics directory; c10d
rendezvous, CPU torch and gloo from .venv-torch) train tests/fixtures/elastic/toy_train.py, which checkpoints every
--ckpt-every steps. Between two checkpoints one worker is SIGKILLed; torchrun restarts both nodes' workers, the
worker wrapper waits its backoff (--backoff-base with jitter 0.5), the job resumes from the last complete checkpoint.

Per run: seconds from the kill to the first finished step after the resume (and how much of it was the backoff), the
steps lost (last step finished before the kill minus the step resumed from), and whether the losses after the resume
repeat the run's own (they must: same state, same batches). The median of --runs runs is the last line:
`restart seconds=<s> steps_lost=<n> checkpoint_every=<k>`. Goal: steps lost <= the checkpoint interval.

Usage: bench/restart.py [--runs 3] [--ckpt-every 20] [--backoff-base 1] [--step-sleep 0.05]
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "unit" / "elastic"))
sys.path.insert(0, str(REPO / "collections"))

import elasticlib  # noqa: E402

TOY = REPO / "tests" / "fixtures" / "elastic" / "toy_train.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steps(root):
    path = root / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def one_run(tree, base, args, index):
    port = free_port()
    kill_step = args.ckpt_every * 3 + int(args.ckpt_every * 0.7)
    total = kill_step + 2 * args.ckpt_every
    nodes = []
    for name in ("node-a", "node-b"):
        root = base / ("run%d" % index) / name
        root.mkdir(parents=True)
        cfg = elasticlib.config(tree, root, job="bench", host=name, entrypoint=str(TOY), min_nodes=2, max_nodes=2,
                                rdzv_endpoint="127.0.0.1:%d" % port, monitor_interval_s=0.5, max_restarts=3,
                                rdzv_conf={"last_call_timeout": 5, "join_timeout": 120},
                                backoff={"base_s": args.backoff_base, "max_s": 60, "jitter": 0.5},
                                args=["--steps", str(total), "--ckpt-every", str(args.ckpt_every), "--step-sleep",
                                      str(args.step_sleep), "--metrics-interval", "1"])
        env = dict(os.environ, TOY_LOG=str(root / "steps.jsonl"), OMP_NUM_THREADS="1")
        log = open(root / "launcher.log", "w")
        proc = subprocess.Popen(elasticlib.launcher_argv(tree, cfg), stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        nodes.append((root, proc))
    a_root, a_proc = nodes[0]
    b_root, b_proc = nodes[1]
    try:
        elasticlib.wait_for(lambda: [s for s in steps(a_root) if s["step"] >= kill_step], 300, "step %d" % kill_step)
        workers = [p for p in elasticlib.descendants(b_proc.pid)
                   if elasticlib.cmdline(p).split()[1:3] == ["-u", str(TOY)]]
        killed_at = time.time()
        os.kill(workers[0], signal.SIGKILL)
        for _root, proc in nodes:
            if proc.wait(600) != 0:
                raise SystemExit("a launcher exited %s: see %s" % (proc.returncode, _root / "launcher.log"))
    finally:
        for _root, proc in nodes:
            if proc.poll() is None:
                elasticlib.kill_tree(proc.pid)
    log = steps(a_root)
    before = {s["step"]: s["loss"] for s in log if s["restart"] == 0}
    after = [s for s in log if s["restart"] == 1]
    if not after:
        raise SystemExit("run %d: no step after a restart; the launchers' logs: %s" % (index, a_root.parent))
    resumed = int(Path(after[0]["resumed_from"]).name.split("-")[1])
    lost = max(s["step"] for s in log if s["restart"] == 0 and s["t"] <= killed_at) - resumed
    same = all(abs(s["loss"] - before[s["step"]]) <= 1e-6 * max(1.0, abs(before[s["step"]]))
               for s in after if s["step"] in before)
    # the node whose worker was killed backs off; the other only when its agent saw its own worker fail first (not the
    # membership change)
    backoff = max(json.loads((root / "state" / "workers" / "local0.json").read_text())["backoff_s"]
                  for root, _proc in nodes)
    return {"seconds": after[0]["t"] - killed_at, "backoff_s": backoff, "steps_lost": lost, "resumed_from": resumed,
            "same_losses": same, "finished_at_step": log[-1]["step"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ckpt-every", type=int, default=20)
    parser.add_argument("--backoff-base", type=float, default=1.0)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--keep", help="keep the runs' directories (logs, checkpoints, metrics) here")
    args = parser.parse_args()
    if not elasticlib.TORCHRUN.exists():
        raise SystemExit(".venv-torch is missing: make torch-venv")
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-restart.") as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        tree = elasticlib.install_tree(base / "installed")
        results = []
        for i in range(args.runs):
            r = one_run(tree, base, args, i)
            results.append(r)
            print("run %d: %.2f s from the kill to the first step after the resume (backoff %.2f s), resumed from "
                  "step %d, %d step(s) lost, losses after the resume %s the run's own" % (
                      i + 1, r["seconds"], r["backoff_s"], r["resumed_from"], r["steps_lost"],
                      "repeat" if r["same_losses"] else "DIFFER FROM"), flush=True)
    seconds = statistics.median(r["seconds"] for r in results)
    lost = statistics.median(r["steps_lost"] for r in results)
    ok = all(r["steps_lost"] <= args.ckpt_every and r["same_losses"] for r in results)
    print("goal: steps lost <= %d in every run: %s; median restart %.2f s of which backoff %.2f s" % (
        args.ckpt_every, "met" if ok else "NOT MET", seconds, statistics.median(r["backoff_s"] for r in results)))
    print("restart seconds=%.2f steps_lost=%d checkpoint_every=%d" % (seconds, lost, args.ckpt_every))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
