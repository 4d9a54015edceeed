"""dcgm_diag's nccl_after: dcgmi diag and then all_reduce_perf in one job, each with the result its own module gives,
whatever the other's; NCCL's options are refused before dcgmi runs."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_dcgm, judge_nccl
from helpers.module_runner import run_module

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
VOLATILE = ("duration_s", "invocation", "started", "ended")


def stable(value):
    """A result without what differs between two runs of the same tool (times)."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def tools(standin, dcgm_fixture="dcgm4_l3_pass.json"):
    dcgmi = standin("dcgmi", "dcgm", dcgm_fixture)
    perf = standin("all_reduce_perf", "nccl", "h100_8gpu_ok.txt")
    return dcgmi, perf, {"PATH": "%s:%s" % (dcgmi.dir, SAFE_PATH)}


NCCL = {"gpus_per_process": 8, "max_bytes": "1G", "gpu_names": ["NVIDIA H100 80GB HBM3"] * 8,
        "interconnect": "nvswitch"}
DCGM = {"level": "3", "gpu_names": ["NVIDIA H100 80GB HBM3"] * 8}


def test_the_job_returns_what_the_two_modules_return_on_their_own(standin, contract):
    _dcgmi, perf, env = tools(standin)
    alone_dcgm = run_module("dcgm_diag", DCGM, env=env)
    alone_nccl = run_module("nccl_test", NCCL, env=env)
    both = run_module("dcgm_diag", dict(DCGM, nccl_after=NCCL), env=env)
    part = both.pop("nccl_after")
    assert perf.argv == ["-b", "8", "-e", "1G", "-f", "2", "-g", "8"]
    assert stable(both) == stable(alone_dcgm) and both["verdict"] == "pass"
    assert stable(part) == stable(alone_nccl) and part["verdict"] == "pass"
    assert contract("dcgm_diag", both, judge_dcgm.judge, {}) == []
    assert contract("nccl_test", part, judge_nccl.judge, {"gpufleet_nccl_min_busbw_fraction": 0.7}) == []


def test_a_failing_dcgm_does_not_stop_nccl_and_the_reverse(standin):
    _dcgmi, _perf, env = tools(standin, "dcgm4_l3_gpu1_fail.json")
    both = run_module("dcgm_diag", dict(DCGM, nccl_after=dict(NCCL, min_busbw_gbps=500.0)), env=env)
    assert both["verdict"] == "fail" and not both.get("failed")
    assert both["nccl_after"]["verdict"] == "fail" and "NCCL busbw" in both["nccl_after"]["reasons"][0]


def test_nccl_missing_is_its_own_verdict(standin):
    dcgmi = standin("dcgmi", "dcgm", "dcgm4_l3_pass.json")
    both = run_module("dcgm_diag", dict(DCGM, nccl_after=NCCL), env={"PATH": "%s:%s" % (dcgmi.dir, SAFE_PATH)})
    assert both["verdict"] == "pass"
    assert both["nccl_after"]["verdict"] == "error" and "all_reduce_perf not found" in both["nccl_after"]["reasons"][0]


@pytest.mark.parametrize("bad,says", [({"max_bytes": "lots"}, "max_bytes must be a byte count"),
                                      ({"no_such_option": 1}, "no_such_option"),
                                      ({"step_factor": "x"}, "step_factor"),
                                      ({"thresholds": {"gpufleet_nccl_min_busbw_gbps": "fast"}}, "thresholds")])
def test_a_bad_nccl_option_is_nccls_error_and_the_diag_still_runs(standin, bad, says):
    dcgmi, perf, env = tools(standin)
    result = run_module("dcgm_diag", dict(DCGM, nccl_after=dict(NCCL, **bad)), env=env)
    assert not result.get("failed") and result["verdict"] == "pass" and dcgmi.ran
    part = result["nccl_after"]
    assert part.get("failed") and part["msg"].startswith("nccl_after: ") and says in part["msg"], part
    assert not perf.ran


def test_check_mode_runs_neither(standin):
    dcgmi, perf, env = tools(standin)
    both = run_module("dcgm_diag", dict(DCGM, nccl_after=NCCL), env=env, check_mode=True)
    assert both["not_run"].startswith("check mode") and both["nccl_after"]["not_run"].startswith("check mode")
    assert not dcgmi.ran and not perf.ran


def test_the_report_reads_the_jobs_nccl_part_as_the_nccl_check():
    """Recorded burn-ins: a node whose dcgm job returned NCCL's result (its NCCL task skipped) is judged exactly as
    with nccl_test's own registered result; a node without the part keeps its own NCCL result."""
    import copy
    import json
    from pathlib import Path

    from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules

    hosts = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "report" / "sim_burn_in.json")
                       .read_text())["hosts"]
    judged = 0
    for host, hv in sorted(hosts.items()):
        if not isinstance(hv.get("gpufleet_result_nccl_test"), dict) or "verdict" not in hv["gpufleet_result_nccl_test"]:
            continue
        if not isinstance(hv.get("gpufleet_result_dcgm_diag"), dict) or "verdict" not in hv["gpufleet_result_dcgm_diag"]:
            continue
        by_job = copy.deepcopy(hv)
        by_job["gpufleet_result_dcgm_diag"]["nccl_after"] = by_job["gpufleet_result_nccl_test"]
        by_job["gpufleet_result_nccl_test"] = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False",
                                               "false_condition": "'nccl_after' not in (gpufleet_result_dcgm_diag | default({}))"}
        assert rules.evaluate_node(host, by_job) == rules.evaluate_node(host, hv), host
        judged += 1
    assert judged >= 5
