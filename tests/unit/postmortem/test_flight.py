"""Cross-rank analysis of flight-recorder dumps built in the NCCL format (versions 2.4 and 2.10)."""

import pickle
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem.flight import analyse_dumps
from helpers.fr_dumps import job_dumps


def items(dumps, skip=(), damage=()):
    for rank, dump in sorted(dumps.items()):
        if rank in skip:
            continue
        data = pickle.dumps(dump, protocol=2)
        if rank in damage:
            data = data[:100]
        yield rank, "nccl_trace_rank_%d" % rank, data


@pytest.mark.parametrize("version", ["2.4", "2.10"])
def test_stopped_rank_never_joined(version):
    a = analyse_dumps(items(job_dumps(world=8, culprit=5, seq=100, mode="stop", version=version)), world_size=8)
    group = a["groups"][0]
    assert group["stuck_seq"] == 100 and group["stuck_op"] == "all_reduce" and group["never_joined"] == [5]
    assert group["status"][5]["last_enqueued"] == 99 and group["status"][0]["last_enqueued"] == 102
    assert [(c["rank"], c["basis"]) for c in a["culprits"]] == [(5, "never_joined")]
    assert "never joined collective all_reduce #100" in a["culprits"][0]["reason"]
    assert a["first_mismatch"] is None and a["refused"] == []


@pytest.mark.parametrize("completed", [False, True], ids=["open", "marked-completed"])
def test_rank_that_joined_after_the_timeout_is_named_by_the_enqueue_times(completed):
    """Rank 5 woke up and enqueued #100 after the others' 600 s timeout: only the enqueue times tell it apart. gloo
    may also have marked #100 completed on every rank (nothing open): the last collective is checked the same way."""
    a = analyse_dumps(items(job_dumps(world=8, culprit=5, seq=100, mode="late", late_s=605, completed=completed)),
                      world_size=8)
    assert [(c["rank"], c["basis"], c["seq"]) for c in a["culprits"]] == [(5, "late_joined", 100)]
    assert ("rank 5 joined collective all_reduce #100 of process group default_pg 605.0 s after rank 0, later than "
            "its 600 s timeout: rank(s) 0,1,2,3,4,6,7 had given up waiting (the timing is the evidence"
            in a["culprits"][0]["reason"])
    assert a["groups"][0]["stuck_seq"] == (None if completed else 100)


@pytest.mark.parametrize("late_s, version", [(30, "2.10"), (605, "2.4")], ids=["within-timeout", "no-timeout-known"])
def test_a_rank_late_within_the_timeout_or_without_one_is_not_named(late_s, version):
    a = analyse_dumps(items(job_dumps(world=4, culprit=1, seq=20, mode="late", late_s=late_s, version=version)),
                      world_size=4)
    assert a["culprits"] == [] and a["groups"][0]["late_joined"] == []


def test_mismatched_collective_names_the_odd_rank_and_its_frames():
    a = analyse_dumps(items(job_dumps(world=8, culprit=3, seq=77, mode="mismatch")), world_size=8)
    culprit = a["culprits"][0]
    assert (culprit["rank"], culprit["basis"], culprit["op"]) == (3, "mismatch", "broadcast")
    assert culprit["frames"][0] == "evaluate at /srv/train/trainer.py:212"
    assert a["first_mismatch"]["seq"] == 77 and a["first_mismatch"]["odd_ranks"] == [3]
    assert "all_reduce" in a["first_mismatch"]["variants"][-1]["sig"]


def test_gpu_never_started_the_collective():
    a = analyse_dumps(items(job_dumps(world=4, culprit=1, seq=20, mode="not_started")), world_size=4)
    assert [(c["rank"], c["basis"]) for c in a["culprits"]] == [(1, "not_started")]


def test_healthy_job_has_no_stuck_group():
    a = analyse_dumps(items(job_dumps(world=4, mode="healthy")), world_size=4)
    assert a["root_group"] is None and a["culprits"] == [] and a["groups"][0]["stuck_seq"] is None


def test_missing_and_truncated_dumps_leave_the_rest_analysed():
    dumps = job_dumps(world=8, culprit=6, seq=40, mode="stop")
    a = analyse_dumps(items(dumps, skip={2}, damage={4}), world_size=8)
    assert a["ranks_with_dump"] == [0, 1, 3, 5, 6, 7]
    assert [(r["rank"], "truncated" in r["error"]) for r in a["refused"]] == [(4, True)]
    group = a["groups"][0]
    # rank 4 dumped (its file is refused): refused, never also missing
    assert group["missing_dump"] == [2] and group["refused_dump"] == [4] and group["never_joined"] == [6]
    assert [c["rank"] for c in a["culprits"]] == [6]


