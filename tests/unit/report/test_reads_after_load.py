"""The reads after the burn come from the burn's own job (gpu_burn nvlink_after, xid_window): the job reads what
nvlink_facts and xid_facts read after the load, a read that fails is that read's failure (never the burn's), a burn
that does not load the GPUs (skip) still makes them, and the report judges a node whose job returned them exactly as
with the modules' own registered results."""

import copy
import json
import shutil
import sys
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))
from helpers.module_runner import run_module  # noqa: E402

BURN = json.loads((REPO / "tests" / "fixtures" / "report" / "sim_burn_in.json").read_text())["hosts"]
SIM_BIN = REPO / "sim" / "bin"
NODE = "sim-node02"
SCENARIOS = ("healthy_h100", "hgx_nvlink_down", "riser_xid79", "healthy_rtx5090")


def with_burn(result):
    """The recorded node with this burn result registered, and none of the results the job's parts stand for."""
    hv = copy.deepcopy(BURN[NODE])
    for name in ("gpu_sample", "ib_ports", "nvlink_facts", "xid_facts"):
        hv.pop("gpufleet_result_" + name, None)
    hv["gpufleet_result_gpu_burn"] = result
    hv["ansible_facts"].update(result.get("ansible_facts") or {})
    return hv


def steady(fact):
    """A read without what differs between two reads a moment apart (its time; the position's own save flag)."""
    fact = copy.deepcopy(fact)
    fact.pop("read_at", None)
    return fact


def sim(state, scenario):
    env = {"GPUFLEET_SIM_SCENARIO": scenario, "GPUFLEET_SIM_STATE": str(state), "GPUFLEET_SIM_NODE": NODE,
           "GPUFLEET_SIM_TIME_SCALE": "0.001"}
    roots = {"sysfs_root": str(state / "sysfs"), "procfs_root": str(state / "procfs")}
    return env, roots


@pytest.fixture(scope="module")
def reads(tmp_path_factory):
    """{scenario: (the identity snapshot's marks, the burn's job, nvlink_facts after, xid_facts after)}: the job and
    the modules go on from the same marks (a copy of the XID position) and read the node after the same burn."""
    out = {}
    for scenario in SCENARIOS:
        state = tmp_path_factory.mktemp(scenario)
        env, roots = sim(state, scenario)
        job_pos, own_pos = state / "job.position", state / "own.position"
        snapshot = run_module("health_snapshot", {"mode": "identity", "budget": 180, "dmi_dir": str(state / "dmi"),
                                                  "nvlink_mark": True, "xid_state_file": str(job_pos),
                                                  "nvlink_sysfs_root": roots["sysfs_root"],
                                                  "nvlink_procfs_root": roots["procfs_root"]},
                              env=env, path_prepend=[SIM_BIN])
        shutil.copy(job_pos, own_pos)
        baseline = snapshot["ansible_facts"]["gpufleet_nvlink"]
        job = run_module("gpu_burn", {"duration": 600, "nvlink_after": dict(roots, baseline=baseline),
                                      "xid_window": {"state_file": str(job_pos)}}, env=env, path_prepend=[SIM_BIN])
        nvlink = run_module("nvlink_facts", dict(roots, baseline=baseline), env=env, path_prepend=[SIM_BIN])
        xid = run_module("xid_facts", {"state_file": str(own_pos)}, env=env, path_prepend=[SIM_BIN])
        out[scenario] = (snapshot, job, nvlink, xid)
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_job_reads_what_the_modules_read_after_the_load(reads, scenario):
    _snapshot, job, nvlink, xid = reads[scenario]
    assert job["verdict"] in ("pass", "fail") and not job.get("failed"), job.get("msg")
    assert steady(job["nvlink_after"]["ansible_facts"]["gpufleet_nvlink"]) == steady(
        nvlink["ansible_facts"]["gpufleet_nvlink"])
    assert [c["argv"][1:] for c in job["nvlink_after"]["nvidia_smi"]["calls"]] == [
        c["argv"][1:] for c in nvlink["nvidia_smi"]["calls"]]
    window, own = job["xid_window"]["ansible_facts"]["gpufleet_xid"], xid["ansible_facts"]["gpufleet_xid"]
    assert window["events"] == own["events"] and window["lost_gpus"] == own["lost_gpus"]
    assert window["summary"] == own["summary"]
    # the facts the modules' own tasks set, set by the job: the report's XID reads and NVLink read see them
    assert job["ansible_facts"] == {"gpufleet_nvlink": job["nvlink_after"]["ansible_facts"]["gpufleet_nvlink"],
                                    "gpufleet_xid": window}


