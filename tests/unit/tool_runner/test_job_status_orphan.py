"""job_status (the node half of job_wait's long poll) stops waiting, and refreshing the run's lease, once the process
that started it is gone: a dead controller's poll must not keep the lease alive for the rest of its wait."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
MODULE = REPO / "plugins" / "modules" / "job_status.py"


def test_an_orphaned_poll_stops_at_once(tmp_path):
    state, jobs = tmp_path / "state", tmp_path / "async"
    jobs.mkdir()
    (jobs / "j1").write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "j1"}))
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"jid": "j1", "_async_dir": str(jobs), "wait": 60,
                                                        "state_dir": str(state), "run_id": "run-1"}}))
    pid_file = tmp_path / "poll.pid"
    # The parent starts the poll, waits until it refreshes the lease, and dies: a controller killed mid-wait.
    lease = state / "runs" / "run-1" / "lease"
    starter = ("import os, subprocess, sys, time\n"
               "p = subprocess.Popen([sys.executable, %r, %r], stdout=subprocess.DEVNULL)\n"
               "open(%r, 'w').write(str(p.pid))\n"
               "while not os.path.exists(%r): time.sleep(0.05)\n" % (str(MODULE), str(args), str(pid_file), str(lease)))
    env = dict(os.environ, PYTHONPATH=str(REPO / "collections"))
    subprocess.run([sys.executable, "-c", starter], env=env, check=True, timeout=60)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.2)
    assert not _alive(pid), "the orphaned poll went on waiting (and refreshing the lease)"


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
