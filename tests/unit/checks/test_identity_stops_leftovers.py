"""health_snapshot's stop_leftovers: a burn-in's or preflight's first step, in the identity's round trip. What an
interrupted run left running is stopped before the GPU table is read; the current run's state is kept; a stop that
cannot be made fails the task with leftovers.failed (the stage's rescue then stops the node)."""

import importlib
import json
import subprocess
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.lease import Lease
from helpers.module_runner import run_module

REPO = Path(__file__).resolve().parents[3]
SIM_BIN = REPO / "sim" / "bin"


def identity(tmp_path, **extra):
    state = tmp_path / "node"
    env = {"GPUFLEET_SIM_SCENARIO": str(REPO / "sim" / "scenarios" / "healthy_h100.json"),
           "GPUFLEET_SIM_STATE": str(state), "GPUFLEET_SIM_NODE": "sim-node01", "GPUFLEET_SIM_TIME_SCALE": "0.001"}
    args = {"mode": "identity", "gpu_table": True, "dmi_dir": str(tmp_path / "dmi")}
    args.update(extra)
    return run_module("health_snapshot", args, env=env, path_prepend=[SIM_BIN])


def test_an_interrupted_runs_tool_is_stopped_before_the_gpu_table_is_read(tmp_path):
    states = tmp_path / "state"
    leftover = subprocess.Popen(["sleep", "600"], process_group=0)
    try:
        old = Lease(str(states), "old-run", 600)
        old.touch()
        old.record(leftover.pid, ["gpu_burn", "-m", "90%", "6000"])
        Lease(str(states), "this-run", 600).touch()
        result = identity(tmp_path, stop_leftovers={"state_dir": str(states), "run_id": "this-run"})
        assert not result.get("failed"), result.get("msg")
        assert leftover.wait(10) == -15
        stopped = result["leftovers"]["stopped"]
        assert [(s["run_id"], s["kind"], s["killed"]) for s in stopped] == [("old-run", "tool", True)]
        assert "gpu_burn" in result["leftovers"]["msg"]
        assert "stopped what earlier runs left running" in json.dumps(result.get("warnings", []))
        assert not (states / "runs" / "old-run").exists() and (states / "runs" / "this-run").exists()
        assert result["ansible_facts"]["gpufleet_gpu_count"] == 8  # the identity read after the stop
    finally:
        if leftover.poll() is None:
            leftover.kill()


def test_nothing_left_over_is_said_and_no_warning(tmp_path):
    result = identity(tmp_path, stop_leftovers={"state_dir": str(tmp_path / "state"), "run_id": "this-run"})
    assert result["leftovers"] == {"stopped": [], "msg": "nothing recorded was still running"}
    assert "earlier runs" not in json.dumps(result.get("warnings", []))


def test_without_the_option_nothing_is_stopped_and_an_audit_refuses_it(tmp_path):
    assert "leftovers" not in identity(tmp_path)
    refused = identity(tmp_path, mode="audit", gpu_table=False,
                       stop_leftovers={"state_dir": str(tmp_path / "state"), "run_id": "this-run"})
    assert refused.get("failed") and "needs mode identity" in refused["msg"]
    bad = identity(tmp_path, stop_leftovers={"state_dir": str(tmp_path / "state"), "run_id": "../x"})
    assert bad.get("failed") and "not a run id" in bad["msg"]


class Failed(Exception):
    pass


class FakeModule:
    check_mode = False

    def fail_json(self, **result):
        raise Failed(result)

    def warn(self, _text):
        pass


def test_a_stop_that_cannot_be_made_fails_the_task_with_leftovers_failed(monkeypatch, tmp_path):
    mod = importlib.import_module("ansible_collections.kentino.gpufleet.plugins.modules.health_snapshot")

    def broken(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "runs" / "old-run"))

    monkeypatch.setattr(mod, "stop_other_runs", broken)
    with pytest.raises(Failed) as failed:
        mod._stop_leftovers(FakeModule(), {"state_dir": str(tmp_path), "run_id": "this-run"})
    result = failed.value.args[0]
    assert result["leftovers"]["failed"] is True and "Permission denied" in result["msg"]
    assert "gpufleet abort" in result["msg"]  # the fix


def test_a_finished_runs_state_is_removed_without_a_warning(tmp_path):
    """A burn-in leaves its lease and job records; the next run's first step removes them and says nothing ran."""
    states = tmp_path / "state"
    gone = subprocess.Popen(["true"], process_group=0)
    gone.wait(10)
    finished = Lease(str(states), "finished-run", 600)
    finished.touch()
    finished.record(gone.pid, ["all_reduce_perf", "-b", "8"])
    result = identity(tmp_path, stop_leftovers={"state_dir": str(states), "run_id": "this-run"})
    assert [s["killed"] for s in result["leftovers"]["stopped"]] == [False]
    assert result["leftovers"]["msg"] == "nothing recorded was still running"
    assert "earlier runs" not in json.dumps(result.get("warnings", []))
    assert not (states / "runs" / "finished-run").exists()
