"""PyTorch watchdog / elastic / OOM parser against logs of several PyTorch versions, plus fuzzing."""

import time
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_watchdog import (
    find_culprit,
    line_rank,
    line_time,
    parse_torch_lines,
    parse_torch_log,
)
from hypothesis import given, settings
from hypothesis import strategies as st

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "torch"


def parse(name, world_size=None):
    return parse_torch_log((FIX / name).read_text(), world_size=world_size)


def test_torch21_old_prefix_culprit_from_earlier_seq():
    r = parse("watchdog_torch21.log", world_size=4)
    assert [t["rank"] for t in r["timeouts"]] == [0, 1, 3, 2]
    first = r["timeouts"][0]
    assert first["seq"] == 96120 and first["op_type"] == "ALLREDUCE" and first["timeout_ms"] == 1800000
    assert first["numel_in"] is None and first["ran_for_ms"] == 1800424
    assert r["pg_status"] == []
    assert r["culprit_rank"] == 2 and "96119" in r["culprit"]["reason"]
    assert r["terminate"][0]["exception"] == "std::runtime_error"
    assert r["terminate"][0]["what"].startswith("[Rank 2] Watchdog caught")
    assert r["agent_failures"] == [{"local_rank": 2, "pid": 7014, "exitcode": -6, "signal": 6, "time": None,
                                    "line": r["agent_failures"][0]["line"]}]
    assert r["root_cause"]["exitcode"] == -6


def test_torch24_pg_status_culprit_never_enqueued():
    r = parse("watchdog_torch24.log", world_size=4)
    assert sorted({t["rank"] for t in r["timeouts"]}) == [0, 1, 2, 3]
    assert r["timeouts"][0]["numel_in"] == 544997376 and r["timeouts"][0]["op_type"] == "_REDUCE_SCATTER_BASE"
    statuses = {(s["rank"], s["failed_seq"]) for s in r["pg_status"]}
    assert (3, 7751) in statuses and (0, 7753) in statuses
    assert all(s["pg"] == 1 for s in r["pg_status"])
    assert r["culprit_rank"] == 3
    assert r["culprit"]["last_enqueued"] == 7751 and "never enqueued work 7753" in r["culprit"]["reason"]
    assert r["silent_ranks"] == []
    assert r["terminate"][0]["exception"] == "c10::DistBackendError"
    root = r["elastic_summary"]["root_cause"]
    assert root["rank"] == 1 and root["exitcode"] == -6 and root["signal"] == 6 and root["pid"] == 140215
    assert r["elastic_summary"]["failures"] == []  # <NO_OTHER_FAILURES>
    # The reporting rank (root cause) is not the culprit: that is the whole point.
    assert r["root_cause"]["rank"] == 1 and r["culprit_rank"] != r["root_cause"]["rank"]
    assert any("exitcode  : -6" in e for e in r["evidence"])


def test_torch27_silent_rank_is_the_culprit():
    r = parse("watchdog_torch27_silent_rank.log", world_size=4)
    assert r["ranks_reporting"] == [0, 1, 2]
    assert r["silent_ranks"] == [3]
    assert r["culprit_rank"] == 3 and "reported no timeout" in r["culprit"]["reason"]
    s = [x for x in r["pg_status"] if x["rank"] == 1][0]
    assert (s["pg"], s["pg_desc"], s["failed_seq"], s["last_enqueued"], s["last_completed"]) == \
        (0, "default_pg", 78, 79, 77)
    assert [f["rank"] for f in r["elastic_summary"]["failures"]] == [1, 2, 3]
    assert r["elastic_summary"]["failures"][2]["signal"] == 15
    # Without the world size nobody can know rank 3 exists: no culprit is invented.
    assert parse("watchdog_torch27_silent_rank.log")["culprit_rank"] is None


def test_torch27_ray_prefix_lowest_completed():
    r = parse("watchdog_torch27_ray_prefix.log", world_size=2)
    assert r["culprit_rank"] == 0
    assert r["culprit"]["last_completed"] == 2633
    assert len(r["terminate"]) == 1


def test_real_torch213_exception_on_rank1():
    r = parse("torch213_gloo_exception_rank1.log", world_size=2)
    assert r["root_cause"] == {"rank": 1, "local_rank": 1, "exitcode": 1, "signal": None,
                               "exception": {"type": "RuntimeError", "message": "dry-run test failure on rank 1"}}
    fail = r["elastic_summary"]["failures"][0]
    assert fail["rank"] == 0 and fail["exitcode"] == -15 and fail["signal"] == 15
    assert r["timeouts"] == [] and r["culprit_rank"] is None
    assert r["unparsed"]["count"] == 0


