#!/usr/bin/env python3
"""Fleet burn-in scaling: the same per-node burn-in on 1 and on N simulated nodes, measured in one run.

The per-node work is fixed (same scenario, same simulated burn length, same sampling and polling); only the number
of nodes changes, so wall(N)/wall(1) is the orchestration overhead of fanning out. Prints both walls, the tasks whose
wall grew most from 1 to N nodes (bench/callback_plugins/task_walls.py) and the ratio; last line:
`fleet_burnin ratio=<wallN/wall1>`.

    bench/fleet_burnin.py [--nodes 32] [--burn-real-s 120] [--poll-s 15] [--sample-s 10] [--keep DIR]

The last line also says whether every node got the verdict and findings the single node got (same_verdicts=yes):
a verdict that changes with the fleet's size means the benchmark measures nothing.
"""

import argparse
import configparser
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIME_SCALE = 0.01  # the simulator's default: a nominal 600 s burn takes 6 s


def configured_callbacks(cfg=REPO / "ansible.cfg"):
    """The callbacks the repository's ansible.cfg enables (an environment variable would replace them)."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(cfg)
    return [c.strip() for c in parser.get("defaults", "callbacks_enabled", fallback="").split(",") if c.strip()]


def run(nodes, args, work):
    inv = work / ("inv%d" % nodes)
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(inv), "--nodes", str(nodes),
                    "--scenario", args.scenario], check=True)
    extra = {
        "gpufleet_report_dir": str(work / ("reports%d" % nodes)),
        "gpufleet_burn_duration_s": int(args.burn_real_s / TIME_SCALE),
        "gpufleet_poll_interval_s": args.poll_s,
        "gpufleet_sample_interval_s": args.sample_s,
        "gpufleet_fail_on": "never",
    }
    walls = work / ("task_walls%d.json" % nodes)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), GPUFLEET_SIM_TIME_SCALE=str(TIME_SCALE),
               GPUFLEET_SIM_STATE_ROOT=str(work / ("state%d" % nodes)), ANSIBLE_FORKS=str(max(nodes, 5)),
               # each task's wall (bench/callback_plugins/task_walls.py), beside the collection's own callback
               ANSIBLE_CALLBACK_PLUGINS=str(REPO / "bench" / "callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED=",".join(configured_callbacks() + ["task_walls"]), TASK_WALLS_OUT=str(walls))
    playbook = Path(sys.executable).with_name("ansible-playbook")
    started = time.monotonic()
    proc = subprocess.run([str(playbook), str(REPO / "playbooks" / "burn_in.yml"), "-i", str(inv),
                           "-e", json.dumps(extra)], cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit("burn-in on %d node(s) failed (rc %d)" % (nodes, proc.returncode))
    report = json.loads((work / ("reports%d" % nodes) / "latest" / "report.json").read_text())
    verdicts, codes = {}, {}
    for node in report["nodes"]:
        verdicts[node["verdict"]] = verdicts.get(node["verdict"], 0) + 1
        for code in sorted({f["code"] for f in node["findings"]}):
            codes[code] = codes.get(code, 0) + 1
    return wall, verdicts, codes, json.loads(walls.read_text())


def task_split(walls1, wallsn, top=15):
    """Lines of the tasks whose wall grew most from 1 to N nodes, joined by (play, task, occurrence)."""
    one = {(play, task, n): s for play, task, n, s in walls1}
    many = {(play, task, n): s for play, task, n, s in wallsn}
    rows = sorted(((many[k] - one[k], one[k], many[k], k[1]) for k in one.keys() & many.keys()), reverse=True)
    lines = ["%8s %8s %8s  task (the %d whose wall grew most)" % ("1 node", "N nodes", "added", min(top, len(rows)))]
    lines += ["%7.1fs %7.1fs %+7.1fs  %s" % (a, b, d, task[:90]) for d, a, b, task in rows[:top]]
    lines.append("%7.1fs %7.1fs %+7.1fs  all %d tasks (not in both runs: %d)" % (
        sum(r[1] for r in rows), sum(r[2] for r in rows), sum(r[0] for r in rows), len(rows),
        len(one.keys() ^ many.keys())))
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--burn-real-s", type=float, default=120.0, help="real seconds of (simulated) gpu-burn per node")
    p.add_argument("--poll-s", type=int, default=15, help="async poll interval (gpufleet_poll_interval_s)")
    p.add_argument("--sample-s", type=int, default=10, help="nvidia-smi sample interval under load")
    p.add_argument("--scenario", default="healthy_h100")
    p.add_argument("--keep", help="write the inventories, reports and simulator state here (kept) instead of a "
                                  "temporary directory")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet_burnin.") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        wall1, v1, c1, t1 = run(1, args, work)
        walln, vn, cn, tn = run(args.nodes, args, work)
    cores = os.cpu_count()
    print("burn per node: %.0f s real (simulated %d s), poll %d s, samples every %d s, controller cores: %d"
          % (args.burn_real_s, int(args.burn_real_s / TIME_SCALE), args.poll_s, args.sample_s, cores))
    print("1 node:   wall %7.1f s  verdicts %s  findings %s" % (wall1, v1, c1))
    print("%d nodes: wall %7.1f s  verdicts %s  findings %s" % (args.nodes, walln, vn, cn))
    print("overhead per node beyond the first: %.2f s" % ((walln - wall1) / max(args.nodes - 1, 1)))
    print("\n".join(task_split(t1, tn)))
    # The same per-node work must give the same verdict at 1 and at N nodes (the same scenario on every node).
    same = set(vn) == set(v1) and {c: n / args.nodes for c, n in cn.items()} == {c: float(n) for c, n in c1.items()}
    print("fleet_burnin ratio=%.2f same_verdicts=%s" % (walln / wall1, "yes" if same else "NO"))


if __name__ == "__main__":
    main()
