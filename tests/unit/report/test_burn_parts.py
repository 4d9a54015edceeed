"""The burn's job result carries its samples and InfiniBand ports (one result registered as gpufleet_result_gpu_burn):
the report judges each as a check of its own, exactly as when they were registered apart, and a part the job did not
return is a skipped check with the burn's reason, never a pass."""

import copy
import json
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "report"
BURN = json.loads((FIXTURES / "sim_burn_in.json").read_text())["hosts"]
# What ib_ports returns on a node without InfiniBand (the recorded burn-in predates the ports' check).
NO_IB = {"baseline": {}, "evidence": [], "not_run": "no InfiniBand on this node: /sys/class/infiniband: No such file "
         "or directory", "ports": [], "problems": [{"kind": "no_infiniband", "line": "/sys/class/infiniband",
         "message": "/sys/class/infiniband: No such file or directory"}], "reasons": ["no InfiniBand on this node: "
         "/sys/class/infiniband: No such file or directory"], "root": "/sys/class/infiniband", "verdict": "skipped"}


def apart(name):
    """The node's results as registered apart (before the burn's job carried them)."""
    hv = copy.deepcopy(BURN[name])
    hv.setdefault("gpufleet_result_ib_ports", copy.deepcopy(NO_IB))
    return hv


def as_one_result(hv):
    """The node's three results as the burn stage registers them now: the samples and ports inside the burn's."""
    burn = hv["gpufleet_result_gpu_burn"]
    burn["sampling"] = hv.pop("gpufleet_result_gpu_sample")
    burn["ib_ports"] = hv.pop("gpufleet_result_ib_ports")
    return hv


@pytest.mark.parametrize("name", sorted(h for h in BURN if "gpufleet_result_gpu_sample" in BURN[h]))
def test_one_burn_result_is_judged_as_the_three_registered_apart(name):
    separate = rules.evaluate_node(name, apart(name))
    together = rules.evaluate_node(name, as_one_result(apart(name)))
    assert together == separate
    assert together["checks"]["gpu_sample"] == separate["checks"]["gpu_sample"]


def test_a_part_the_job_did_not_return_is_skipped_with_the_burns_reason():
    hv = as_one_result(apart("sim-node02"))
    burn = hv["gpufleet_result_gpu_burn"]
    del burn["sampling"], burn["ib_ports"]
    burn["not_run"] = "gpu_burn not found on PATH"
    results = rules._results(hv)
    assert results["gpu_sample"] == {"skipped": True, "skip_reason": "not sampled: gpu_burn not found on PATH"}
    assert results["ib_ports"] == {"skipped": True, "skip_reason": "not read: gpu_burn not found on PATH"}
    node = rules.evaluate_node("sim-node02", hv)
    assert node["checks"]["gpu_sample"]["verdict"] != "pass"


def test_a_burn_result_without_parts_or_reason_is_read_as_registered_before_the_job_carried_them():
    hv = apart("sim-node02")
    assert rules._results(hv)["gpu_sample"] == hv["gpufleet_result_gpu_sample"]
    del hv["gpufleet_result_gpu_sample"]
    assert "gpu_sample" not in rules._results(hv)


def test_the_tools_error_is_the_reason_when_the_job_gives_none():
    hv = as_one_result(apart("sim-node02"))
    burn = hv["gpufleet_result_gpu_burn"]
    del burn["sampling"]
    burn["tool"] = dict(burn.get("tool") or {}, error="timed out after 900 s")
    assert rules._results(hv)["gpu_sample"]["skip_reason"] == "not sampled: timed out after 900 s"


@pytest.mark.parametrize("burn", [
    {"skipped": True, "skip_reason": "disabled: gpufleet_burn_enabled is false"},
    {"failed": True, "stage": "burn", "msg": "stage burn failed: the lease ran out"},
])
def test_a_burn_that_never_returned_leaves_its_parts_to_the_stage(burn):
    results = rules._results({"gpufleet_result_gpu_burn": burn})
    assert results == {"gpu_burn": burn}
