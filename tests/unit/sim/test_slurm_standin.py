"""The simulator's scontrol, sinfo and scancel print what the collection's Slurm parsers read from a real Slurm
(module_utils/slurm.py): one node line per state file, the drain's reason with its user and time, DRAINING while a
job holds the node, Slurm's own errors for an unknown node and a drain without a reason."""

import os
import subprocess
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils import slurm

BIN = Path(__file__).resolve().parents[3] / "sim" / "bin"


def _run(tmp_path, tool, *argv, user="root"):
    env = dict(os.environ, GPUFLEET_SIM_STATE=str(tmp_path / "n1"), GPUFLEET_SIM_NODE="n1", LOGNAME=user, USER=user)
    proc = subprocess.run([str(BIN / tool)] + list(argv), env=env, capture_output=True, text=True, timeout=30)
    return proc.returncode, proc.stdout, proc.stderr


def test_drain_jobs_and_resume_read_as_slurm_says_them(tmp_path):
    rc, out, _err = _run(tmp_path, "scontrol", "show", "node", "-o", "n1")
    node = slurm.parse_node(out)
    assert rc == 0 and (node["name"], node["state"], node["drain"], node["reason"]) == ("n1", "IDLE", False, None)
    assert _run(tmp_path, "scontrol", "update", "nodename=n1", "state=drain",
                "reason=bad dimm, see INC-4711 (owner=hw)", user="ana")[0] == 0
    node = slurm.parse_node(_run(tmp_path, "scontrol", "show", "node", "-o", "n1")[1])
    assert (node["drained"], node["owned"], node["reason"], node["reason_user"]) == (
        True, False, "bad dimm, see INC-4711 (owner=hw)", "ana")
    assert slurm.parse_sinfo_state(_run(tmp_path, "sinfo", "-h", "-N", "-n", "n1", "-o", "%T")[1]) == "drained"
    assert _run(tmp_path, "gpufleet-sim", "slurm", "--jobs", "1")[0] == 0
    node = slurm.parse_node(_run(tmp_path, "scontrol", "show", "node", "-o", "n1")[1])
    assert (node["state"], node["draining"]) == ("ALLOCATED+DRAIN", True)
    assert slurm.parse_sinfo_state(_run(tmp_path, "sinfo", "-h", "-N", "-n", "n1", "-o", "%T")[1]) == "draining"
    assert _run(tmp_path, "scancel", "--nodelist=n1")[0] == 0
    assert _run(tmp_path, "scontrol", "update", "nodename=n1", "state=resume")[0] == 0
    assert slurm.parse_node(_run(tmp_path, "scontrol", "show", "node", "-o", "n1")[1])["state"] == "IDLE"


def test_an_unknown_node_and_a_drain_without_reason_are_slurms_errors(tmp_path):
    argv = ["scontrol", "show", "node", "-o", "n9"]
    rc, out, err = _run(tmp_path, *argv)
    assert slurm.classify("n9", argv, rc, out, err).state == "unknown_node"
    argv = ["scontrol", "update", "nodename=n9", "state=drain", "reason=x"]
    assert slurm.classify("n9", argv, *_run(tmp_path, *argv)).state == "unknown_node"
    rc, _out, err = _run(tmp_path, "scontrol", "update", "nodename=n1", "state=drain")
    assert rc == 1 and "You must specify a reason when DRAINING a node" in err
