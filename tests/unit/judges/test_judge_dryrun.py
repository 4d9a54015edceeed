"""judge_dryrun: a failed or hung step explained most-specific first, the straggler rank, bad input."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_dryrun
from hypothesis import given, settings
from judgelib import (
    BAD_TOP,
    GARBAGE,
    HOST,
    TOOL_OK,
    assert_schema,
    check_shape,
    codes,
    door,
    only,
    set_path,
    thresholds,
)


def _rank(rank, step=1.0, status="pass", errors=()):
    return {"rank": rank, "local_rank": rank, "device": "cuda:%d" % rank, "device_name": "NVIDIA GeForce RTX 5090",
            "backend": "nccl", "world_size": 2, "step_time_s": step, "status": status, "errors": list(errors),
            "line": "GPUFLEET_DRYRUN {\"rank\": %d}" % rank}


def healthy(steps=(1.0, 1.0)):
    return {"tool": dict(TOOL_OK, argv=["torchrun", "--nproc-per-node=2"]), "not_run": None,
            "world_size": len(steps), "script": "shipped", "entrypoint": "/tmp/gpufleet_dryrun.py",
            "step_time_s": max(steps), "ranks": [_rank(i, s) for i, s in enumerate(steps)], "gpus": [],
            "missing_ranks": [], "watchdog": {}, "oom": [], "remedies": [], "leftover_pids_killed": [],
            "output_tail": ["rank 1 done"], "notes": []}


OOM = {"rank": 1, "gpu": 1, "tried_to_allocate_mib": 2048.0, "free_mib": 100.0, "neighbour_suspected": True,
       "processes": [{"pid": 4821}, {"pid": 5187}], "line": "torch.OutOfMemoryError: CUDA out of memory."}
TIMEOUT = {"rank": 0, "op_type": "ALLREDUCE", "seq": 7753, "timeout_ms": 600000,
           "line": "[rank0]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE)"}
CULPRIT = {"rank": 1, "reason": "rank 1 never enqueued work 7753", "line": "last enqueued work: 7752"}
ROOT = {"rank": 0, "exitcode": -6, "signal": 6}


def judge(result, **t):
    return judge_dryrun.judge(result, thresholds(**t), HOST)


def test_clean_step_has_no_finding_and_matches_the_schema():
    result = healthy()
    assert judge(result) == []
    assert_schema("train_dryrun", result, [])


@pytest.mark.parametrize("slow, expected", [(2.0, []), (2.01, [("DRYRUN_SLOW_RANK", None)])])
def test_slow_rank_against_the_median_of_the_others(slow, expected):
    findings = judge(healthy(steps=(1.0, slow)))
    assert codes(findings) == expected
    if findings:
        assert "rank 1 on cuda:1" in findings[0]["message"] and "2.0x the other ranks' median" in \
            findings[0]["message"]


def test_slow_rank_factor_is_a_threshold():
    result = healthy(steps=(1.0, 1.0, 1.0, 3.0))
    assert codes(judge(result)) == [("DRYRUN_SLOW_RANK", None)]
    assert judge(result, gpufleet_dryrun_slow_rank_factor=3.0) == []


def test_failed_rank_and_missing_ranks_fail_although_torchrun_exited_0():
    result = healthy()
    result["ranks"][1] = _rank(1, status="fail", errors=["allreduce result wrong"])
    f = only(judge(result), "DRYRUN_FAIL")
    assert "rank 1 (cuda:1 NVIDIA GeForce RTX 5090): allreduce result wrong" in f["message"]
    missing = set_path(healthy(), ("missing_ranks",), [1])
    f = only(judge(missing), "DRYRUN_FAIL")
    assert "ranks 1 printed no result although torchrun exited 0" in f["message"]


def test_failed_step_explained_most_specific_first():
    result = healthy()
    result["tool"]["rc"] = 1
    result["oom"] = [OOM]
    result["watchdog"] = {"timeouts": [TIMEOUT], "culprit": CULPRIT, "root_cause": ROOT,
                          "terminate": [{"line": "terminate called after throwing an instance of 'c10::DistBackendError'"}],
                          "evidence": ["exitcode  : -6"]}
    findings = judge(result)
    assert codes(findings) == [("DRYRUN_FAIL", None), ("DRYRUN_OOM", 1), ("DRYRUN_NCCL_TIMEOUT", None),
                               ("DRYRUN_CULPRIT", None), ("DRYRUN_FAIL", None)]
    assert "torchrun exited with rc 1 (2 ranks, the shipped dry-run script)" in findings[0]["message"]
    oom = findings[1]
    assert "rank 1 on GPU 1 (tried to allocate 2048 MiB; 100 MiB free; 2 processes hold memory" in oom["message"]
    assert "expandable_segments" in oom["action"]
    assert "collective ALLREDUCE (seq 7753) timed out after 600000 ms on rank(s) 0" in findings[2]["message"]
    assert "culprit: rank 1 never enqueued work 7753" in findings[3]["message"]
    assert "rank 0 failed first (exitcode -6): SIGABRT" in findings[4]["message"]


def test_sigabrt_is_blamed_on_the_nccl_watchdog_only_with_its_evidence():
    result = set_path(healthy(), ("tool", "rc"), 1)
    result["watchdog"] = {"root_cause": ROOT, "terminate": [], "timeouts": [],
                          "evidence": ["Fatal Python error: Aborted", '  File "/opt/train/x.py", line 9 in <module>']}
    fail = judge(result)[-1]
    assert "SIGABRT (the process aborted itself" in fail["message"] and "NCCL" not in fail["message"]
    assert fail["evidence"][0] == "Fatal Python error: Aborted"
    result["watchdog"]["terminate"] = [{"line": "terminate called after throwing an instance of 'c10::DistBackendError'"}]
    assert "the NCCL watchdog aborts" in judge(result)[-1]["message"]


def test_exit_code_alone_fails():
    result = set_path(healthy(), ("tool", "rc"), 1)
    assert codes(judge(result)) == [("DRYRUN_FAIL", None)]
    assert judge(set_path(result, ("tool", "rc"), 0)) == []


def test_hung_step_is_an_error_naming_the_silent_ranks():
    result = healthy()
    result["tool"].update(rc=None, timed_out=True, duration_s=915.0)
    result["missing_ranks"] = [1]
    result["watchdog"] = {"timeouts": [TIMEOUT]}
    findings = judge(result)
    assert codes(findings) == [("CHECK_ERROR", None)], "a hung run proves nothing: error, not fail"
    assert "ranks 1 never reported a result: look at those first" in findings[0]["message"]
    assert any(e.startswith("clue: node01: collective") for e in findings[0]["evidence"]), findings[0]["evidence"]


def test_could_not_run_and_check_mode():
    f = only(judge({"tool": dict(TOOL_OK, rc=None, error="torchrun not found")}), "CHECK_ERROR")
    assert "train_dryrun could not run: torchrun not found" in f["message"]
    assert judge({"tool": dict(TOOL_OK, rc=None), "not_run": "check mode"}) == []


@pytest.mark.parametrize("bad", BAD_TOP)
def test_bad_input_is_refused_at_the_door(bad):
    findings = door("train_dryrun", bad, lambda data: check_shape(judge_dryrun.judge(data, {}, HOST)))
    assert findings is None or (findings and all(f["severity"] == "error" for f in findings)), "no data is no claim"


@pytest.mark.parametrize("path, value", [
    (("ranks", 0), None), (("ranks", 0, "rank"), None), (("ranks", 1, "step_time_s"), "slow"),
    (("ranks",), "x"), (("watchdog",), []), (("oom",), [None]), (("missing_ranks",), "1"),
    (("tool", "rc"), "1"), (("ranks", 0, "errors"), 3),
])
def test_values_of_the_wrong_type_are_refused_or_judged(path, value):
    result = healthy(steps=(1.0, 5.0))
    result["ranks"][0]["status"] = "fail"
    door("train_dryrun", set_path(result, path, value), lambda data: check_shape(judge(data)))


@settings(max_examples=200, deadline=None)
@given(GARBAGE)
def test_fuzz_is_refused_or_judged(data):
    door("train_dryrun", data, lambda d: check_shape(judge_dryrun.judge(d, thresholds(), HOST)))


NOT_READY = ("[rank0]: RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
             "calling NumCudaDevices() that might have already set an error? Error 802: system not yet initialized")


def test_cuda_error_802_points_at_the_fabric_manager():
    result = healthy()
    result["tool"]["rc"] = 1
    result["ranks"] = []
    result["output_tail"] = [NOT_READY, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]
    findings = judge(result)
    assert codes(findings)[:2] == [("DRYRUN_FABRIC_NOT_READY", None), ("DRYRUN_FAIL", None)]
    f = findings[0]
    assert f["severity"] == "fail" and "error 802" in f["message"] and NOT_READY in f["evidence"]
    assert "systemctl enable --now nvidia-fabricmanager" in f["action"] and "kentino.gpufleet.fabric_manager" in f["action"]
    assert_schema("train_dryrun", result, findings)
    # The other spellings: the CUDA runtime's, the driver API's, a rank's own error.
    for text in ("cudaGetDeviceProperties returned 802 -> system not yet initialized",
                 "CUDA_ERROR_SYSTEM_NOT_READY", "cudaErrorSystemNotReady"):
        ok = healthy()
        ok["ranks"][1]["status"] = "fail"
        ok["ranks"][1]["errors"] = [text]
        assert ("DRYRUN_FABRIC_NOT_READY", None) in codes(judge(ok)), text
    assert ("DRYRUN_FABRIC_NOT_READY", None) not in codes(judge(healthy()))