def test_missing_dump_is_the_suspect_when_every_dumping_rank_joined():
    dumps = job_dumps(world=4, culprit=2, seq=30, mode="stop")
    a = analyse_dumps(items(dumps, skip={2}), world_size=4)
    assert [(c["rank"], c["basis"]) for c in a["culprits"]] == [(2, "missing_dump")]


def test_two_stopped_ranks_are_both_named():
    dumps = job_dumps(world=4, culprit=1, seq=30, mode="stop")
    dumps[3] = job_dumps(world=4, culprit=3, seq=30, mode="stop")[3]
    a = analyse_dumps(items(dumps), world_size=4)
    assert sorted(c["rank"] for c in a["culprits"]) == [1, 3]


def test_tensor_parallel_groups_are_told_apart():
    a = analyse_dumps(items(job_dumps(world=8, culprit=5, seq=60, mode="stop", tp=4)), world_size=8)
    keys = {g["key"]: g for g in a["groups"]}
    assert set(keys) == {"0|0,1,2,3,4,5,6,7", "1|0,1,2,3", "1|4,5,6,7"}
    assert keys["1|0,1,2,3"]["never_joined"] == [] and keys["1|0,1,2,3"]["culprits"] == []
    assert keys["1|4,5,6,7"]["never_joined"] == [5]
    assert {c["rank"] for c in a["culprits"]} == {5}


def test_callables_are_read_one_at_a_time_and_read_errors_are_kept():
    dumps = job_dumps(world=2, culprit=1, seq=5, mode="stop")

    def broken():
        raise OSError("permission denied")

    a = analyse_dumps([(0, "r0", lambda: pickle.dumps(dumps[0])), (1, "r1", broken)], world_size=2)
    assert a["refused"][0]["rank"] == 1 and "permission denied" in a["refused"][0]["error"]


def test_worker_processes_give_the_same_analysis():
    dumps = job_dumps(world=16, culprit=5, seq=50, mode="stop")
    serial = analyse_dumps(items(dumps, damage={2}), world_size=16)
    parallel = analyse_dumps(items(dumps, damage={2}), world_size=16, workers=2)
    assert parallel["workers"]["processes"] >= 1 and parallel["workers"]["peak_rss_mb"] > 0
    serial.pop("workers"), parallel.pop("workers")
    assert parallel == serial


RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "torch"
STALE = RECORDED / "gloo_stale_completion_recorded"
TIMED_OUT = RECORDED / "gloo_timeout_completed_recorded"


def _recorded(path, op=None):
    """The three recorded dumps as items() gives them, each entry relabelled op when op is given."""
    dumps = {rank: pickle.loads((path / ("nccl_trace_rank_%d" % rank)).read_bytes()) for rank in range(3)}
    if op:
        for dump in dumps.values():
            for entry in dump["entries"]:
                entry["profiling_name"] = "gloo:" + op
    return items(dumps)


def test_a_lagging_completion_record_does_not_hide_the_rank_that_never_joined():
    """Recorded (a real gloo job on a loaded machine): rank 1 slept after enqueuing all_reduce #4 and recorded #2 as its
    last completed, while ranks 0 and 2 completed #4, which needs rank 1's data. The stuck collective is #5, which rank 1
    never joined; read by its lowest completion it was #3, joined by everyone, and the post-mortem fell back to the logs."""
    a = analyse_dumps(_recorded(STALE), world_size=3)
    group = a["groups"][0]
    assert group["status"][1]["last_completed"] == 2 and group["status"][0]["last_completed"] == 4
    assert group["stuck_seq"] == 5 and group["never_joined"] == [1]
    assert [(c["rank"], c["basis"], c["seq"]) for c in a["culprits"]] == [(1, "never_joined", 5)]


def test_a_timed_out_collective_marked_completed_does_not_hide_the_rank_that_never_joined():
    """Recorded (the same job, another run under a CPU hog): gloo marked the all_reduce #5 that timed out completed on
    rank 0, which rank 1 never enqueued. Completed is not joined by all: #5 stays the stuck one, rank 1 never joined."""
    group = analyse_dumps(_recorded(TIMED_OUT), world_size=3)["groups"][0]
    assert group["status"][0]["last_completed"] == 5 and group["status"][1]["last_enqueued"] == 4
    assert group["stuck_seq"] == 5 and group["never_joined"] == [1]


def test_a_broadcast_completed_elsewhere_proves_nothing_about_the_others():
    """A broadcast's root may finish before the others arrive: the same records with broadcasts keep the lowest
    completion (#3, which every rank enqueued), and name no rank from the dumps."""
    group = analyse_dumps(_recorded(STALE, op="broadcast"), world_size=3)["groups"][0]
    assert group["stuck_seq"] == 3 and group["never_joined"] == []