def test_real_torch213_abort_without_exception_keeps_the_fatal_error_and_its_frame():
    # A rank that aborts with no C++ exception (assert(3), a glibc heap check) prints nothing of its own; the dry run's
    # PYTHONFAULTHANDLER=1 makes it print "Fatal Python error" and where it was: both are the evidence.
    r = parse("torch213_gloo_abort_rank1.log", world_size=2)
    assert r["root_cause"]["rank"] == 1 and r["root_cause"]["signal"] == 6 and r["root_cause"]["exception"] is None
    assert r["terminate"] == [] and r["timeouts"] == []
    assert "Fatal Python error: Aborted" in r["evidence"]
    assert '  File "/opt/train/tests/fixtures/torch/entrypoints/abort_on_rank1.py", line 9 in <module>' in r["evidence"]
    assert not any("functional_tensor.py" in x for x in r["evidence"])  # only the frame right after the error


def test_real_torch213_gloo_timeout_points_at_the_stuck_rank():
    r = parse("torch213_gloo_timeout_rank1_stuck.log", world_size=2)
    assert r["timeouts"][0]["backend"] == "gloo" and r["timeouts"][0]["timeout_ms"] == 3000
    assert r["root_cause"]["rank"] == 0  # the agent blames the rank that noticed
    assert r["culprit_rank"] == 1  # the rank that never arrived
    assert r["root_cause"]["exception"]["type"] == "RuntimeError"


def test_oom_new_wording_with_neighbour():
    r = parse("oom_torch25_neighbour.log")
    oom = r["oom"][0]
    assert oom["rank"] == 3 and oom["gpu"] == 3
    assert oom["tried_to_allocate_mib"] == 2048.0
    assert oom["total_capacity_mib"] == round(31.36 * 1024, 2) and oom["free_mib"] == round(1.06 * 1024, 2)
    assert [p["pid"] for p in oom["processes"]] == [48211, 51877]
    assert oom["neighbour_suspected"] is True


def test_oom_memory_held_by_others_suggests_a_neighbour():
    line = ("[rank4]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 78.62 GiB. GPU 4 has a total "
            "capacity of 79.65 GiB of which 49.63 GiB is free. Including non-PyTorch memory, this process has 0.50 GiB "
            "memory in use.")
    oom = parse_torch_log(line)["oom"][0]
    assert oom["other_processes_mib"] == round((79.65 - 49.63 - 0.50) * 1024, 2)
    assert oom["neighbour_suspected"] is True and oom["processes"] == []
    quiet = parse_torch_log(line.replace("49.63 GiB is free", "79.00 GiB is free"))["oom"][0]
    assert quiet["neighbour_suspected"] is False


def test_oom_old_wording():
    oom = parse("oom_torch1x.log")["oom"][0]
    assert oom["gpu"] == 0 and oom["tried_to_allocate_mib"] == 20.0
    assert oom["total_capacity_mib"] == round(10.76 * 1024, 2) and oom["free_mib"] == 15.44
    assert oom["neighbour_suspected"] is False and oom["rank"] is None


def test_line_rank_prefixes():
    assert line_rank("[rank5]:[E1206 ProcessGroupNCCL.cpp:1] [PG 2 Rank 1] x")["rank"] == 5
    info = line_rank("[PG ID 3 PG GUID 7(tp) Rank 1] x")
    assert (info["pg"], info["pg_rank"], info["pg_desc"], info["rank"]) == (3, 1, "tp", 1)
    assert line_rank("[E ProcessGroupNCCL.cpp:458] [Rank 7] x")["rank"] == 7
    assert line_rank("[default2]:hello")["local_rank"] == 2
    assert line_rank("plain line")["rank"] is None


def test_all_equal_status_without_world_size_has_no_culprit():
    text = "\n".join("[rank%d]:[PG 0 Rank %d] Exception (either an error or timeout) detected by watchdog at work: 5, "
                     "last enqueued NCCL work: 5, last completed NCCL work: 4." % (r, r) for r in range(4))
    r = parse_torch_log(text)
    assert len(r["pg_status"]) == 4 and r["culprit"] is None


def test_non_text_input():
    assert parse_torch_log(None)["unparsed"]["count"] == 1
    assert parse_torch_log(b"bytes")["unparsed"]["count"] == 1


