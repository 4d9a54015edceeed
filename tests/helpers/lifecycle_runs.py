"""The lifecycle playbook run as an operator runs it against a simulated fleet (sim/make_inventory.py under `root`,
the simulator's state and Slurm under root/state), one node at a time with its own reports and history."""

import json
import os
import subprocess
import sys
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, default_path

REPO = Path(__file__).resolve().parents[2]


def lifecycle_args(root, node, action, *extra):
    """ansible-playbook's -e arguments for one node's lifecycle run, its reports and history under root/node."""
    args = ["-e", "gpufleet_report_dir=%s" % (root / node), "-e", "lifecycle_action=%s" % action,
            "-e", "lifecycle_node=%s" % node, "-e", "lifecycle_dcgm_level=1", "-e", "gpufleet_hosts=%s" % node]
    for item in extra:
        args += ["-e", item]
    return args


def play(root, node, action, *extra, playbook="lifecycle"):
    """Run a playbook for one node (reports and history under root/node); each extra is one -e; (rc, output)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
               GPUFLEET_SIM_STATE_ROOT=str(root / "state"))
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "playbooks/%s.yml" % playbook, "-i",
                           str(root / "inv")] + lifecycle_args(root, node, action, *extra), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def rows(root, node):
    """The node's lifecycle transitions in its history (root/node/history), oldest first."""
    with History(default_path(root / node / "history"), readonly=True) as history:
        return history.lifecycle_of(node)


def slurm(root, node):
    """The simulator's Slurm state of the node, or None before its first scontrol."""
    path = root / "state" / "slurm" / ("%s.json" % node)
    return json.loads(path.read_text()) if path.exists() else None
