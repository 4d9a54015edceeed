# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Leases: node-side work stops by itself when the controller stops waiting for it (stdlib only).

A long check (gpu_burn, the sampler, dcgmi diag, NCCL) runs as an async job. The controller's wait
(kentino.gpufleet.job_wait) refreshes the run's lease file on every poll; the job checks its age and, when the
controller has gone quiet for longer than the lease timeout (Ctrl-C, a dead controller, a lost network), kills its
tool's process group and ends with an error saying so. Every tool process group a run starts is recorded under the
run's directory, so the next run (or `gpufleet abort`) can recognise and stop what an interrupted run left behind.

Layout under the node's state directory:  runs/<run_id>/lease   runs/<run_id>/jobs/<pgid>.json
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import signal
import time

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def run_dir(state_dir, run_id):
    if not RUN_ID_RE.match(str(run_id)):
        raise ValueError("run id %r is not a safe name (letters, digits, . _ -)" % (run_id,))
    return os.path.join(state_dir, "runs", str(run_id))


class Lease:
    def __init__(self, state_dir, run_id, timeout_s):
        self.dir = run_dir(state_dir, run_id)
        self.path = os.path.join(self.dir, "lease")
        self.jobs = os.path.join(self.dir, "jobs")
        self.timeout_s = float(timeout_s)

    def touch(self):
        # exist_ok: the jobs of one run (the burn, a wait) touch it at the same moment.
        os.makedirs(self.jobs, 0o700, exist_ok=True)
        with open(self.path, "a"):
            pass
        os.utime(self.path, None)

    def age_s(self):
        try:
            return time.time() - os.stat(self.path).st_mtime
        except OSError:
            return None

    def expired(self):
        """True when the controller has not refreshed the lease for longer than the timeout (or it was removed)."""
        age = self.age_s()
        return age is None or age > self.timeout_s

    def reason(self):
        age = self.age_s()
        return ("the controller stopped waiting (lease %s not refreshed for %s s, limit %.0f s): the run was "
                "interrupted, so the tool was stopped" % (self.path, "ever" if age is None else "%.0f" % age,
                                                         self.timeout_s))

    def record(self, pgid, argv):
        path = os.path.join(self.jobs, "%d.json" % pgid)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"pgid": pgid, "argv": [str(a) for a in argv], "started": time.time(),
                       "leader_start": _start_time(pgid)}, fh)
        os.rename(tmp, path)
        return path


def _start_time(pid):
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22), or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _ours(job):
    """False when the group's number now belongs to another process (the recorded leader ended and the kernel
    reused its pid for a new session): only what a run started is ever stopped. A leader that is gone while its group
    lives on is ours: the kernel does not hand out the id of a group that still exists."""
    now = _start_time(job["pgid"])
    return now is None or job.get("leader_start") is None or now == job["leader_start"]


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def recorded_jobs(state_dir, except_run_id=None):
    """[{run_id, pgid, argv, leader_start, alive}] of the process groups runs recorded (other than except_run_id);
    alive only when the group still runs AND is still the one recorded."""
    root = os.path.join(state_dir, "runs")
    out = []
    try:
        runs = sorted(os.listdir(root))
    except OSError:
        return out
    for run_id in runs:
        if run_id == except_run_id:
            continue
        jobs = os.path.join(root, run_id, "jobs")
        for name in sorted(os.listdir(jobs)) if os.path.isdir(jobs) else []:
            try:
                with open(os.path.join(jobs, name)) as fh:
                    job = json.load(fh)
                pgid = int(job["pgid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            entry = {"run_id": run_id, "pgid": pgid, "argv": job.get("argv"), "leader_start": job.get("leader_start")}
            entry["alive"] = _group_alive(pgid) and _ours(entry)
            out.append(entry)
    return out


def stop_leftovers(state_dir, keep=lambda run_id: False, dry_run=False, grace_s=5.0):
    """Kill the process groups recorded by every run for which keep(run_id) is false and remove those runs'
    directories. Returns [{run_id, pgid, argv, killed}]. Process groups are only ever ours: they were recorded when
    the tool was started in its own session; a recorded group that is already gone is just forgotten."""
    root = os.path.join(state_dir, "runs")
    out = []
    try:
        runs = sorted(os.listdir(root))
    except OSError:
        return out
    for run_id in runs:
        if keep(run_id):
            continue
        for job in recorded_jobs(state_dir):
            if job["run_id"] != run_id:
                continue
            if job["alive"] and not dry_run:
                _kill(job["pgid"], grace_s)
            out.append({"run_id": run_id, "pgid": job["pgid"], "argv": job["argv"], "killed": job["alive"]})
        if not dry_run:
            _rmtree(os.path.join(root, run_id))
    return out


def _kill(pgid, grace_s):
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pgid, sig)
        except OSError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _group_alive(pgid):
                return
            time.sleep(0.1)


def _rmtree(path):
    for base, dirs, files in os.walk(path, topdown=False):
        for name in files:
            try:
                os.unlink(os.path.join(base, name))
            except OSError:
                pass
        for name in dirs:
            try:
                os.rmdir(os.path.join(base, name))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass
