"""The fabric search's bisection over groups as a user runs it (ansible-playbook playbooks/fabric.yml) on a small
simulated fabric: eight nodes on two leaf switches, one leaf slow only when all four of its nodes run one test
(scale_leaf: no pair shows it). After the pair rounds, every leaf's nodes run one all_reduce_perf together under
mpirun -H a:8,b:8,c:8,d:8, then both halves of the slow one: the leaf's group is FABRIC_GROUP_SLOW in report.json and
no node is accused."""

import pytest
from helpers.fabric_runs import run_fabric
from helpers.playbook_runner import nodes_by_host

pytestmark = pytest.mark.slow

NODES = ["grp%02d" % i for i in range(1, 9)]
LEAVES = {"leaf-1": NODES[:4], "leaf-2": NODES[4:]}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_fabric(tmp_path_factory, "fabric-groups", LEAVES, {
        "seed": 7, "faults": [{"kind": "scale_leaf", "leaf": "leaf-1", "min_nodes": 4, "factor": 0.5}]}, {
        "gpufleet_fabric_pair_busbw_gbps": 46.0, "gpufleet_fabric_pair_timeout_s": 20})


def test_the_leaf_slow_only_at_scale_is_found_by_the_group_rounds(run):
    rc, output, report, _dir = run
    found = [f for f in report["fabric"]["findings"] if f["code"] == "FABRIC_GROUP_SLOW"]
    assert len(found) == 1, output[-3000:]
    assert found[0]["nodes"] == [] and found[0]["severity"] == "fail"
    assert "the 4 nodes %s together are below" % ", ".join(LEAVES["leaf-1"]) in found[0]["message"]
    assert rc != 0 and report["summary"]["gate"]["fabric"] is True


def test_the_groups_ran_from_the_playbook_leaf_then_halves(run):
    _rc, _output, report, _dir = run
    groups = [(g["round"], tuple(g["nodes"]), g["status"]) for g in report["fabric"]["groups"]]
    assert sorted(groups) == [(1, tuple(LEAVES["leaf-1"]), "slow"), (1, tuple(LEAVES["leaf-2"]), "pass"),
                              (2, tuple(NODES[:2]), "pass"), (2, tuple(NODES[2:4]), "pass")]
    assert all(p["status"] == "pass" for p in report["fabric"]["pairs"])


def test_no_node_is_accused(run):
    _rc, _output, report, _dir = run
    nodes = nodes_by_host(report)
    assert {h: n["verdict"] for h, n in nodes.items()} == dict.fromkeys(NODES, "pass")


def test_the_group_test_is_one_mpirun_over_the_leaf_s_nodes(run):
    _rc, _output, report, _dir = run
    found = [f for f in report["fabric"]["findings"] if f["code"] == "FABRIC_GROUP_SLOW"]
    launch = [line for f in found for line in f["evidence"] if line.startswith("on grp01: ")]
    assert launch and "-np 32 " in launch[0] and "-H grp01:8,grp02:8,grp03:8,grp04:8" in launch[0]
