"""Stopping a run stops its async jobs, not only their tools: the module's process group and Ansible's async_wrapper
that watches it (module_utils/lease.py). Run under ansible-core's real async_wrapper, started as Ansible starts it."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import ansible.modules
import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.lease import (
    Lease,
    _start_time,
    async_job_groups,
    stop_leftovers,
)

REPO = Path(__file__).resolve().parents[3]
ASYNC_WRAPPER = Path(ansible.modules.__file__).parent / "async_wrapper.py"


def _tree(root_sid):
    """pids of every process in the session `root_sid`."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == root_sid and fields[0] not in ("Z", "X"):
                pids.append(int(name))
    return pids


def _wait_for(path, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return json.loads(path.read_text())
        time.sleep(0.05)
    raise AssertionError("%s never appeared" % path)


def _wrapper_args(probe):
    """async_wrapper's arguments as the installed ansible-core's async action passes them: 2.18 on, <jid> <limit>
    <preserve tmp> <module> <argv...>; 2.17, <jid> <limit> <module> <args file> (the module run by its shebang)."""
    if "invocation_args" in ASYNC_WRAPPER.read_text():
        return ["j1", "600", "true", str(probe), sys.executable, str(probe)]
    probe.write_text("#!%s\n%s" % (sys.executable, probe.read_text()))
    probe.chmod(0o755)
    return ["j1", "600", str(probe), "_"]


def test_a_plain_task_records_no_group():
    assert async_job_groups() == []  # pytest is not under an async_wrapper: its group is nobody's to stop


def test_stopping_a_run_stops_its_async_modules_and_their_wrappers(tmp_path):
    state = tmp_path / "state"
    probe = tmp_path / "module.py"
    out = tmp_path / "groups.json"
    # The "module": what open_lease does in a check module (record the async job), then a long wait like a sampler.
    probe.write_text(textwrap.dedent("""
        import json, sys, time
        sys.path.insert(0, %r)
        from ansible_collections.kentino.gpufleet.plugins.module_utils.lease import Lease, async_job_groups
        lease = Lease(%r, "run-1", 180)
        lease.touch()
        lease.record_async_job("gpu_sample")
        with open(%r, "w") as fh:
            json.dump({"groups": async_job_groups(), "sid": __import__("os").getsid(0)}, fh)
        time.sleep(600)
    """ % (str(REPO / "collections"), str(state), str(out))))
    env = dict(os.environ, ANSIBLE_ASYNC_DIR=str(tmp_path / "async"))
    # As the async action runs it, from the task's temporary directory (ansible/modules/ on sys.path would shadow the
    # standard library): <python> AnsiballZ_async_wrapper.py <jid> <time limit> <preserve tmp> <module> <argv...>
    wrapper = tmp_path / "AnsiballZ_async_wrapper.py"
    shutil.copyfile(ASYNC_WRAPPER, wrapper)
    subprocess.run([sys.executable, str(wrapper)] + _wrapper_args(probe), env=env, check=True, timeout=60,
                   capture_output=True)
    seen = _wait_for(out)
    kinds = [g[0] for g in seen["groups"]]
    # Two groups, or one when the module started before the watcher moved the job into a group of its own.
    assert kinds in (["module", "async_wrapper"], ["async_wrapper"]), seen
    assert _tree(seen["sid"]), "the async job runs"

    started = time.monotonic()
    stopped = stop_leftovers(str(state), grace_s=2.0)
    assert {(s["kind"], s["killed"]) for s in stopped} == {(k, True) for k in kinds}, stopped
    assert all(s["argv"] == ["gpu_sample"] for s in stopped)
    assert _tree(seen["sid"]) == [], "a process of the async job outlived the stop"
    assert time.monotonic() - started < 15
    assert not (state / "runs" / "run-1").exists()


def test_a_module_that_started_before_its_runner_was_moved_is_stopped_with_the_runner(tmp_path):
    # The race of the test above, laid out for certain: the watcher and the module in the wrapper's group, the runner
    # (the module's parent, which waits for it and writes its result) already in a group of its own, as async_wrapper's
    # setpgid(runner, runner) leaves them when the module started first. The module records the runner's group
    # (Lease.record_async_job); stopping the run stops all three.
    watcher = subprocess.Popen(["sleep", "600"], process_group=0)
    module = subprocess.Popen(["sleep", "600"], process_group=watcher.pid)
    runner = subprocess.Popen(["sleep", "600"], process_group=0)
    procs = (watcher, module, runner)
    try:
        lease = Lease(str(tmp_path / "state"), "run-1", 180)
        lease.touch()
        lease.record(watcher.pid, ["gpu_sample"], kind="async_wrapper", member=watcher.pid,
                     member_start=_start_time(watcher.pid), runner=runner.pid, runner_start=_start_time(runner.pid))
        stopped = stop_leftovers(str(tmp_path / "state"), grace_s=2.0)
        assert [(s["kind"], s["killed"]) for s in stopped] == [("async_wrapper", True)], stopped
        assert [p.wait(5) for p in procs] == [-15, -15, -15]  # SIGTERM, each of them
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("module_pgid", [2 ** 22 + 7, None], ids=["own-group", "shared-group"])
def test_the_wrapper_of_a_module_that_ended_on_its_own_is_left_to_end(tmp_path, module_pgid):
    # A finished run's cleanup: the module is done, its wrapper is in its last poll; nothing is killed or waited for.
    # shared-group: the module recorded itself before the watcher moved the job into a group of its own (one record,
    # the wrapper's, without module_pgid); only the watcher is left in that group.
    state = tmp_path / "state"
    lease = Lease(str(state), "run-2", 180)
    lease.touch()
    watcher = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        extra = {"module_pgid": module_pgid} if module_pgid is not None else {}
        lease.record(watcher.pid, ["nccl_test"], kind="async_wrapper", member=watcher.pid,
                     member_start=_start(watcher.pid), **extra)
        started = time.monotonic()
        stopped = stop_leftovers(str(state), grace_s=1.0)
        assert stopped == [{"run_id": "run-2", "pgid": watcher.pid, "argv": ["nccl_test"], "kind": "async_wrapper",
                            "killed": False}]
        assert watcher.poll() is None and time.monotonic() - started < 2
    finally:
        watcher.kill()
        watcher.wait()


def _start(pid):
    with open("/proc/%d/stat" % pid) as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[19])


def test_a_module_still_running_in_its_wrappers_group_is_stopped_with_it(tmp_path):
    # The shared-group record as above, but the module still runs beside the watcher (the leader): the group is stopped.
    state = tmp_path / "state"
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!; exec sleep 30"], start_new_session=True,
                              stdout=subprocess.PIPE, text=True)
    module = int(leader.stdout.readline())
    try:
        lease = Lease(str(state), "run-4", 180)
        lease.touch()
        lease.record(leader.pid, ["nccl_test"], kind="async_wrapper", member=leader.pid,
                     member_start=_start(leader.pid))
        stopped = stop_leftovers(str(state), grace_s=1.0)
        assert [s["killed"] for s in stopped] == [True]
        assert leader.wait(timeout=10) is not None and _gone(module)
    finally:
        leader.kill()
        leader.wait()


def _gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True
