"""Run the collection's playbooks like a user does (ansible-playbook from the repo root) and read their report."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def run_playbook(name, tmp_root, inventory="inventories/sim", extra=None, timeout=900, args=()):
    """Run playbooks/<name>.yml like a user would; return (returncode, output, report dict or None)."""
    report_dir = tmp_root / "reports"
    extra_vars = {"gpufleet_report_dir": str(report_dir)}
    extra_vars.update(extra or {})
    # No ANSIBLE_NOCOLOR: output to a pipe has no colour codes by itself, as a user's `| tee` would see it.
    env = {k: v for k, v in os.environ.items() if k not in ("ANSIBLE_NOCOLOR", "ANSIBLE_FORCE_COLOR")}
    env.update({
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_INJECT_FACT_VARS": "false",
        "GPUFLEET_SIM_STATE_ROOT": str(tmp_root / "sim-state"),
    })
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "playbooks/%s.yml" % name, "-i", inventory,
                           "-e", json.dumps(extra_vars)] + list(args),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    latest = report_dir / "latest" / "report.json"
    report = json.loads(latest.read_text()) if latest.exists() else None
    return proc.returncode, output, report




def nodes_by_host(report):
    return {n["host"]: n for n in report["nodes"]}


def codes(node, gpu=None):
    return {f["code"] for f in node["findings"] if gpu is None or f.get("gpu") == gpu}
