"""The node-side parsers of what torch, NCCL and torch's analyzer print about a hang, on fixtures in the tools' shapes
(tests/fixtures/postmortem_reports/README.md): torch's desync report, NCCL's RAS status, torchfrtrace's output."""

from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.nccl_ras import parse_ras_status
from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_desync_report import parse_desync_report
from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_fr_analysis import parse_fr_analysis

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "postmortem_reports"


def lines(name):
    return (FIXTURES / name).read_text().splitlines()


def test_desync_report_names_the_rank_that_did_not_join_the_next_collective():
    (report,) = parse_desync_report(lines("desync_lagging_rank7.log"))["reports"]
    assert (report["reporter"], report["collective"], report["seq"], report["missing"]) == (0, "ALLREDUCE", 183, [])
    assert report["lagging"] == [{"ranks": [7], "seq": 182, "state": "finished_not_joined", "next_seq": 183}]
    assert report["snapshot_ranks"] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert any("[7] finished collective #182, but didn't join collective #183" in line for line in report["lines"])


def test_desync_report_missing_ranks_and_a_stuck_rank_behind_a_tee_prefix():
    (missing,) = parse_desync_report(lines("desync_missing_rank5.log"))["reports"]
    assert (missing["reporter"], missing["missing"], missing["lagging"]) == (2, [5], [])
    (stuck,) = parse_desync_report(lines("desync_stuck_in_rank5_tee_prefix.log"))["reports"]
    assert stuck["reporter"] == 3 and stuck["lagging"] == [{"ranks": [5], "seq": 1, "state": "joined_not_finished",
                                                            "next_seq": None}]


def test_ras_mismatch_groups_and_their_ranks():
    (comm,) = parse_ras_status(lines("ras_mismatch_two_behind.txt"))["communicators"]
    assert (comm["id"], comm["hash"], comm["kind"]) == ("#0-0", "5c1f0e9a7b3d2e41", "MISMATCH")
    (counts,) = comm["op_counts"]
    assert counts["op"] == "AllReduce"
    assert [(g["operation"], g["ranks_total"], [r["rank"] for r in g["ranks"]]) for g in counts["groups"]] == \
        [(7753, 14, []), (7752, 2, [9, 13])]
    assert counts["groups"][1]["ranks"][0] == {"rank": 9, "gpu": "1", "pid": 48311, "node": "10.0.0.12"}
    (one,) = parse_ras_status(lines("ras_mismatch_one_behind.txt"))["communicators"]
    assert [(g["operation"], [r["rank"] for r in g["ranks"]]) for g in one["op_counts"][0]["groups"]] == \
        [(64, []), (60, [7])]
    assert one["op_counts"][0]["groups"][1]["ranks"][0]["node"] == "node1"


def test_ras_dead_process_and_its_incomplete_communicator():
    parsed = parse_ras_status(lines("ras_dead_process.txt"))
    assert parsed["dead"] == [{"pid": 3487984, "node": "172.16.64.213", "gpus": "5"}]
    (comm,) = parsed["communicators"]
    assert comm["kind"] == "INCOMPLETE" and comm["ranks"] == [{"rank": 29, "gpu": "5", "pid": 3487984,
                                                                "node": "172.16.64.213"}]


def test_fr_analyzer_missing_ranks_in_both_forms_and_a_culprit():
    (old,) = parse_fr_analysis(lines("frtrace_torch25_missing_rank1.txt"))["collectives"]
    assert (old["kind"], old["seq"], old["pg"], old["collective"], old["missing"], old["state"]) == \
        ("missing", 5, "0:default_pg", "nccl:all_reduce", [1], "scheduled")
    missing, errors = parse_fr_analysis(lines("frtrace_torch27_missing_and_errors.txt"))["collectives"]
    assert (missing["seq"], missing["missing"], missing["pg"]) == (7753, [21], "0:default_pg")
    assert (errors["kind"], errors["seq"], errors["pg"], errors["collective"]) == ("errors", 112, "3:tp_group",
                                                                                   "nccl:broadcast")
    assert [c["rank"] for c in errors["culprits"]] == [10]
    assert errors["culprits"][0]["detail"].startswith("Error type: COLLECTIVE_TYPE_MISMATCH")
    one_line = parse_fr_analysis(["Not all ranks joining collective for group 0:default_pg collective nccl:all_reduce "
                                  "Missing ranks are {3, 5}"])["collectives"]
    assert [(c["pg"], c["missing"]) for c in one_line] == [("0:default_pg", [3, 5])]


@pytest.mark.parametrize("parse", [parse_desync_report, parse_ras_status, parse_fr_analysis])
@pytest.mark.parametrize("garbage", [None, [], "", ["\x00\xff", 17, None, ("x",)], ["Rank", "#", "[1] finished"]])
def test_never_raises_and_finds_nothing_in_garbage(parse, garbage):
    out = parse(garbage)
    assert not any(out[k] for k in out)
