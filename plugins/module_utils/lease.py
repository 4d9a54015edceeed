# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Leases: node-side work stops by itself when the controller stops waiting for it (stdlib only).

A long check (gpu_burn, the sampler, dcgmi diag, NCCL) runs as an async job. The controller's wait
(kentino.gpufleet.job_wait) refreshes the run's lease file on every poll; the job checks its age and, when the
controller has gone quiet for longer than the lease timeout (Ctrl-C, a dead controller, a lost network), kills its
tool's process group and ends with an error saying so. Every tool process group a run starts is recorded under the
run's directory, and so is every async job of the run (the module's process group and the group of Ansible's
async_wrapper that watches it), so the next run, `gpufleet abort` or an interrupted run's report can stop all of it.

Layout under the node's state directory:  runs/<run_id>/lease   runs/<run_id>/jobs/<pgid>.json
A job record: {pgid, argv, started, leader_start, kind: tool | module | async_wrapper}; a wrapper's also module_pgid
and the watcher process it was recorded with (member, member_start).
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

    def record(self, pgid, argv, kind="tool", **extra):
        path = os.path.join(self.jobs, "%d.json" % pgid)
        tmp = path + ".tmp"
        job = {"pgid": pgid, "argv": [str(a) for a in argv], "started": time.time(), "leader_start": _start_time(pgid),
               "kind": kind}
        job.update(extra)
        with open(tmp, "w") as fh:
            json.dump(job, fh)
        os.rename(tmp, path)
        return path

    def record_async_job(self, module_name):
        """Record the async job this module runs in (nothing when it runs as a plain task): its own process group,
        then the async_wrapper's, so that stopping the run stops the module and the wrapper, not only its tools."""
        groups = async_job_groups()
        recorded = []
        for kind, pgid, member in groups:
            extra = {}
            if member is not None:
                extra.update(member=member, member_start=_start_time(member))
            if kind == "async_wrapper" and groups[0][0] == "module":
                extra["module_pgid"] = groups[0][1]
            elif kind == "async_wrapper":
                # The module started before the watcher moved its parent (the process that waits for it and writes
                # its result) into a group of its own, numbered by that process: stopping the job stops it there.
                runner = os.getppid()
                extra.update(runner=runner, runner_start=_start_time(runner))
            recorded.append(self.record(pgid, [module_name.rsplit(".", 1)[-1]], kind=kind, **extra))
        return recorded


