"""job_status (the node half of job_wait's long poll) stops waiting, and refreshing the run's lease, once what started
it is gone: its parent, or what started the shell the connection runs it in (sshd's session on a node, the worker of
a local connection). A dead controller's poll must not keep the lease alive for the rest of its wait."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
MODULE = REPO / "plugins" / "modules" / "job_status.py"


def _polls(args):
    """pids of the job_status processes reading this test's args file."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                argv = fh.read().split(b"\0")
            with open("/proc/%s/stat" % pid) as fh:
                running = fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            continue
        if running and str(MODULE).encode() in argv and str(args).encode() in argv:
            found.append(int(pid))
    return found


@pytest.mark.parametrize("through_shell", [False, True], ids=["its-parent-dies", "its-shells-parent-dies"])
def test_an_orphaned_poll_stops_at_once(tmp_path, through_shell):
    state, jobs = tmp_path / "state", tmp_path / "async"
    jobs.mkdir()
    (jobs / "j1").write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "j1"}))
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"jid": "j1", "_async_dir": str(jobs), "wait": 60,
                                                        "state_dir": str(state), "run_id": "run-1"}}))
    poll = [sys.executable, str(MODULE), str(args)]
    if through_shell:  # as a connection runs a module: a shell that waits for it
        poll = ["sh", "-c", '"$@"; true', "sh"] + poll
    # The "controller" starts the poll, waits until it has refreshed the lease, and dies.
    lease = state / "runs" / "run-1" / "lease"
    controller = ("import os, subprocess, sys, time\n"
                  "subprocess.Popen(%r, stdout=subprocess.DEVNULL)\n"
                  "while not os.path.exists(%r): time.sleep(0.05)\n" % (poll, str(lease)))
    env = dict(os.environ, PYTHONPATH=str(REPO / "collections"))
    subprocess.run([sys.executable, "-c", controller], env=env, check=True, timeout=60)
    assert _polls(args), "the poll is not running"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _polls(args):
        time.sleep(0.2)
    assert not _polls(args), "the orphaned poll went on waiting (and refreshing the lease)"


def _poll_once(tmp_path, jid):
    """One job_status poll (2 s) of `jid` in an empty async directory: its JSON answer."""
    jobs = tmp_path / "async"
    jobs.mkdir(exist_ok=True)
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"jid": jid, "_async_dir": str(jobs), "wait": 2}}))
    env = dict(os.environ, PYTHONPATH=str(REPO / "collections"))
    done = subprocess.run([sys.executable, str(MODULE), str(args)], env=env, capture_output=True, text=True,
                          timeout=60)
    return json.loads(done.stdout)


def test_a_job_whose_wrapper_has_not_written_its_status_yet_is_starting(tmp_path):
    """Ansible's async wrapper answers "started" after 2.5 s at most, written or not: on a loaded node the first
    poll can come first. While a wrapper process of the job runs, a missing status file is a job still starting."""
    wrapper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "async_wrapper", "j4242",
                                "600", "/tmp/module", "/tmp/args", "_"])
    try:
        answer = _poll_once(tmp_path, "j4242.%d" % wrapper.pid)
    finally:
        wrapper.kill()
        wrapper.wait()
    assert not answer.get("failed") and answer["finished"] is False, answer


def test_a_job_with_no_status_file_and_no_wrapper_is_lost(tmp_path):
    answer = _poll_once(tmp_path, "j4343.1")
    assert answer.get("failed") and "not found" in answer["msg"], answer
