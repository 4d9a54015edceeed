"""The NVLink read before the burn comes from the identity snapshot's round trip (health_snapshot nvlink_mark, its fact
gpufleet_nvlink): the snapshot reads what nvlink_facts' own mark read did, and the report judges a node with the mark
in the snapshot exactly as with nvlink_facts' own registered read (gpufleet_nvlink_before) of older runs."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import nvlink_read
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import nvlink_before, read_result

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))
from helpers.module_runner import run_module  # noqa: E402

BURN = json.loads((REPO / "tests" / "fixtures" / "report" / "sim_burn_in.json").read_text())["hosts"]
SIM_BIN = REPO / "sim" / "bin"
NODE = "sim-node02"
# Fields that differ between two reads of the same node by design: the time of the read, the calls' durations.
VOLATILE = ("read_at",)


def marked_by_identity(hv, before):
    """The node as a burn-in records it now: the mark is the identity snapshot's fact, no gpufleet_nvlink_before."""
    hv = copy.deepcopy(hv)
    hv.pop("gpufleet_nvlink_before", None)
    snapshot = hv["gpufleet_result_health_snapshot"]
    snapshot.setdefault("ansible_facts", {})["gpufleet_nvlink"] = copy.deepcopy(before)
    snapshot["parts"]["nvlink"] = {"ok": True, "duration_s": 0.2, "error": None, "skipped": None}
    snapshot["nvlink_calls"] = []
    return hv


def judged(name, hv):
    """The report's node, without the snapshot's figure of how long its NVLink part took (new with the mark)."""
    node = rules.evaluate_node(name, hv)
    node["checks"]["health_snapshot"]["figures"].pop("nvlink_s", None)
    return node


def without_volatile(fact):
    return {k: v for k, v in fact.items() if k not in VOLATILE}


@pytest.fixture(scope="module")
def reads(tmp_path_factory):
    """{scenario: (nvlink_facts' mark, the identity snapshot with nvlink_mark, the read after a burn)} of one node."""
    out = {}
    for scenario in ("healthy_h100", "hgx_nvlink_down", "hgx_fabric_manager_stopped", "healthy_rtx5090"):
        state = tmp_path_factory.mktemp(scenario)
        env = {"GPUFLEET_SIM_SCENARIO": scenario, "GPUFLEET_SIM_STATE": str(state), "GPUFLEET_SIM_NODE": NODE,
               "GPUFLEET_SIM_TIME_SCALE": "0.001"}
        roots = {"sysfs_root": str(state / "sysfs"), "procfs_root": str(state / "procfs")}
        run_module("gpu_facts", {}, env=env, path_prepend=[SIM_BIN])
        own = run_module("nvlink_facts", dict(roots, gather=list(nvlink_read.MARK_GATHER)), env=env,
                         path_prepend=[SIM_BIN])
        snapshot = run_module("health_snapshot", {"mode": "identity", "budget": 180, "dmi_dir": str(state / "dmi"),
                                                  "nvlink_mark": True, "nvlink_sysfs_root": roots["sysfs_root"],
                                                  "nvlink_procfs_root": roots["procfs_root"]},
                              env=env, path_prepend=[SIM_BIN])
        subprocess.run([str(SIM_BIN / "gpu_burn"), "600"], capture_output=True, timeout=120,
                       env=dict(os.environ, PATH=str(SIM_BIN) + os.pathsep + os.environ["PATH"], **env))
        baseline = snapshot["ansible_facts"]["gpufleet_nvlink"]
        after = run_module("nvlink_facts", dict(roots, baseline=baseline), env=env, path_prepend=[SIM_BIN])
        out[scenario] = (own, snapshot, after)
    return out


@pytest.mark.parametrize("scenario", ["healthy_h100", "hgx_nvlink_down", "hgx_fabric_manager_stopped",
                                      "healthy_rtx5090"])
def test_the_snapshot_reads_what_nvlink_facts_mark_read(reads, scenario):
    own, snapshot, _after = reads[scenario]
    assert not snapshot.get("failed"), snapshot.get("msg")
    mark = snapshot["ansible_facts"]["gpufleet_nvlink"]
    assert without_volatile(mark) == without_volatile(own["ansible_facts"]["gpufleet_nvlink"])
    assert snapshot["parts"]["nvlink"]["ok"] is True
    assert [c["argv"][1:] for c in snapshot["nvlink_calls"]] == [c["argv"][1:] for c in own["nvidia_smi"]["calls"]]
    # the identity snapshot's own verdict does not judge the mark (the report judges it with the read after)
    assert sorted(snapshot["ansible_facts"]) == ["gpufleet_nvlink"]
    assert read_result("health_snapshot", snapshot)[0] == "ok"


@pytest.mark.parametrize("scenario", ["healthy_h100", "hgx_nvlink_down", "hgx_fabric_manager_stopped",
                                      "healthy_rtx5090"])
def test_the_report_judges_the_snapshots_mark_as_nvlink_facts_own_read(reads, scenario):
    own, snapshot, after = reads[scenario]
    mark = snapshot["ansible_facts"]["gpufleet_nvlink"]
    old = copy.deepcopy(BURN[NODE])
    old["gpufleet_nvlink_before"] = dict(own, ansible_facts={"gpufleet_nvlink": mark})
    old["gpufleet_result_nvlink_facts"] = after
    new = marked_by_identity(old, mark)
    assert judged(NODE, new) == judged(NODE, old)
    # and with only the read before the burn (the node stopped before the read after it)
    old.pop("gpufleet_result_nvlink_facts")
    new.pop("gpufleet_result_nvlink_facts")
    assert judged(NODE, new) == judged(NODE, old)


@pytest.mark.parametrize("name", sorted(BURN))
def test_every_recorded_node_is_judged_the_same_with_the_mark_in_the_snapshot(name):
    hv = BURN[name]
    before = hv.get("gpufleet_nvlink_before")
    if before is None:
        pytest.skip("no NVLink read before the burn recorded for %s" % name)
    moved = marked_by_identity(hv, before["ansible_facts"]["gpufleet_nvlink"])
    assert judged(name, moved) == judged(name, copy.deepcopy(hv))


def test_a_spent_budget_is_a_failed_read_with_the_reason():
    hv = marked_by_identity(BURN[NODE], {})
    snapshot = hv["gpufleet_result_health_snapshot"]
    del snapshot["ansible_facts"]["gpufleet_nvlink"]
    snapshot["parts"]["nvlink"] = {"ok": False, "duration_s": 0.0, "error": None, "skipped": "budget"}
    assert nvlink_before(hv) == {"failed": True, "msg": "the NVLink read before the burn: skipped, the snapshot's "
                                                        "time budget was spent"}
    del snapshot["parts"]["nvlink"]
    assert nvlink_before(hv) is None  # no mark asked for (NVLink checks switched off)


def test_an_audit_snapshot_is_not_a_mark():
    hv = marked_by_identity(BURN[NODE], {"gpus": []})
    hv["gpufleet_result_health_snapshot"]["mode"] = "audit"
    assert nvlink_before(hv) is None


def test_an_audit_refuses_the_mark(tmp_path):
    result = run_module("health_snapshot", {"mode": "audit", "nvlink_mark": True, "xid": False, "env": False,
                                            "dmi_dir": str(tmp_path)},
                        env={"GPUFLEET_SIM_SCENARIO": "healthy_h100", "GPUFLEET_SIM_STATE": str(tmp_path),
                             "GPUFLEET_SIM_NODE": NODE}, path_prepend=[SIM_BIN])
    assert result["failed"] and "needs mode identity" in result["msg"], result
