#!/usr/bin/env python3
"""What an audit costs per node: kentino.gpufleet.audit (one health_snapshot round trip per node) against a naive
audit that reads each signal with its own command task (bench/naive_audit.yml), on the same simulated fleet, in one
run.

CPU is split where it is spent. Node side: every module process (AnsiballZ and the tools it runs) is started through
bench/node_python, a wrapper interpreter that records the CPU of its child (os.wait4, which includes the tools the
module waited for). Controller side: everything else ansible-playbook and its workers used (the run's children CPU
minus the node side). Both playbooks run the same stand-in tools; the audit also judges every node, writes the
report and records the history (the naive one judges nothing). DCGM is off in both (the diag is not a signal read).

    .venv/bin/python bench/audit_cost.py [--nodes 64] [--scenario mix]

Prints per node: controller CPU s, node CPU s, total, wall; last line
`audit_cost ratio=<naive_cpu/ours_cpu> wall_ratio=<naive_wall/ours_wall>` (goal ratio >= 3).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL = 3.0


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def node_cpu(log):
    try:
        return sum(float(line.split()[0]) for line in log.read_text().splitlines() if line.strip())
    except FileNotFoundError:
        return 0.0


def run(name, playbook, inventory, work, extra, nodes):
    log = work / ("node-cpu-%s.log" % name)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
               ANSIBLE_NOCOLOR="1", GPUFLEET_SIM_STATE_ROOT=str(work / ("state-%s" % name)),
               BENCH_NODE_CPU_LOG=str(log), BENCH_NODE_PYTHON=sys.executable)
    extra = dict(extra, ansible_python_interpreter=str(REPO / "bench" / "node_python"))
    # Every node's simulator state is created first (outside the measurement) for both runs alike.
    subprocess.run([str(REPO / "sim" / "reset"), "--root", str(work / ("state-%s" % name))], capture_output=True)
    before, started = children_cpu(), time.monotonic()
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), str(playbook), "-i", str(inventory),
                           "-e", json.dumps(extra)], cwd=str(REPO), env=env, capture_output=True, text=True)
    wall, total = time.monotonic() - started, children_cpu() - before
    if proc.returncode not in (0, 2):
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-2000:])
        raise SystemExit("%s failed (rc %d)" % (name, proc.returncode))
    node = node_cpu(log)
    modules = len(log.read_text().splitlines()) if log.exists() else 0
    return {"name": name, "wall_s": wall, "cpu_s": total, "node_cpu_s": node, "controller_cpu_s": total - node,
            "module_runs": modules, "per_node": {"cpu_s": total / nodes, "node_cpu_s": node / nodes,
                                                  "controller_cpu_s": (total - node) / nodes, "wall_s": wall / nodes,
                                                  "module_runs": modules / float(nodes)}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--scenario", default="healthy_h100,healthy_rtx5090,ecc_leak_trend,pcie_degraded")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gpufleet-audit-cost."))
    inventory = work / "inv"
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(inventory), "--nodes",
                    str(args.nodes), "--scenario", args.scenario], check=True)
    common = {"gpufleet_report_dir": str(work / "reports"), "gpufleet_fail_on": "never",
              "gpufleet_audit_dcgm_enabled": False}
    print("audit_cost: %d simulated nodes (%s), work in %s" % (args.nodes, args.scenario, work))
    # The naive audit first: both start from a fresh simulator state; neither warms the other's caches.
    naive = run("naive", REPO / "bench" / "naive_audit.yml", inventory, work, common, args.nodes)
    ours = run("audit", REPO / "playbooks" / "audit.yml", inventory, work, common, args.nodes)
    report = json.loads((work / "reports" / "latest" / "report.json").read_text())
    assert len(report["nodes"]) == args.nodes, "the audit judged %d nodes" % len(report["nodes"])
    print("%-8s %10s %10s %10s %10s %12s" % ("", "ctrl s/node", "node s/node", "total s/node", "wall s", "modules/node"))
    for r in (naive, ours):
        p = r["per_node"]
        print("%-8s %10.3f %10.3f %10.3f %10.1f %12.1f" % (r["name"], p["controller_cpu_s"], p["node_cpu_s"],
                                                           p["cpu_s"], r["wall_s"], p["module_runs"]))
    ratio = naive["cpu_s"] / ours["cpu_s"]
    wall_ratio = naive["wall_s"] / ours["wall_s"]
    out = REPO / "bench" / "output"
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit_cost.json").write_text(json.dumps({"nodes": args.nodes, "naive": naive, "audit": ours,
                                                     "ratio": ratio, "wall_ratio": wall_ratio}, indent=2))
    print("node CPU ratio %.2f, controller CPU ratio %.2f; goal: total ratio >= %.0f (%s)" % (
        naive["node_cpu_s"] / ours["node_cpu_s"], naive["controller_cpu_s"] / ours["controller_cpu_s"], GOAL,
        "met" if ratio >= GOAL else "NOT met"))
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    print("audit_cost ratio=%.2f wall_ratio=%.2f" % (ratio, wall_ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
