"""The NVLink rule on a recorded healthy H100 node's observations plus NVLink reads the module takes from the
simulator's HGX scenarios: verdicts, the worst finding and its action, figures, per-GPU metrics joined by PCI
address, skipped and failed reads, schema errors, and the NCCL floor that follows the interconnect."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import nvlink_read
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))
from helpers.module_runner import run_module  # noqa: E402

BURN = json.loads((REPO / "tests" / "fixtures" / "report" / "sim_burn_in.json").read_text())["hosts"]
# The recorded node without its own NVLink reads: each test plants the reads it judges.
for _hv in BURN.values():
    _hv.pop("gpufleet_nvlink_before", None)
    _hv.pop("gpufleet_result_nvlink_facts", None)
SIM_BIN = REPO / "sim" / "bin"
NODE = "sim-node02"
# What the burn-in reads before the burn (the identity snapshot's NVLink mark).
MARK_GATHER = list(nvlink_read.MARK_GATHER)


@pytest.fixture(scope="module")
def reads(tmp_path_factory):
    """{scenario: (read before a burn, read after it with the first as baseline)}, as the burn-in registers them."""
    out = {}
    for scenario in ("healthy_h100", "hgx_nvlink_down", "hgx_fabric_manager_stopped", "hgx_nvlink_crc",
                     "healthy_rtx5090"):
        state = tmp_path_factory.mktemp(scenario)
        env = {"GPUFLEET_SIM_SCENARIO": scenario, "GPUFLEET_SIM_STATE": str(state), "GPUFLEET_SIM_NODE": NODE,
               "GPUFLEET_SIM_TIME_SCALE": "0.001"}
        args = {"sysfs_root": str(state / "sysfs"), "procfs_root": str(state / "procfs")}
        run_module("gpu_facts", {}, env=env, path_prepend=[SIM_BIN])
        before = run_module("nvlink_facts", dict(args, gather=MARK_GATHER), env=env, path_prepend=[SIM_BIN])
        subprocess.run([str(SIM_BIN / "gpu_burn"), "600"], capture_output=True, timeout=120,
                       env=dict(os.environ, PATH=str(SIM_BIN) + os.pathsep + os.environ["PATH"], **env))
        after = run_module("nvlink_facts", dict(args, baseline=before["ansible_facts"]["gpufleet_nvlink"]), env=env,
                           path_prepend=[SIM_BIN])
        out[scenario] = (before, after)
    return out


def hv_with(reads, scenario, after=True):
    hv = copy.deepcopy(BURN[NODE])
    before, second = copy.deepcopy(reads[scenario])
    hv["gpufleet_nvlink_before"] = before
    if after:
        hv["gpufleet_result_nvlink_facts"] = second
    return hv


def codes(node):
    return [(f["code"], f["gpu"]) for f in node["findings"]]


def test_a_healthy_hgx_passes_with_figures_and_nvlink_per_gpu(reads):
    node = rules.evaluate_node(NODE, hv_with(reads, "healthy_h100"))
    assert node["verdict"] == "pass", codes(node)
    check = node["checks"]["nvlink"]
    assert check["verdict"] == "pass"
    assert check["figures"]["interconnect"] == "nvswitch" and check["figures"]["fabric_complete"] == "8/8"
    assert check["figures"]["links_up"] == check["figures"]["links_total"] == 144
    assert check["figures"]["topology"].splitlines()[1].startswith("GPU0  X     NV18")
    gpu3 = node["gpus"][3]
    assert gpu3["metrics"]["nvlink_links_up"] == 18 and gpu3["metrics"]["nvlink_fabric_complete"] == 1
    assert gpu3["metrics"]["nvlink_errors_rise"] == 0
    assert node["checks"]["nccl_test"]["figures"]["threshold_source"] == \
        "built-in reference for H100 on nvswitch (370 GB/s) x 0.7"


def test_one_link_down_is_the_nodes_action(reads):
    node = rules.evaluate_node(NODE, hv_with(reads, "hgx_nvlink_down"))
    assert node["verdict"] == "fail" and codes(node) == [("NVLINK_LINK_DOWN", 5)]
    assert node["worst"]["pci"] == node["gpus"][5]["pci"] and node["worst"]["check"] == "nvlink"
    assert node["action"].startswith("reseat GPU 5's SXM module")
    assert node["gpus"][5]["metrics"]["nvlink_links_up"] == 17 and node["gpus"][5]["verdict"] == "fail"


def test_the_fabric_manager_stopped_is_the_worst_finding(reads):
    node = rules.evaluate_node(NODE, hv_with(reads, "hgx_fabric_manager_stopped"))
    assert node["worst"]["code"] == "FABRIC_MANAGER_STOPPED"
    assert codes(node) == [("FABRIC_MANAGER_STOPPED", None)] + [("FABRIC_STATE_INCOMPLETE", i) for i in range(8)]
    assert all(g["metrics"]["nvlink_fabric_complete"] == 0 for g in node["gpus"])


def test_counters_that_rose_during_the_burn(reads):
    node = rules.evaluate_node(NODE, hv_with(reads, "hgx_nvlink_crc"))
    assert codes(node) == [("NVLINK_ERRORS_HIGH", 6), ("NVLINK_ERRORS_RISING", 2)]
    assert node["gpus"][6]["metrics"]["nvlink_errors_rise"] > 100000
    # One read only (a node that stopped before the second): the rise cannot be judged, the rest can.
    single = rules.evaluate_node(NODE, hv_with(reads, "hgx_nvlink_crc", after=False))
    assert single["verdict"] == "pass" and single["checks"]["nvlink"]["figures"]["errors_rise"] is None


def test_a_pcie_node_skips_the_read_after_the_burn_with_the_reason(reads):
    hv = hv_with(reads, "healthy_rtx5090", after=False)
    hv["gpufleet_result_nvlink_facts"] = {"skipped": True, "skip_reason": "no NVLink on this node: the read before "
                                          "the burn found pcie only"}
    check = rules.evaluate_node(NODE, hv)["checks"]["nvlink"]
    assert check["verdict"] == "skipped" and check["reasons"] == ["no NVLink on this node: the read before the burn "
                                                                  "found pcie only"]


def test_a_failed_second_read_is_an_error_and_the_first_is_still_judged(reads):
    hv = hv_with(reads, "hgx_nvlink_down", after=False)
    hv["gpufleet_result_nvlink_facts"] = {"failed": True, "stage": "nvlink", "msg": "stage nvlink failed: timeout"}
    node = rules.evaluate_node(NODE, hv)
    assert ("CHECK_ERROR", None) in codes(node) and ("NVLINK_LINK_DOWN", 5) in codes(node)
    disabled = copy.deepcopy(BURN[NODE])
    disabled["gpufleet_result_nvlink_facts"] = {"skipped": True, "skip_reason": "disabled: gpufleet_nvlink_enabled is false"}
    assert rules.evaluate_node(NODE, disabled)["checks"]["nvlink"] == {
        "verdict": "skipped", "reasons": ["not run: disabled: gpufleet_nvlink_enabled is false"], "figures": {}}


def test_with_only_the_read_before_the_burn_a_stopped_fabric_manager_is_the_cause_not_the_modules(reads):
    # The read after the burn failed: the one before it has no fabric registration or topology, but the fabric
    # manager's state, so links down because it stopped are not sent to a reseat.
    hv = hv_with(reads, "hgx_fabric_manager_stopped", after=False)
    assert "fabric" not in hv["gpufleet_nvlink_before"]["ansible_facts"]["gpufleet_nvlink"]["gathered"]
    hv["gpufleet_result_nvlink_facts"] = {"failed": True, "stage": "nvlink", "msg": "stage nvlink failed: timeout"}
    node = rules.evaluate_node(NODE, hv)
    assert ("FABRIC_MANAGER_STOPPED", None) in codes(node)
    assert not [c for c in codes(node) if c[0] in ("NVLINK_LINK_DOWN", "FABRIC_STATE_INCOMPLETE")], codes(node)


def test_a_read_outside_the_schema_is_an_error_naming_the_key(reads):
    hv = hv_with(reads, "healthy_h100")
    hv["gpufleet_result_nvlink_facts"]["ansible_facts"]["gpufleet_nvlink"]["gpus"][0]["links_up"] = 18
    node = rules.evaluate_node(NODE, hv)
    bad = [f for f in node["findings"] if f["code"] == "RESULT_INVALID"]
    assert bad and "gpus[0]: unexpected key(s) links_up" in bad[0]["message"]
    assert node["checks"]["nvlink"]["verdict"] in ("pass", "error")  # the first read is still judged


def test_the_nccl_floor_follows_the_interconnect(reads):
    hv = hv_with(reads, "healthy_h100")
    hv["gpufleet_result_nvlink_facts"]["ansible_facts"]["gpufleet_nvlink"]["interconnect"] = "pcie"
    hv["gpufleet_nvlink_before"]["ansible_facts"]["gpufleet_nvlink"]["interconnect"] = "pcie"
    node = rules.evaluate_node(NODE, hv)
    nccl = node["checks"]["nccl_test"]
    assert nccl["verdict"] == "warn" and nccl["figures"]["interconnect"] == "pcie"
    assert "is for nvswitch machines, this node's GPUs talk over pcie" in nccl["figures"]["threshold_source"]