def _stat_fields(pid):
    """The fields of /proc/<pid>/stat after the command name (state first), or None when the process is gone."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _proc_stat(pid):
    """(ppid, pgid, session) of a process from /proc/<pid>/stat, or None when it is gone."""
    fields = _stat_fields(pid)
    try:
        return int(fields[1]), int(fields[2]), int(fields[3])
    except (TypeError, IndexError, ValueError):
        return None


def _is_async_wrapper(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return b"async_wrapper" in fh.read()
    except OSError:
        return False


def async_job_starting(jid):
    """True while a process of Ansible's async wrapper for job `jid` (`<argv jid>.<wrapper pid>`) runs. The wrapper
    answers "started" after 2.5 s at most, whether or not its daemonized child has written the job's status file yet:
    on a loaded node the first poll can come before the file, and the job is starting, not lost."""
    wanted = jid.rsplit(".", 1)[0].encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if wanted in argv and any(b"async_wrapper" in arg for arg in argv):
            return True
    return False


def async_job_groups(pid=None):
    """[("module", pgid, None), ("async_wrapper", pgid, watcher pid)] of the async job running process `pid`.

    Ansible's async_wrapper daemonizes into a session of its own, where its watcher forks one process per job into a
    new process group (which runs the module) and waits for it, polling every few seconds. Both groups are recorded
    only when the watcher is an async_wrapper leading that session's group and the job's process is in the same
    session: a plain task (its group is the connection's, or on the simulated fleet the controller's) records none.
    """
    pid = pid or os.getpid()
    own = _proc_stat(pid)
    runner = _proc_stat(own[0]) if own else None
    if not runner or not _is_async_wrapper(own[0]) or not _is_async_wrapper(runner[0]):
        return []
    watcher = _proc_stat(runner[0])
    if not watcher or watcher[1] != watcher[2] or runner[2] != watcher[2] or own[2] != watcher[2]:
        return []
    # The watcher's group has no leader (the process that made the session exited): the watcher identifies it.
    wrapper = ("async_wrapper", watcher[1], runner[0])
    if own[1] == watcher[1]:  # the job's group not yet split from the watcher's: one group holds both
        return [wrapper]
    return [("module", own[1], None), wrapper]


def _start_time(pid):
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22), or None when it is gone."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19])
    except (TypeError, IndexError, ValueError):
        return None


def _ours(job):
    """False when the group's number now belongs to another process (the recorded leader ended and the kernel
    reused its pid for a new session): only what a run started is ever stopped. A leader that is gone while its group
    lives on is ours: the kernel does not hand out the id of a group that still exists. A group recorded without its
    leader (an async wrapper's) is ours while the member recorded with it is still that process in that group."""
    if job.get("member") is not None:
        stat = _proc_stat(int(job["member"]))
        return bool(stat) and stat[1] == job["pgid"] and _start_time(int(job["member"])) == job.get("member_start")
    now = _start_time(job["pgid"])
    return now is None or job.get("leader_start") is None or now == job["leader_start"]


def _group_alive(pgid):
    """True while a process of the group runs. A group of zombies only is not alive: an async job's process stays a
    zombie until its wrapper's next poll (up to 5 s) reaps it, and waiting for that would cost every run's end."""
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    return bool(_group_pids(pgid))


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
            entry = {"run_id": run_id, "pgid": pgid, "argv": job.get("argv"), "leader_start": job.get("leader_start"),
                     "kind": job.get("kind") or "tool", "module_pgid": job.get("module_pgid"),
                     "member": job.get("member"), "member_start": job.get("member_start"),
                     "runner": job.get("runner"), "runner_start": job.get("runner_start")}
            entry["alive"] = _group_alive(pgid) and _ours(entry)
            out.append(entry)
    return out


# The order groups are stopped in: a tool before the module that waits for it, the module before its wrapper.
STOP_ORDER = {"tool": 0, "module": 1, "async_wrapper": 2}
# How long a wrapper whose module was stopped gets to notice it and end by itself (it polls every 5 s, then removes
# the job's temporary files); after that it is killed too.
WRAPPER_WAIT_S = 8.0


def stop_leftovers(state_dir, keep=lambda run_id: False, dry_run=False, grace_s=5.0, wrapper_wait_s=WRAPPER_WAIT_S):
    """Stop the process groups recorded by every run for which keep(run_id) is false and remove those runs'
    directories: tools first, then the modules waiting for them, then the async wrappers of the modules it stopped
    (given wrapper_wait_s to end by themselves, then killed). Returns [{run_id, pgid, argv, kind, killed}]: killed
    when the group was running and was stopped (the wrapper of a module that ended on its own is left to end). Process groups are only ever ours: recorded when the run started
    them; a recorded group that is already gone is just forgotten."""
    root = os.path.join(state_dir, "runs")
    out = []
    try:
        runs = sorted(os.listdir(root))
    except OSError:
        return out
    stopped_modules = set()
    for run_id in runs:
        if keep(run_id):
            continue
        jobs = sorted((j for j in recorded_jobs(state_dir) if j["run_id"] == run_id),
                      key=lambda j: STOP_ORDER.get(j["kind"], 0))
        for job in jobs:
            stop = job["alive"]
            if stop and job["kind"] == "async_wrapper" and job["module_pgid"] is not None:
                # A wrapper ends by itself a few seconds after its module (and removes the job's temporary files):
                # one whose module ended on its own is left to it; one whose module was stopped here gets that
                # time, then is killed.
                stop = job["module_pgid"] in stopped_modules
                if stop and not dry_run:
                    _wait_gone(job["pgid"], wrapper_wait_s)
            elif stop and job["kind"] == "async_wrapper" and job["member"] is not None:
                # The module ran in the wrapper's own group (it recorded itself before the watcher moved it): when
                # only the watcher is left there, the module ended on its own, and the watcher ends by itself too.
                stop = bool(_group_pids(job["pgid"]) - {int(job["member"])})
            if stop and not dry_run:
                _kill(job["pgid"], grace_s)
                _kill_runner(job, grace_s)
            if stop and job["kind"] == "module":
                stopped_modules.add(job["pgid"])
            out.append({"run_id": run_id, "pgid": job["pgid"], "argv": job["argv"], "kind": job["kind"],
                        "killed": stop})
        if not dry_run:
            _rmtree(os.path.join(root, run_id))
    return out


def stop_other_runs(state_dir, run_id, dry_run=False):
    """A run's first step: stop_leftovers for every run but run_id (run_cleanup's run_id, health_snapshot's
    stop_leftovers)."""
    return stop_leftovers(state_dir, keep=lambda rid: rid == run_id, dry_run=dry_run)


def describe_stopped(stopped):
    """What stop_leftovers stopped, in one line for the operator: each group's kind, command and number."""
    killed = [s for s in stopped if s.get("killed")]
    if not killed:
        return "nothing recorded was still running"
    return "%d process group(s) stopped: %s" % (len(killed), ", ".join(
        "%s %s [%s]" % ((s.get("kind") or "tool").replace("_", " "), os.path.basename(str((s.get("argv") or ["?"])[0])),
                        s.get("pgid")) for s in killed))


def _kill_runner(job, grace_s):
    """The group of a shared-group job's runner (recorded with the wrapper), when it is still that runner's."""
    runner = job.get("runner")
    if isinstance(runner, int) and runner > 1 and job.get("runner_start") is not None \
            and _start_time(runner) == job["runner_start"] and _group_alive(runner):
        _kill(runner, grace_s)


def _group_pids(pgid):
    """The pids of the live processes (not zombies) in process group pgid, from /proc."""
    pids = set()
    for name in os.listdir("/proc"):
        fields = _stat_fields(int(name)) if name.isdigit() else None
        if fields and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            pids.add(int(name))
    return pids


def _wait_gone(pgid, wait_s):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.1)


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