_fragments = st.sampled_from([
    "[rank1]:", "[PG 0 Rank 2]", "[Rank 3]", "Watchdog caught collective operation timeout: WorkNCCL(",
    "SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000", ") ran for 600001 milliseconds before timing out.",
    "last enqueued NCCL work: 9, last completed NCCL work: -1", "failure detected by watchdog at work sequence id: 3",
    "terminate called after throwing an instance of 'x'", "  what():  y", "Failures:", "Root Cause (first observed failure):",
    "[0]:", "  rank      : 1 (local_rank: 1)", "  exitcode  : -6 (pid: 5)", "  traceback : Signal 6 (SIGABRT)",
    "=====", "-----", "CUDA out of memory. Tried to allocate 2.00 GiB", "Process 1 has 3 GiB memory in use",
    "RuntimeError: boom", "Timed out waiting 5ms for recv operation", "\n", " ", "\r",
    "Heartbeat monitor timed out! workMetaList_.size()=3", "watchdog got stuck for 600 seconds without making progress",
    "Work WorkNCCL(SeqNum=1, OpType=X, Timeout(ms)=5) timed out in blocking wait", "NCCL watchdog thread terminated "
    "with exception: ", "[E1206 18:44:12.715 ", "E1399 25:61:61.1 ", "2024-13-45T99:99:99Z ", "2024-12-06T18:44:12Z ",
    "[default3]:[rank11]:", "Rank 0 is running collective: CollectiveFingerPrint(OpType=A), but Rank 1 is running "
    "collective: CollectiveFingerPrint(OpType=B)",
])


@settings(max_examples=400, deadline=None)
@given(st.lists(_fragments | st.text(max_size=30), max_size=40), st.integers(min_value=-3, max_value=64) | st.none())
def test_fuzz_never_raises(parts, world_size):
    r = parse_torch_log("".join(parts), world_size=world_size, since=0, until=2e9, reference=1.7e9)
    assert r["lines_read"] >= 0
    if r["culprit"] is not None:
        assert isinstance(r["culprit"]["rank"], int)


# ---- every form a timeout takes (each failed on the parser before the post-mortem work) ----------------------------

def test_thread_exit_line_is_the_only_timeout_line_torch21():
    # torch 2.1 prints the timeout only inside "NCCL watchdog thread terminated with exception" and the abort message.
    r = parse("watchdog_torch21_thread_exit_only.log", world_size=4)
    assert sorted((t["rank"], t["seq"], t["op_type"]) for t in r["timeouts"]) == [
        (0, 880, "BROADCAST"), (1, 880, "BROADCAST"), (2, 880, "BROADCAST"), (3, 879, "ALLREDUCE")]
    assert {t["form"] for t in r["timeouts"]} == {"abort_message"}
    assert r["timeouts"][0]["ran_for_ms"] == 1800902 and r["timeouts"][0]["numel_in"] == 131137536
    assert r["culprit_rank"] == 3 and r["culprit"]["basis"] == "earlier_seq"
    assert [t["what"][:8] for t in r["terminate"]] == ["[Rank 0]", "[Rank 1]", "[Rank 3]", "[Rank 2]"]


def test_abort_message_alone_is_a_timeout_with_rank_seq_op_duration():
    r = parse("watchdog_abort_message_only.log")
    assert [(t["rank"], t["seq"], t["op_type"], t["ran_for_ms"], t["timeout_ms"]) for t in r["timeouts"]] == [
        (6, 880, "BROADCAST", 1800902, 1800000), (7, 880, "BROADCAST", 1800911, 1800000),
        (4, 879, "BROADCAST", 1800020, 1800000)]
    assert r["ranks_reporting"] == [4, 6, 7]
    assert r["culprit_rank"] == 4  # timed out on the earlier sequence: the others waited for it
    assert all(t["rank"] is not None for t in r["terminate"])  # the rank is read from the what() message


def test_torch1x_timeout_without_seqnum():
    r = parse("watchdog_torch1x_no_seqnum.log")
    assert [(t["rank"], t["seq"], t["op_type"], t["timeout_ms"], t["ran_for_ms"]) for t in r["timeouts"]] == [
        (0, None, "ALLREDUCE", 1800000, 1800408), (2, None, "ALLREDUCE", 1800000, 1800391),
        (1, None, "ALLREDUCE", 1800000, 1800415)]  # what() restating rank 0's timeout is not a fourth event
    assert r["unparsed"]["count"] == 0
    assert r["terminate"][0]["what"].startswith("[Rank 0] Watchdog caught")


def test_blocking_wait_line_is_the_same_event_as_the_watchdog_line():
    r = parse("watchdog_blocking_wait.log")
    assert sorted((t["rank"], t["seq"]) for t in r["timeouts"]) == [(1, 2521), (5, 2521), (7, 2521)]
    rank7 = [t for t in r["timeouts"] if t["rank"] == 7][0]
    assert rank7["form"] == "blocking_wait" and rank7["ran_for_ms"] is None and rank7["timeout_ms"] == 600000
    assert [t["ran_for_ms"] for t in r["timeouts"] if t["rank"] in (1, 5)] == [600000, 600000]


