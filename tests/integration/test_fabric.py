"""The fabric search as a user runs it (ansible-playbook playbooks/fabric.yml) on a small simulated fleet with a
fabric: ten nodes on two leaf switches, one with a slow NIC rail, one that SSH cannot reach from its partners, one
whose pair tests hang. The slow node is found and named on its row with its action; no healthy node is accused; the
unreachable and the hung pairs are errors that accuse nobody (the unreachable node's rail tests too)."""

import pytest
from helpers.fabric_runs import run_fabric
from helpers.playbook_runner import codes, nodes_by_host

pytestmark = pytest.mark.slow

NODES = ["fab%02d" % i for i in range(1, 11)]
LEAVES = {"leaf-1": NODES[:5], "leaf-2": NODES[5:]}
SLOW, DOWN, HUNG = "fab03", "fab07", "fab09"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_fabric(tmp_path_factory, "fabric", LEAVES, {
        "seed": 3, "down": [DOWN], "hung": [HUNG],
        "faults": [{"kind": "slow_nic", "node": SLOW, "rail": 5, "factor": 0.5}]}, {
        "gpufleet_fabric_pair_busbw_gbps": 46.0, "gpufleet_fabric_pair_timeout_s": 10,
        "gpufleet_fabric_rail_timeout_s": 10})


def test_the_slow_node_is_found_with_its_evidence_and_action(run):
    rc, output, report, _dir = run
    assert rc != 0 and "FAILED" in output
    nodes = nodes_by_host(report)
    assert nodes[SLOW]["verdict"] == "fail" and codes(nodes[SLOW]) == {"FABRIC_NODE_SLOW"}
    assert nodes[SLOW]["worst"]["action"].startswith("on %s check the NIC rails, their cables to leaf leaf-1" % SLOW)
    culprit = [f for f in report["fabric"]["findings"] if f["code"] == "FABRIC_NODE_SLOW"]
    assert [f["nodes"] for f in culprit] == [[SLOW]]
    assert len(culprit[0]["evidence"]) >= 2 and all(" slow" in line for line in culprit[0]["evidence"])


def test_no_healthy_node_is_accused(run):
    _rc, _output, report, _dir = run
    nodes = nodes_by_host(report)
    assert [h for h, n in nodes.items() if n["verdict"] == "fail"] == [SLOW]
    healthy = set(NODES) - {SLOW, DOWN, HUNG}
    assert {h: nodes[h]["verdict"] for h in healthy} == dict.fromkeys(healthy, "pass")
    assert all(nodes[h]["checks"]["fabric"]["figures"]["passed"] >= 1 for h in healthy)


def test_a_pair_whose_partner_is_unreachable_is_an_error_that_accuses_nobody(run):
    _rc, _output, report, _dir = run
    nodes = nodes_by_host(report)
    assert nodes[DOWN]["verdict"] == "error" and "FABRIC_PAIR_ERROR" in codes(nodes[DOWN])
    assert codes(nodes[DOWN]) <= {"FABRIC_PAIR_ERROR", "FABRIC_RAIL_ERROR"}
    errors = [f for f in report["fabric"]["findings"] if f["code"] == "FABRIC_PAIR_ERROR" and DOWN in f["nodes"]]
    assert errors and all("neither node is accused" in f["message"] for f in errors)
    assert any("ssh: connect to host %s port 22: No route to host" % DOWN in f["evidence"] for f in errors)
    # Its rails, where it was the server: perftest's own words after the client's bounded connect retry.
    rails = [f for f in report["fabric"]["findings"] if f["code"] == "FABRIC_RAIL_ERROR"]
    assert all(DOWN in f["message"] and "Couldn't connect to %s:185" % DOWN in f["message"] for f in rails)


def test_a_pair_test_that_hangs_is_killed_at_its_timeout_and_is_an_error(run):
    _rc, _output, report, _dir = run
    nodes = nodes_by_host(report)
    assert nodes[HUNG]["verdict"] == "error" and codes(nodes[HUNG]) == {"FABRIC_PAIR_ERROR"}
    hung = [p for p in report["fabric"]["pairs"] if HUNG in p["nodes"]]
    assert hung and all(p["status"] == "error" and "did not finish within its timeout" in p["error"] for p in hung)


def test_the_report_files_show_the_fabric_section(run):
    _rc, _output, report, latest = run
    assert report["summary"]["gate"]["failed"] and report["fabric"]["verdict"] == "fail"
    assert {p["status"] for p in report["fabric"]["pairs"]} == {"pass", "slow", "error"}
    md = (latest / "report.md").read_text()
    assert "## Fabric: FAIL" in md and "`FABRIC_NODE_SLOW`: %s: slow with" % SLOW in md
    html = (latest / "report.html").read_text()
    assert '<section id="fabric">' in html and 'class="checks matrix"' in html and "FABRIC_NODE_SLOW" in html
