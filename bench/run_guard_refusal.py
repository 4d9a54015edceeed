#!/usr/bin/env python3
"""How long the run guard takes to refuse a wrong value: a whole ansible-playbook run on the simulated fleet (9
nodes), wall time and the CPU time it used (user + system of the playbook and its children: what the refusal costs
whatever else loads the machine), with the load average beside them. No node is touched by a refusal (checked).

Usage (repo root, .venv):  bench/run_guard_refusal.py
"""

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = [{"gpufleet_fail_on": "sometimes"}, {"gpufleet_burn_duration_s": -5}, {"gpufleet_burn_duration_s": 0},
         {"gpufleet_sample_interval_s": -1}, {"gpufleet_lease_timeout_s": 0}]


def main():
    playbook = Path(sys.executable).with_name("ansible-playbook")
    print("refusal of a wrong value before any node is touched (burn_in, inventories/sim: 9 nodes)")
    worst = 0.0
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), GPUFLEET_SIM_STATE_ROOT=tmp + "/state")
            extra = dict(case, gpufleet_report_dir=tmp + "/reports")
            start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run([str(playbook), "playbooks/burn_in.yml", "-e", json.dumps(extra)], cwd=REPO, env=env,
                                  capture_output=True, text=True)
            took, after = time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            touched = os.path.exists(tmp + "/state")
        worst = max(worst, took)
        refused = proc.returncode != 0 and "refusing to start" in proc.stdout + proc.stderr
        print("  %-40s wall %5.2f s  cpu %5.2f s  refused=%s node touched=%s" % (json.dumps(case), took, cpu, refused,
                                                                               touched))
    print("slowest refusal: %.2f s wall (limit 10 s); load average %s on %d CPUs" % (
        worst, " ".join("%.1f" % x for x in os.getloadavg()), os.cpu_count()))
    return 0 if worst < 10 else 1


if __name__ == "__main__":
    sys.exit(main())
