"""Leases (module_utils/lease.py) with real processes: a tool stops when the controller stops refreshing the run's
lease, and the next run stops only the process groups earlier runs recorded."""

import json
import os
import subprocess
import threading
import time

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import lease as lease_mod
from ansible_collections.kentino.gpufleet.plugins.module_utils.lease import (
    Lease,
    recorded_jobs,
    run_dir,
    stop_leftovers,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool
from helpers.module_runner import run_module


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture
def sleepers():
    """sleep(seconds) -> a real `sleep` in its own session (its pid is its process group); all reaped at the end."""
    procs = []

    def start(seconds=300):
        proc = subprocess.Popen(["sleep", str(seconds)], start_new_session=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:  # only the processes this test started, by their own id
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _age(lease, seconds):
    past = time.time() - seconds
    os.utime(lease.path, (past, past))


def test_touch_creates_the_run_layout_and_refreshes(tmp_path):
    lease = Lease(str(tmp_path), "run-1", 30)
    assert lease.expired(), "a lease never touched is expired: the controller never waited"
    lease.touch()
    assert os.path.isfile(tmp_path / "runs" / "run-1" / "lease") and os.path.isdir(tmp_path / "runs/run-1/jobs")
    assert not lease.expired() and lease.age_s() < 5
    _age(lease, 31)
    assert lease.expired() and "not refreshed for 31 s, limit 30 s" in lease.reason()
    lease.touch()
    assert not lease.expired(), "every poll of the controller refreshes it"
    os.unlink(lease.path)
    assert lease.expired() and "not refreshed for ever" in lease.reason()


def test_timeout_boundary(tmp_path):
    lease = Lease(str(tmp_path), "run-1", 30)
    lease.touch()
    _age(lease, 28)
    assert not lease.expired()
    _age(lease, 32)
    assert lease.expired()


@pytest.mark.parametrize("run_id", ["../etc", "a/b", "", ".hidden", "x" * 200, "run id"])
def test_unsafe_run_ids_are_refused(tmp_path, run_id):
    with pytest.raises(ValueError, match="not a safe name"):
        run_dir(str(tmp_path), run_id)


def test_record_writes_one_file_per_process_group(tmp_path):
    lease = Lease(str(tmp_path), "run-1", 30)
    lease.touch()
    path = lease.record(4242, ["gpu_burn", 60])
    assert json.loads(open(path).read())["argv"] == ["gpu_burn", "60"]
    assert [(j["run_id"], j["pgid"], j["alive"]) for j in recorded_jobs(str(tmp_path))] == [("run-1", 4242, False)]
    assert recorded_jobs(str(tmp_path), except_run_id="run-1") == []


def test_stop_leftovers_kills_only_the_groups_other_runs_recorded(tmp_path, sleepers):
    state = str(tmp_path)
    old, current, stranger = sleepers(), sleepers(), sleepers()
    old_lease = Lease(state, "run-old", 180)
    old_lease.touch()
    old_lease.record(old.pid, ["sleep", "300"])
    cur_lease = Lease(state, "run-now", 180)
    cur_lease.touch()
    cur_lease.record(current.pid, ["sleep", "300"])
    # `stranger` is someone else's process: never recorded, never touched
    stopped = stop_leftovers(state, keep=lambda run_id: run_id == "run-now", grace_s=2.0)
    assert stopped == [{"run_id": "run-old", "pgid": old.pid, "argv": ["sleep", "300"], "kind": "tool", "killed": True}]
    assert old.wait(timeout=10) == -15, "SIGTERM ended it within the grace period"
    assert current.poll() is None and stranger.poll() is None
    assert _alive(current.pid) and _alive(stranger.pid)
    assert not os.path.exists(tmp_path / "runs" / "run-old") and os.path.isdir(tmp_path / "runs" / "run-now")


def test_stop_leftovers_escalates_to_sigkill(tmp_path):
    # a tool that ignores SIGTERM (gpu_burn's workers do) is killed after the grace period
    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 1; done"], start_new_session=True)
    try:
        lease = Lease(str(tmp_path), "run-old", 180)
        lease.touch()
        lease.record(proc.pid, ["sh"])
        time.sleep(0.2)  # let the shell install its trap
        started = time.monotonic()
        assert stop_leftovers(str(tmp_path), grace_s=0.5)[0]["killed"] is True
        assert proc.wait(timeout=10) == -9 and time.monotonic() - started < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dry_run_and_gone_groups(tmp_path, sleepers):
    state = str(tmp_path)
    alive = sleepers()
    lease = Lease(state, "run-old", 180)
    lease.touch()
    lease.record(alive.pid, ["sleep", "300"])
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    lease.record(gone.pid, ["true"])
    (tmp_path / "runs" / "run-old" / "jobs" / "junk.json").write_text("{not json")
    planned = stop_leftovers(state, dry_run=True)
    assert sorted((j["pgid"], j["killed"]) for j in planned) == sorted([(alive.pid, True), (gone.pid, False)])
    assert alive.poll() is None and os.path.isdir(tmp_path / "runs" / "run-old"), "a dry run stops nothing"
    stopped = stop_leftovers(state, grace_s=2.0)
    assert sorted((j["pgid"], j["killed"]) for j in stopped) == sorted([(alive.pid, True), (gone.pid, False)])
    assert alive.wait(timeout=10) == -15
    assert stop_leftovers(state) == [] and stop_leftovers(str(tmp_path / "nothing-here")) == []


def test_run_tool_stops_the_tool_when_the_lease_expires(tmp_path):
    lease = Lease(str(tmp_path), "run-1", 2)
    lease.touch()  # the controller polled once, then went quiet (Ctrl-C, a dead controller)
    started = time.monotonic()
    result = run_tool(["sleep", "30"], 60, lease=lease)
    elapsed = time.monotonic() - started
    assert elapsed < 8, elapsed
    assert result.error and "lease" in result.error and "controller stopped waiting" in result.error
    assert not result.timed_out and result.rc == -15
    (job,) = recorded_jobs(str(tmp_path))
    assert job["argv"] == ["sleep", "30"] and job["alive"] is False, "recorded, and its group is gone"


def test_run_tool_runs_to_the_end_while_the_lease_is_refreshed(tmp_path):
    lease = Lease(str(tmp_path), "run-1", 2)
    lease.touch()
    stop = threading.Event()

    def controller():
        while not stop.wait(0.5):
            lease.touch()

    poller = threading.Thread(target=controller, daemon=True)
    poller.start()
    try:
        result = run_tool(["sh", "-c", "sleep 4; echo finished"], 60, lease=lease)
    finally:
        stop.set()
        poller.join()
    assert result.error is None and result.rc == 0 and result.stdout == "finished\n"


def test_the_timeout_still_applies_under_a_lease(tmp_path):
    lease = Lease(str(tmp_path), "run-1", 600)
    lease.touch()
    result = run_tool(["sleep", "30"], 1, lease=lease, grace_s=1.0)
    assert result.timed_out and result.error is None


def test_a_reused_group_number_is_never_killed(tmp_path, sleepers):
    # The recorded leader ended long ago and the kernel gave its number to a new session: not ours.
    reused = sleepers()
    lease = Lease(str(tmp_path), "run-old", 180)
    lease.touch()
    path = lease.record(reused.pid, ["gpu_burn", "600"])
    job = json.loads(open(path).read())
    assert job["leader_start"] == lease_mod._start_time(reused.pid) is not None
    job["leader_start"] -= 1000
    with open(path, "w") as fh:
        json.dump(job, fh)
    assert recorded_jobs(str(tmp_path))[0]["alive"] is False
    assert stop_leftovers(str(tmp_path), grace_s=1.0)[0]["killed"] is False
    assert reused.poll() is None and _alive(reused.pid)


def test_check_module_records_its_tool_under_the_run(tmp_path):
    # gpu_burn with the lease options: the tool's process group is recorded under runs/<run_id>/jobs, so that
    # kentino.gpufleet.run_cleanup can stop it if the run is interrupted.
    tool = tmp_path / "gpu_burn"
    tool.write_text("#!/bin/sh\necho 'Burning for 1 seconds.'\n")
    tool.chmod(0o755)
    state = tmp_path / "state"
    result = run_module("gpu_burn", {"executable": str(tool), "duration": 1, "state_dir": str(state),
                                     "run_id": "run-7", "lease_timeout": 60}, env={"PATH": "/usr/bin:/bin"})
    assert result["tool"]["rc"] == 0 and result["tool"]["error"] is None
    (job,) = recorded_jobs(str(state))
    assert job["run_id"] == "run-7" and job["argv"] == [str(tool), "1"] and job["alive"] is False
    assert os.path.isfile(state / "runs" / "run-7" / "lease")
    refused = run_module("gpu_burn", {"executable": str(tool), "run_id": "run-7"})
    assert refused.get("failed") and "run_id needs state_dir" in refused["msg"]
    refused = run_module("gpu_burn", {"executable": str(tool), "state_dir": str(state), "run_id": "../x"})
    assert refused.get("failed") and "not a safe name" in refused["msg"]