def test_heartbeat_monitor_kills_with_rank_and_process_group():
    r = parse("watchdog_heartbeat_kill.log")
    kills = {(k["rank"], k["pg"]): k for k in r["heartbeat_kills"]}
    assert sorted(kills) == [(0, 0), (1, 0), (4, 5), (6, 0)]
    assert kills[(1, 0)]["signals"] == ["heartbeat_timeout", "watchdog_stuck"] and kills[(1, 0)]["stuck_s"] == 600
    assert kills[(1, 0)]["pending_work"] == 103
    assert kills[(4, 5)]["pg_rank"] == 0  # PG 5's rank 0 is global rank 4
    assert kills[(6, 0)]["stuck_s"] == 480 and "terminated_after_hang" in kills[(6, 0)]["signals"]
    assert kills[(6, 0)]["pg_desc"] == "default_pg" and kills[(6, 0)]["time"] is not None
    assert r["timeouts"] == []


def test_line_time_glog_iso_and_missing_year():
    ref = time.mktime((2025, 3, 22, 0, 0, 0, 0, 0, -1))
    got = line_time("[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] x", ref)
    assert abs(got - (time.mktime((2025, 3, 21, 2, 7, 8, 0, 0, -1)) + 0.408271257)) < 1e-6
    # December lines read in January belong to the previous year.
    jan = time.mktime((2025, 1, 2, 0, 0, 0, 0, 0, -1))
    assert time.localtime(line_time("E1230 23:59:59.100000 4242 torch/distributed/x.py:1] y", jan)).tm_year == 2024
    assert line_time("2024-12-06T18:44:12.5Z [rank0]: z") == 1733510652.5
    assert line_time("[E ProcessGroupNCCL.cpp:458] [Rank 0] no time here") is None


def test_two_jobs_interleaved_are_separated_by_the_window():
    ref = time.mktime((2024, 12, 7, 0, 0, 0, 0, 0, -1))
    text = (FIX / "two_jobs_interleaved.log").read_text()
    t0 = time.mktime((2024, 12, 6, 10, 0, 0, 0, 0, -1))
    job_a = parse_torch_log(text, world_size=4, since=t0 - 600, until=t0 + 60, reference=ref)
    assert job_a["culprit_rank"] == 2 and {t["seq"] for t in job_a["timeouts"]} == {411, 412}
    assert job_a["lines_outside_window"] == 8
    job_b = parse_torch_log(text, world_size=4, since=t0 + 30 * 60, until=t0 + 45 * 60, reference=ref)
    assert job_b["culprit_rank"] == 1 and "never enqueued work 95" in job_b["culprit"]["reason"]
    assert job_b["time_first"] == pytest.approx(t0 + 40 * 60 + 5.0005, abs=1e-3)


def test_journal_lines_carry_their_own_time():
    lines = [("[rank0]:[E ProcessGroupNCCL.cpp:1] [PG 0 Rank 0] Exception (either an error or timeout) detected by "
              "watchdog at work: 5, last enqueued NCCL work: 5, last completed NCCL work: 4.", 1000.0),
             ("[rank1]:[E ProcessGroupNCCL.cpp:1] [PG 0 Rank 1] Exception (either an error or timeout) detected by "
              "watchdog at work: 5, last enqueued NCCL work: 4, last completed NCCL work: 4.", 5000.0)]
    r = parse_torch_lines(lines, world_size=2, since=900, until=2000)
    assert [s["rank"] for s in r["pg_status"]] == [0] and r["pg_status"][0]["time"] == 1000.0
    assert r["lines_outside_window"] == 1


def test_find_culprit_on_merged_evidence_of_two_nodes():
    node_a = parse("watchdog_torch24.log")
    culprit, silent = find_culprit(node_a["pg_status"], node_a["timeouts"], node_a["ranks_reporting"], 6)
    assert culprit["rank"] == 3 and silent == [4, 5]


def test_op_mismatch_at_the_same_sequence_names_the_odd_rank():
    tmo = [{"rank": r, "seq": 40, "op_type": "BROADCAST" if r == 2 else "ALLREDUCE", "line": "l%d" % r}
           for r in range(4)]
    culprit, _silent = find_culprit([], tmo, [0, 1, 2, 3], 4)
    assert culprit["rank"] == 2 and culprit["basis"] == "op_mismatch" and "BROADCAST" in culprit["reason"]
