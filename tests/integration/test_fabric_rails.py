"""The fabric search's per-rail ib_write_bw as a user runs it (ansible-playbook playbooks/fabric.yml) on a small
simulated fabric: eight nodes with InfiniBand on two leaf switches, one of them with a NIC rail trained at half its
lanes, and a ninth node without InfiniBand. The slow rail is named with its HCA on the slow node's row; the node
without InfiniBand runs its pair tests, no rail test and gets no rail finding."""

import pytest
from helpers.fabric_runs import run_fabric
from helpers.playbook_runner import codes, nodes_by_host

pytestmark = pytest.mark.slow

NODES = ["rail%02d" % i for i in range(1, 9)]
LEAVES = {"leaf-1": NODES[:4], "leaf-2": NODES[4:]}
SLOW, NO_IB = "rail03", "plain01"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_fabric(tmp_path_factory, "fabric-rails", LEAVES, {
        "seed": 5, "faults": [{"kind": "slow_nic", "node": SLOW, "rail": 5, "factor": 0.5}]}, {
        "gpufleet_fabric_pair_busbw_gbps": 46.0, "gpufleet_fabric_rail_write_gbps": 392.0,
        "gpufleet_fabric_pair_timeout_s": 20, "gpufleet_fabric_rail_timeout_s": 20}, no_leaf=[NO_IB])


def test_the_slow_rail_is_named_with_its_hca_on_the_slow_node(run):
    _rc, output, report, _dir = run
    nodes = nodes_by_host(report)
    assert codes(nodes[SLOW]) == {"FABRIC_NODE_SLOW", "FABRIC_RAIL_SLOW"}, output[-3000:]
    rail = [f for f in report["fabric"]["findings"] if f["code"] == "FABRIC_RAIL_SLOW"]
    assert rail and all(f["nodes"] == [SLOW] and " rail mlx5_5: " in f["message"] for f in rail)
    # The command lines of both sides are the evidence.
    assert any(line.startswith("on %s: " % SLOW) and "ib_write_bw -d mlx5_5 -p 18520 --report_gbits" in line
               for f in rail for line in f["evidence"])
    healthy = set(NODES) - {SLOW}
    assert not [h for h in healthy if codes(nodes[h]) & {"FABRIC_RAIL_SLOW", "FABRIC_RAIL_ERROR"}]


def test_every_pair_of_infiniband_nodes_measured_each_rail(run):
    _rc, _output, report, _dir = run
    ib_pairs = [p for p in report["fabric"]["pairs"] if NO_IB not in p["nodes"]]
    assert ib_pairs and all([r["hca"] for r in p["rails"]] == ["mlx5_%d" % i for i in range(8)] for p in ib_pairs)
    healthy = [r for p in ib_pairs if SLOW not in p["nodes"] for r in p["rails"]]
    assert all(r["error"] is None and r["gbps"] > 392 * 0.85 for r in healthy)
    assert all(r["evidence"][0].startswith("on %s: " % p["nodes"][1]) for p in ib_pairs for r in p["rails"])


def test_a_node_without_infiniband_gets_no_rail_test_and_no_rail_finding(run):
    _rc, _output, report, _dir = run
    mine = [p for p in report["fabric"]["pairs"] if NO_IB in p["nodes"]]
    assert mine and all("rails" not in p and p["status"] == "pass" for p in mine)
    assert nodes_by_host(report)[NO_IB]["verdict"] == "pass"
    assert not [f for f in report["fabric"]["findings"] if NO_IB in f["nodes"] or NO_IB in f["message"]]
