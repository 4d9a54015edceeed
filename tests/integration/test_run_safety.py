"""What protects an operator's machines and runs: provisioning never touches the controller by accident, a --limit
without localhost stops at once, a second run into the same reports directory says why it cannot start, a run shows
progress instead of one retry line per poll, and `abort` stops what an interrupted run left on the nodes."""

import json
import os
import re
import subprocess
import sys
import time

import yaml
from helpers.playbook_runner import ANSIBLE_PLAYBOOK, REPO, run_playbook
from helpers.sim_processes import kill_tree, node_processes


def _env(tmp_path):
    return dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
                ANSIBLE_NOCOLOR="1", GPUFLEET_SIM_STATE_ROOT=str(tmp_path / "sim-state"))


def _playbook(tmp_path, *args, timeout=600):
    return subprocess.run([str(ANSIBLE_PLAYBOOK), *args], cwd=REPO, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=timeout)


def test_provisioning_refuses_the_simulated_fleet_and_the_controller(tmp_path):
    proc = _playbook(tmp_path, "playbooks/provision.yml", "--check")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "refusing to provision sim-node01: it is a simulated node" in out
    assert "Install the NVIDIA driver" not in out, "a role task ran on the controller"
    local = tmp_path / "local.yml"
    local.write_text(yaml.safe_dump({"gpufleet_nodes": {"hosts": {"ctl": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    proc = _playbook(tmp_path, "playbooks/provision.yml", "-i", str(local), "--check")
    assert proc.returncode != 0 and "this controller (connection local)" in proc.stdout


def test_a_limit_without_localhost_stops_at_once(tmp_path):
    started = time.monotonic()
    proc = _playbook(tmp_path, "playbooks/burn_in.yml", "-l", "sim-node01")
    assert proc.returncode != 0 and "--limit must include localhost" in proc.stdout
    assert time.monotonic() - started < 60
    assert not (tmp_path / "sim-state").exists(), "the node was touched"


def test_a_second_run_into_the_same_reports_directory_says_another_run_is_in_progress(tmp_path):
    reports = tmp_path / "reports"
    first = subprocess.Popen([str(ANSIBLE_PLAYBOOK), "playbooks/burn_in.yml", "-l", "sim-node01,localhost", "-e",
                              json.dumps({"gpufleet_report_dir": str(reports), "gpufleet_burn_duration_s": 3000})],
                             cwd=REPO, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for((reports / ".gpufleet-run.lock").exists, 120, "the first run's lock")
        second = _playbook(tmp_path, "playbooks/preflight.yml", "-l", "sim-node02,localhost", "-e",
                           json.dumps({"gpufleet_report_dir": str(reports)}))
        assert second.returncode != 0 and "another run is in progress" in second.stdout, second.stdout[-2000:]
    finally:
        first.terminate()
        first.wait(120)


def test_the_wait_shows_progress_not_a_retry_line_per_poll(tmp_path):
    rc, output, report = run_playbook("burn_in", tmp_path, extra={
        "gpufleet_burn_duration_s": 1500, "gpufleet_dcgm_enabled": False, "gpufleet_nccl_enabled": False},
        args=["-l", "sim-node01,localhost"])
    assert report is not None and report["nodes"][0]["checks"]["gpu_burn"]["verdict"] == "pass"
    assert "FAILED - RETRYING" not in output


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("%s not seen within %s s" % (what, timeout))


def test_abort_stops_what_an_interrupted_run_left(tmp_path):
    node = tmp_path / "sim-state" / "sim-node01"  # this test's node: its processes carry it in their environment
    run = subprocess.Popen([str(ANSIBLE_PLAYBOOK), "playbooks/burn_in.yml", "-l", "sim-node01,localhost", "-e",
                            json.dumps({"gpufleet_report_dir": str(tmp_path / "reports"),
                                        "gpufleet_burn_duration_s": 6007, "gpufleet_lease_timeout_s": 600})],
                           cwd=REPO, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any("sim/bin/gpu_burn -m 90% 6007" in p for p in node_processes(node)), 120,
                  "the burn on sim-node01")
    finally:
        kill_tree(run.pid)  # a controller that dies (workers too): no callback, no report play, a 10-minute lease
        run.wait()
    proc = _playbook(tmp_path, "playbooks/abort.yml", "-l", "sim-node01")
    assert proc.returncode == 0 and re.search(r"\d+ process group\(s\) stopped: tool gpu_burn", proc.stdout), \
        proc.stdout[-2000:]
    _wait_for(lambda: not any("sim/bin/gpu_burn" in p for p in node_processes(node)), 30, "no gpu_burn left")
