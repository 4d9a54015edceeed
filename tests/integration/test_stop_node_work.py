"""`gpufleet abort` and Ctrl-C stop every node-side process of the run before they report, and say what they stopped.

A burn-in's node work is gpu_burn (a tool), the check modules that wait for their tools (gpu_burn, gpu_sample) and
Ansible's async wrappers that watch those modules. On the simulated fleet every one of them carries the node's state
directory in its environment, which is how these tests find them (and only them). The lease is long (10 minutes), so
nothing here stops by itself: what is gone was stopped.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from helpers.playbook_runner import ANSIBLE_PLAYBOOK, REPO, codes
from helpers.sim_processes import kill_tree, node_processes

LONG_LEASE = {"gpufleet_burn_duration_s": 6000, "gpufleet_lease_timeout_s": 600, "gpufleet_dcgm_enabled": False,
              "gpufleet_nccl_enabled": False}


def _env(tmp_path):
    return dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
                ANSIBLE_NOCOLOR="1", GPUFLEET_SIM_STATE_ROOT=str(tmp_path / "sim-state"))


def _start_burn(tmp_path):
    """A burn-in of sim-node01 in its own session (as from a terminal), returned once gpu_burn and the sampler run."""
    proc = subprocess.Popen([str(ANSIBLE_PLAYBOOK), "playbooks/burn_in.yml", "-l", "sim-node01,localhost", "-e",
                             json.dumps(dict(LONG_LEASE, gpufleet_report_dir=str(tmp_path / "reports")))],
                            cwd=REPO, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    state = tmp_path / "sim-state"
    deadline = time.monotonic() + 240
    running = []
    while time.monotonic() < deadline and proc.poll() is None:
        running = node_processes(state)
        if any("gpu_burn -m" in p for p in running) and any("async_wrapper" in p for p in running):
            return proc, running
        time.sleep(0.5)
    kill_tree(proc.pid)
    raise AssertionError("the burn never started: %s\n%s" % (running, proc.communicate()[0][-3000:]))


def test_abort_after_a_dead_controller_stops_every_process_of_the_run(tmp_path):
    proc, running = _start_burn(tmp_path)
    # The controller dies with its workers and their connections; the async jobs live on, as on real nodes.
    kill_tree(proc.pid)
    proc.wait()
    state = tmp_path / "sim-state"
    assert any("gpu_burn -m" in p for p in node_processes(state)), "nothing left over to stop"
    abort = subprocess.run([str(ANSIBLE_PLAYBOOK), "playbooks/abort.yml", "-l", "sim-node01"], cwd=REPO,
                           env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert abort.returncode == 0, abort.stdout[-3000:] + abort.stderr[-3000:]
    left = node_processes(state)
    # A poll the dead controller had just started (job_status) records nothing to stop: it ends by itself once it
    # sees that the process that started it is gone (it checks every second). Everything else must be gone now.
    assert [p for p in left if "AnsiballZ_job_status" not in p] == [], "still running after abort returned: %s" % left
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = node_processes(state)
    assert left == [], "a poll of the dead controller did not end by itself: %s" % left
    # It says what it stopped: the tool, the modules waiting for it and their async wrappers.
    said = " ".join(abort.stdout.split())  # the YAML callback folds long messages
    # Each async job is a module's group and its wrapper's, or one group when the module started before the wrapper
    # moved it into a group of its own (lease.async_job_groups): the wrapper is always named.
    # The burn's job is the only one (its nvidia-smi sampler is a thread of it).
    for what in ("tool gpu_burn", "async wrapper gpu_burn"):
        assert what in said, (what, said[-2000:])


def test_ctrl_c_stops_every_process_of_the_run_before_the_interrupted_report(tmp_path):
    proc, running = _start_burn(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches its foreground process group
    output, _ = proc.communicate(timeout=300)
    state = tmp_path / "sim-state"
    left = node_processes(state)
    report = json.loads((tmp_path / "reports" / "latest" / "report.json").read_text())
    said = [f for n in report["nodes"] for f in n["findings"] if f["code"] == "RUN_INTERRUPTED"]
    assert left == [], "still running when the interrupted run ended: %s\n%s\n%s" % (left, said, output[-3000:])
    assert report["interrupted"] is True
    node = report["nodes"][0]
    assert "RUN_INTERRUPTED" in codes(node)
    finding = next(f for f in node["findings"] if f["code"] == "RUN_INTERRUPTED")
    evidence = " ".join(finding["evidence"])
    assert "stopped on the node before this report" in evidence and "tool gpu_burn" in evidence, finding
    assert "by itself" not in finding["action"], finding
    assert "stopping its work on 1 node(s)" in output
    assert not Path(tmp_path / "reports" / ".gpufleet-run.lock").exists()
