#!/usr/bin/env python3
"""Controller CPU per node of a burn-in over real SSH: can one controller drive a 1,000-node burn-in?

Brings up 4 nodes of the real test fleet (systemd-nspawn nodes over SSH, tests/fleet/harness.py; root), installs the
simulator there, and runs playbooks/burn_in.yml twice at the default poll interval (gpufleet_poll_interval_s=120) with
the simulator in REAL time: a short burn and a 300 s burn (dcgmi and NCCL off: the burn's wait is what scales with
time). The controller's CPU is ansible-playbook and every process it waited for (resource.getrusage of the children),
not the nodes'. The part that grows with the burn's length is the slope between the two runs; the 600 s figure is
the long run plus that slope over the remaining seconds. Prints both runs and the ratio to the goal; last line:
`controller_cost cpu_s_per_node_600s=<x>` (goal <= 5).

    sudo .venv/bin/python bench/controller_cost.py [--nodes 4] [--short-s 30] [--long-s 120]
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
sys.path.insert(0, str(REPO / "tests" / "fleet"))
sys.path.insert(0, str(REPO / "tests"))

import aptrepo  # noqa: E402
import harness  # noqa: E402
from fleet_ansible import PlaybookRun, ansible_env  # noqa: E402

GOAL_S = 5.0
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def process_cpu(pid):
    """utime + stime of one live process, seconds (from /proc; 0 once it is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / float(os.sysconf("SC_CLK_TCK"))
    except (OSError, IndexError, ValueError):
        return 0.0


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def burn(fleet, inventory, work, seconds, poll_s):
    extra = {"gpufleet_report_dir": str(work / ("reports-%d" % seconds)), "gpufleet_burn_duration_s": seconds,
             "gpufleet_poll_interval_s": poll_s, "gpufleet_fail_on": "never", "gpufleet_dcgm_enabled": False,
             "gpufleet_nccl_enabled": False, "gpufleet_checkpoint_path": ""}
    for node in fleet.nodes:
        fleet.ssh(node.name, "rm -rf /var/lib/gpufleet-sim")
    before, started = children_cpu(), time.monotonic()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("ansible-playbook")), str(REPO / "playbooks" /
                             "burn_in.yml"), "-i", str(fleet.inventory_path), "-i", str(inventory), "-e",
                             json.dumps(extra)], cwd=str(REPO), env=ansible_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    main_cpu = 0.0
    output = []
    reader = threading.Thread(target=lambda: output.append(proc.stdout.read()))
    reader.start()
    while proc.poll() is None:
        main_cpu = max(main_cpu, process_cpu(proc.pid))  # the main process alone (its workers are children)
        time.sleep(0.5)
    reader.join()
    proc.stdout.close()
    cpu, wall = children_cpu() - before, time.monotonic() - started
    proc.stdout_text = "".join(output)
    report = work / ("reports-%d" % seconds) / "latest" / "report.json"
    if proc.returncode != 0 or not report.exists():
        sys.stderr.write(proc.stdout_text[-5000:])
        raise SystemExit("the %d s burn-in failed (rc %d)" % (seconds, proc.returncode))
    verdicts = [n["verdict"] for n in json.loads(report.read_text())["nodes"]]
    return cpu, wall, verdicts, main_cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--short-s", type=int, default=30)
    p.add_argument("--long-s", type=int, default=300)
    p.add_argument("--poll-s", type=int, default=120, help="gpufleet_poll_interval_s (the role's default)")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/controller_cost.py needs root (the test fleet's nodes): sudo .venv/bin/python ...")
    with tempfile.TemporaryDirectory(prefix="controller_cost.") as tmp:
        work = Path(tmp)
        base = harness.ensure_base()
        fleet = harness.Fleet(dir=Path("/var/tmp/gpufleet-bench-fleet"), nodes_wanted=args.nodes, prefix="gpfb",
                              subnet="10.213.9")
        if fleet.state_path.exists():
            harness.Fleet.from_state(fleet.dir).down()
        fleet.repo_info = aptrepo.build_repo(fleet.apt_dir, harness.DEFAULT_CACHE, base=base, only=())
        fleet.up(base=base)
        try:
            fleet.write_inventory(groups=("gpufleet_testfleet", "gpufleet_nodes"))
            install = PlaybookRun(fleet, """
            - name: Install the simulated GPU tools
              hosts: all
              gather_facts: false
              tasks:
                - name: Install gpufleet-sim
                  ansible.builtin.apt:
                    name: gpufleet-sim
                    update_cache: true
            """, tmp_path=work).wait(300)
            if install.proc.returncode != 0:
                raise SystemExit(install.output[-3000:])
            scenarios = {n.name: {"gpufleet_sim_scenario": "healthy_h100"} for n in fleet.nodes}
            inventory = work / "sim_vars.yml"
            inventory.write_text(json.dumps({"gpufleet_nodes": {"hosts": scenarios, "vars": {
                "gpufleet_sim_root": "/usr/lib/gpufleet-sim", "gpufleet_sim_state_root": "/var/lib/gpufleet-sim",
                "gpufleet_environment": {
                    "PATH": "/usr/lib/gpufleet-sim/bin:" + NODE_PATH,
                    "GPUFLEET_SIM_SCENARIO": "/usr/lib/gpufleet-sim/scenarios/{{ gpufleet_sim_scenario }}.json",
                    "GPUFLEET_SIM_STATE": "/var/lib/gpufleet-sim/{{ inventory_hostname }}",
                    "GPUFLEET_SIM_NODE": "{{ inventory_hostname }}", "GPUFLEET_SIM_TIME_SCALE": "1.0"},
                "gpufleet_state_dir": "/var/lib/gpufleet-sim/{{ inventory_hostname }}/gpufleet",
                "gpufleet_sample_interval_s": 5}}}))
            short = burn(fleet, inventory, work, args.short_s, args.poll_s)
            long = burn(fleet, inventory, work, args.long_s, args.poll_s)
        finally:
            fleet.down()
    n = args.nodes
    slope = max(0.0, (long[0] - short[0]) / float(args.long_s - args.short_s))
    per_node_600 = (long[0] + slope * (600 - args.long_s)) / n
    print("controller_cost nodes=%d poll_s=%d" % (n, args.poll_s))
    for name, (cpu, wall, verdicts, main) in (("%ds" % args.short_s, short), ("%ds" % args.long_s, long)):
        print("  burn %-5s controller cpu %.2f s (%.2f s/node; ansible-playbook's own process %.2f s), wall %.1f s, "
              "verdicts %s" % (name, cpu, cpu / n, main, wall, ",".join(verdicts)))
    print("  cpu per extra burn second: %.4f s (%.4f s/node)" % (slope, slope / n))
    print("  goal %.1f s/node for a 600 s burn: ratio %.2f (<= 1 meets it)" % (GOAL_S, per_node_600 / GOAL_S))
    print("controller_cost cpu_s_per_node_600s=%.2f" % per_node_600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