def test_the_window_holds_the_xids_of_the_load_only(reads):
    snapshot, job, _nvlink, _xid = reads["riser_xid79"]
    window = job["xid_window"]["ansible_facts"]["gpufleet_xid"]
    assert window["lost_gpus"], "the riser scenario loses a GPU under load"
    before = {e["line"] for e in snapshot["ansible_facts"]["gpufleet_xid"]["events"]}
    assert not before & {e["line"] for e in window["events"]}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_report_judges_the_jobs_reads_as_the_modules_own(reads, scenario):
    snapshot, job, nvlink, xid = reads[scenario]
    own = copy.deepcopy(BURN[NODE])
    own.pop("gpufleet_nvlink_before", None)
    own.pop("gpufleet_xid_before", None)
    own["gpufleet_result_health_snapshot"] = snapshot
    burn = {k: v for k, v in job.items() if k not in ("nvlink_after", "xid_window", "ansible_facts")}
    own["gpufleet_result_gpu_burn"] = burn
    own["gpufleet_result_nvlink_facts"] = job["nvlink_after"]  # the job's reads, as the modules' tasks register them
    own["gpufleet_result_xid_facts"] = job["xid_window"]
    own["ansible_facts"].update(job["ansible_facts"])
    by_job = copy.deepcopy(own)
    del by_job["gpufleet_result_nvlink_facts"], by_job["gpufleet_result_xid_facts"]
    by_job["gpufleet_result_gpu_burn"] = job
    node = rules.evaluate_node(NODE, by_job)
    assert node == rules.evaluate_node(NODE, own)
    assert node["checks"]["nvlink"]["verdict"] != "error" and node["checks"]["xid_facts"]["verdict"] != "error"
    if scenario == "riser_xid79":
        assert "GPU_LOST" in {f["code"] for f in node["findings"]}
    if scenario == "hgx_nvlink_down":
        assert "NVLINK_LINK_DOWN" in {f["code"] for f in node["findings"]}


def test_a_burn_that_does_not_load_still_makes_the_reads(tmp_path):
    env, roots = sim(tmp_path / "sim", "healthy_h100")
    pos = tmp_path / "xid.position"
    run_module("xid_facts", {"state_file": str(pos)}, env=env, path_prepend=[SIM_BIN])
    result = run_module("gpu_burn", {"duration": 600, "skip": "refused: GPU 4 busy", "sample": {"interval": 1},
                                     "nvlink_after": dict(roots, skip="disabled: gpufleet_nvlink_enabled is false"),
                                     "xid_window": {"state_file": str(pos)}}, env=env, path_prepend=[SIM_BIN])
    assert result["verdict"] == "skipped" and result["not_run"] == "refused: GPU 4 busy"
    assert "gpus" not in result and "sampling" not in result  # gpu_burn never ran
    assert result["nvlink_after"] == {"skipped": True, "skip_reason": "disabled: gpufleet_nvlink_enabled is false"}
    assert result["xid_window"]["ansible_facts"]["gpufleet_xid"]["events"] == []
    hv = with_burn(result)
    del hv["gpufleet_nvlink_before"]  # NVLink switched off: no mark before the burn either
    node = rules.evaluate_node(NODE, hv)
    assert node["checks"]["gpu_burn"] == {"verdict": "skipped", "reasons": ["not run: refused: GPU 4 busy"],
                                          "figures": node["checks"]["gpu_burn"]["figures"]}
    assert node["checks"]["gpu_sample"]["reasons"] == ["not run: not sampled: refused: GPU 4 busy"]
    assert node["checks"]["nvlink"]["reasons"] == ["not run: disabled: gpufleet_nvlink_enabled is false"]


def test_a_read_that_fails_is_its_own_failure_not_the_burns(tmp_path):
    env, roots = sim(tmp_path / "sim", "healthy_h100")  # the simulator owns its state directory
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    result = run_module("gpu_burn", {"duration": 600, "nvlink_after": roots,
                                     "xid_window": {"state_file": str(blocked / "xid.position")}},
                        env=env, path_prepend=[SIM_BIN])
    assert result["verdict"] == "pass" and not result.get("failed")
    failed = result["xid_window"]
    assert failed["failed"] is True and "cannot save the read position" in failed["msg"], failed
    assert "gpufleet_xid" not in result["ansible_facts"]  # the host's fact stays the mark: the report says so
    node = rules.evaluate_node(NODE, with_burn(result))
    assert node["checks"]["gpu_burn"]["verdict"] == "pass"
    assert node["checks"]["xid_facts"]["verdict"] == "error"
    assert any(f["code"] == "CHECK_ERROR" and "cannot save the read position" in f["message"]
               for f in node["findings"] if f["check"] == "xid_facts")


@pytest.mark.parametrize("options,message", [
    ({"xid_window": {"state_file": "/tmp/x", "severity_overrides": {"63": "fatal"}}}, "xid_window.severity_overrides"),
    ({"xid_window": {"state_file": "/tmp/x", "timeout": 0}}, "xid_window.timeout must be at least 1 second"),
    ({"nvlink_after": {"timeout": -1}}, "nvlink_after.timeout must be at least 1 second"),
])
def test_the_reads_options_are_checked_before_the_burn(tmp_path, options, message):
    env, _roots = sim(tmp_path, "healthy_h100")
    result = run_module("gpu_burn", dict(options, duration=600), env=env, path_prepend=[SIM_BIN])
    assert result.get("failed") and message in result["msg"], result
    assert "tool" not in result  # refused before gpu_burn started
