"""The simulated checkpoint drive: checkpoint_storage's real write test on a simulated node reports the speed of the
scenario's drive, whatever this machine's disk and load do (the module runs as Ansible runs it, with the simulated
node's environment: the stand-ins on PATH, sim/site on PYTHONPATH)."""

import json
import subprocess
import sys

import pytest
import simlib
from helpers.module_runner import REPO, run_module

sys.path.insert(0, str(simlib.SIM))
from gpufleet_sim import drive  # noqa: E402


def write_test(sim, scenario, node="node"):
    env = sim.env(scenario, node=node)
    subprocess.run([str(simlib.BIN / "gpufleet-sim"), "init"], env=env, check=True, capture_output=True)
    state = sim.state(node)
    env["PYTHONPATH"] = "%s:%s" % (simlib.SIM / "site", REPO / "collections")
    return run_module("checkpoint_storage", {"path": str(state / "checkpoint"), "checkpoint_size_gb": 1.0,
                                             "write_test_mb": 8, "mounts_file": str(state / "mounts")}, env=env)


@pytest.fixture
def sim(tmp_path):
    return simlib.Sim(tmp_path)


def test_the_write_test_measures_the_scenarios_drive(sim, tmp_path):
    scenario = json.loads((simlib.SIM / "scenarios" / "healthy_h100.json").read_text())
    scenario.setdefault("storage", {})["checkpoint"] = {"write_mb_per_s": 150, "read_mb_per_s": 900}
    slow = tmp_path / "slow_drive.json"
    slow.write_text(json.dumps(scenario))
    r = write_test(sim, str(slow))
    wt = r["write_test"]
    assert wt["verified"] and wt["bytes"] == 8 * 10**6, r
    assert (wt["write_mb_per_s"], wt["read_mb_per_s"]) == (150.0, 900.0)
    assert r["estimated_checkpoint_s"] == pytest.approx(1e9 / 150e6, abs=0.01)
    assert list((sim.state() / "checkpoint").iterdir()) == []  # the real file was written, read back and removed
    healthy = write_test(sim, "healthy_h100", node="other")["write_test"]
    assert (healthy["write_mb_per_s"], healthy["read_mb_per_s"]) == (drive.DEFAULT_WRITE_MB_PER_S,
                                                                     drive.DEFAULT_READ_MB_PER_S)


def test_a_bad_speed_says_so_and_the_module_still_runs(sim, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"storage": {"checkpoint": {"write_mb_per_s": "fast"}}}))
    with pytest.raises(ValueError, match="storage.checkpoint.write_mb_per_s must be a number > 0"):
        drive.speeds(json.loads(bad.read_text()))
    env = dict(sim.env(str(bad)), PYTHONPATH=str(simlib.SIM / "site"))
    # Read at the first use of the drive: a process that never touches it (a stand-in) says nothing and costs nothing.
    proc = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True)
    assert proc.stdout == "ran\n" and proc.stderr == ""
    (sim.state() / "checkpoint").mkdir(parents=True, exist_ok=True)
    use = ("import os, time; fd = os.open(%r, os.O_CREAT | os.O_WRONLY); os.write(fd, b'x' * 1000); os.close(fd); "
           "print('ran', time.monotonic() > 0)" % str(sim.state() / "checkpoint" / "probe"))
    proc = subprocess.run([sys.executable, "-c", use], env=env, capture_output=True, text=True)
    assert proc.stdout == "ran True\n", proc.stderr
    assert proc.stderr.count("the simulated checkpoint drive is off: storage.checkpoint.write_mb_per_s") == 1


def test_the_clock_counts_drive_time_only_while_the_drive_is_used_and_never_goes_back(tmp_path):
    real = iter([100.0, 105.0, 130.0, 140.0]).__next__
    d = drive.Drive(str(tmp_path), write_mb_per_s=100, read_mb_per_s=200, real_clock=real)
    assert d.clock() == 100.0  # real rate outside a session
    d.opened(7)  # the session starts at real 105
    d.moved(7, 50 * drive.MB, d.write_s_per_byte)  # 0.5 s of the drive
    d.moved(8, 10**9, d.write_s_per_byte)  # another descriptor: not the drive
    d.closed(7)
    d.opened(9)  # reopened before anyone looked: the same session (a write test syncs the directory after the file)
    d.moved(9, 100 * drive.MB, d.read_s_per_byte)
    assert d.clock() == pytest.approx(106.0)  # no real time counts in a session, only the drive's
    d.closed(9)
    assert d.clock() == pytest.approx(106.0)  # the session's last look (real 130)
    assert d.clock() == pytest.approx(116.0)  # then the real rate from there (real 140)
    assert d.on_drive(str(tmp_path)) and d.on_drive(str(tmp_path / "x")) and not d.on_drive(str(tmp_path) + "x")
