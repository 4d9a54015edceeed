"""The run's GPU table comes from the identity snapshot's round trip (health_snapshot gpu_table): the same facts
gpu_facts returns, on every scenario that shapes the table (lost and missing GPUs, foreign processes, junk output, a
degraded link), and the report judges a node the same without gpu_facts' own registered result."""

import copy
import json
import re
import sys
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))
from helpers.module_runner import run_module  # noqa: E402

BURN = json.loads((REPO / "tests" / "fixtures" / "report" / "sim_burn_in.json").read_text())["hosts"]
SIM_BIN = REPO / "sim" / "bin"
# Readings of a live GPU: two reads a moment apart differ (the simulator's too).
LIVE = ("temperature_c", "power_w", "memory_used_mib", "ecc_volatile_corrected")
SCENARIOS = ("healthy_h100", "riser_xid79", "neighbour_process", "nvidia_smi_junk", "nvidia_smi_two_rows",
             "pcie_degraded", "row_remap_pending", "workstation_rtx5090_1gpu")


def steady(facts):
    """The facts without live readings; a problem's count of query fields masked (the identity's query asks for the
    table's fields and a few of its own, in one call)."""
    facts = copy.deepcopy(facts)
    for gpu in facts["gpufleet_gpus"]:
        for key in LIVE:
            gpu.pop(key)
    for problem in facts["gpufleet_gpu_problems"]:
        problem["message"] = re.sub(r"expected \d+ comma-separated fields", "expected N comma-separated fields",
                                    problem["message"])
    return facts


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """{scenario: (gpu_facts' result, the identity snapshot's with gpu_table)} of one node."""
    out = {}
    for scenario in SCENARIOS:
        state = tmp_path_factory.mktemp(scenario)
        env = {"GPUFLEET_SIM_SCENARIO": scenario, "GPUFLEET_SIM_STATE": str(state), "GPUFLEET_SIM_NODE": "sim-node03",
               "GPUFLEET_SIM_TIME_SCALE": "0.001"}
        own = run_module("gpu_facts", {}, env=env, path_prepend=[SIM_BIN])
        snapshot = run_module("health_snapshot", {"mode": "identity", "gpu_table": True, "budget": 120,
                                                  "dmi_dir": str(state / "dmi")}, env=env, path_prepend=[SIM_BIN])
        out[scenario] = (own, snapshot)
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_snapshot_returns_gpu_facts_table(tables, scenario):
    own, snapshot = tables[scenario]
    assert not snapshot.get("failed"), snapshot.get("msg")
    assert steady(snapshot["ansible_facts"]) == steady(own["ansible_facts"])
    # the table is the run's, judged by the report: not in the snapshot's own verdict
    assert not [f for f in snapshot["evidence"] if "GPU_" in json.dumps(f)], snapshot["evidence"]


def test_without_the_option_an_identity_returns_no_table(tmp_path):
    env = {"GPUFLEET_SIM_SCENARIO": "healthy_h100", "GPUFLEET_SIM_STATE": str(tmp_path), "GPUFLEET_SIM_NODE": "n"}
    snapshot = run_module("health_snapshot", {"mode": "identity", "dmi_dir": str(tmp_path)}, env=env,
                          path_prepend=[SIM_BIN])
    assert "ansible_facts" not in snapshot or not snapshot["ansible_facts"]
    assert all("-q" not in c["argv"] for c in snapshot["nvidia_smi"]["calls"])


def test_an_audit_refuses_the_option(tmp_path):
    result = run_module("health_snapshot", {"mode": "audit", "gpu_table": True, "xid": False, "env": False,
                                            "dmi_dir": str(tmp_path)},
                        env={"GPUFLEET_SIM_SCENARIO": "healthy_h100", "GPUFLEET_SIM_STATE": str(tmp_path),
                             "GPUFLEET_SIM_NODE": "n"}, path_prepend=[SIM_BIN])
    assert result["failed"] and "mode identity" in result["msg"], result


@pytest.mark.parametrize("name", sorted(BURN))
def test_every_recorded_node_is_judged_the_same_without_gpu_facts_own_result(name):
    hv = BURN[name]
    assert "gpufleet_result_gpu_facts" in hv
    moved = copy.deepcopy(hv)
    del moved["gpufleet_result_gpu_facts"]
    assert rules.evaluate_node(name, moved) == rules.evaluate_node(name, copy.deepcopy(hv))
