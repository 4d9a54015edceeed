"""A playbook run where the controller lacks what the collection needs says what is missing.

- The collection not on Ansible's collections path (a clone's playbook run from another directory, an uninstalled
  collection): Ansible fails before any play with "couldn't resolve module/action" or "role ... was not found" and
  shows the lines above the offending one, so every playbook carries the hint there (what is missing, the fix).
- The documented ansible.cfg not read (run from another directory): run_guard warns that the run_record callback is
  off and that forks are fewer than the nodes, each with the setting, before anything else. (A new reports directory
  relative to where one runs is said: tests/integration/test_docs_commands.py runs there.)
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HINT = "Ansible does not see the collection:"
# The playbooks Ansible resolves at load time, and elastic_training whose role is included when it runs.
LOAD_TIME = ["burn_in", "preflight", "audit", "abort", "job_postmortem", "audit_timer", "provision"]


def _env(tmp_path, cfg_text):
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(cfg_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    env.update(ANSIBLE_CONFIG=str(cfg), ANSIBLE_NOCOLOR="1", GPUFLEET_SIM_STATE_ROOT=str(tmp_path / "sim-state"))
    return env


@pytest.mark.parametrize("playbook", LOAD_TIME + ["elastic_training"])
def test_a_playbook_without_the_collection_says_what_is_missing(tmp_path, playbook):
    env = _env(tmp_path, "[defaults]\ncollections_path = %s\n" % (tmp_path / "no-collections"))
    argv = [str(BIN / "ansible-playbook"), str(REPO / "playbooks" / (playbook + ".yml")), "-i", "localhost,"]
    argv += ["--syntax-check"] if playbook in LOAD_TIME else ["-c", "local", "-e", "gpufleet_hosts=localhost"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert "kentino.gpufleet" in out and HINT in out, out[-2000:]
    assert "install it (ansible-galaxy collection install) or run from a clone's root" in out


def test_a_run_without_the_documented_configuration_names_what_it_lacks(tmp_path):
    # The clone's collection is found, but none of the documented settings is: no callback, Ansible's 5 forks.
    env = _env(tmp_path, "[defaults]\ncollections_path = %s\n" % (REPO / "collections"))
    nodes = ",".join("sim-node%02d" % i for i in range(1, 7))
    proc = subprocess.run([str(BIN / "ansible-playbook"), "kentino.gpufleet.preflight",
                           "-i", str(REPO / "inventories" / "sim"), "-l", nodes + ",localhost",
                           "-e", json.dumps({"gpufleet_burn_duraton_s": 1})],  # a typo: refused before any node
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "did you mean gpufleet_burn_duration_s" in out, out[-3000:]
    assert "the callback kentino.gpufleet.run_record is not enabled" in out, out[-3000:]
    assert "forks is 5 for 6 nodes" in out and "forks = 6 or more" in out
    assert not (tmp_path / "sim-state").exists(), "a node was touched"
