"""judge_fabric: the decision rule of the fabric search (who is accused, which leaf is blamed, what is an error)."""

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_fabric
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete

T = complete({"gpufleet_fabric_pair_busbw_gbps": 100.0})


def pair(a, b, gbps, rnd=1, error=None):
    return {"nodes": [a, b], "round": rnd, "busbw_gbps": gbps, "error": error, "evidence": []}


def codes(findings):
    return sorted((f["code"], f["severity"]) for f in findings)


def test_a_node_slow_with_two_proven_partners_is_accused_with_its_evidence():
    result = {"leaves": {"n1": "L1", "n2": "L1", "n3": "L1", "n4": "L1", "n5": "L1", "n6": "L1"},
              "pairs": [pair("n1", "n2", 50.0), pair("n3", "n4", 99.0), pair("n5", "n6", 101.0),
                        pair("n1", "n3", 48.0, 2), pair("n2", "n5", 100.0, 2)]}
    findings = judge_fabric.judge(result, T)
    assert codes(findings) == [("FABRIC_NODE_SLOW", "fail")]
    assert findings[0]["message"].startswith("n1: slow with 2 different good partners (n2, n3)")
    assert "to leaf L1" in findings[0]["action"]
    assert findings[0]["evidence"] == ["round 1 n1 <-> n2: 50.0 GB/s slow", "round 2 n1 <-> n3: 48.0 GB/s slow"]


def test_one_slow_pair_accuses_nobody():
    result = {"leaves": {}, "pairs": [pair("n1", "n2", 50.0), pair("n3", "n4", 99.0)]}
    findings = judge_fabric.judge(result, T)
    assert codes(findings) == [("FABRIC_PAIR_SLOW", "warn")]


def test_a_node_that_passed_once_is_never_accused():
    result = {"leaves": {}, "pairs": [pair("n1", "n2", 50.0), pair("n3", "n4", 99.0), pair("n5", "n6", 99.0),
                                      pair("n1", "n3", 50.0, 2), pair("n1", "n5", 99.0, 3), pair("n2", "n6", 99.0, 3)]}
    assert "n1" not in judge_fabric.analyse(result, T)["accused"]


def test_a_node_whose_tests_could_not_run_is_not_accused():
    result = {"leaves": {}, "pairs": [pair("n1", "n2", None, error="ssh: connect to host n1 port 22: timed out"),
                                      pair("n3", "n4", 99.0), pair("n1", "n3", 0.0, 2, error="mpirun exited 1"),
                                      pair("n1", "n4", 40.0, 3)]}
    findings = judge_fabric.judge(result, T)
    assert codes(findings) == [("FABRIC_PAIR_ERROR", "error")] * 2 + [("FABRIC_PAIR_SLOW", "warn")]
    assert "neither node is accused" in findings[-1]["message"]
    assert "ssh: connect to host n1" in findings[-2]["message"]


def test_every_pair_crossing_a_leaf_slow_and_inside_not_blames_the_leaf_not_its_nodes():
    leaves = dict(("a%d" % i, "A") for i in range(4))
    leaves.update(("b%d" % i, "B") for i in range(4))
    leaves.update(("c%d" % i, "C") for i in range(4))
    pairs = [pair("a0", "a1", 100.0), pair("a2", "b0", 40.0), pair("a3", "c0", 42.0), pair("b1", "b2", 99.0),
             pair("b3", "c1", 101.0), pair("c2", "c3", 100.0),
             pair("a2", "a0", 99.0, 2), pair("a3", "a1", 98.0, 2), pair("b0", "b1", 100.0, 2),
             pair("c0", "c2", 100.0, 2)]
    findings = judge_fabric.judge({"leaves": leaves, "pairs": pairs}, T)
    assert codes(findings) == [("FABRIC_LEAF_SLOW", "fail")]
    assert findings[0]["message"].startswith("leaf switch A: all 2 pairs crossing it are below 85.0 GB/s")


def test_a_slow_pair_inside_the_leaf_keeps_the_leaf_unblamed():
    leaves = {"a0": "A", "a1": "A", "a2": "A", "a3": "A", "b0": "B", "c0": "C"}
    pairs = [pair("a0", "a1", 50.0), pair("a2", "b0", 40.0), pair("a3", "c0", 42.0)]
    assert judge_fabric.analyse({"leaves": leaves, "pairs": pairs}, T)["leaves_blamed"] == {}


def test_slow_only_with_partners_on_other_leaves_is_not_enough_to_accuse_a_node_on_a_leaf():
    leaves = {"a0": "A", "b0": "B", "c0": "C", "b1": "B", "c1": "C"}
    pairs = [pair("b0", "b1", 99.0), pair("c0", "c1", 99.0), pair("a0", "b0", 40.0, 2), pair("a0", "c0", 40.0, 3)]
    assert judge_fabric.analyse({"leaves": leaves, "pairs": pairs}, T)["accused"] == {}


def test_without_a_baseline_the_run_s_median_stands_in_and_with_too_few_figures_nothing_is_judged():
    t = complete({})
    pairs = [pair("n%d" % i, "m%d" % i, g) for i, g in enumerate((100.0, 102.0, 98.0, 101.0, 60.0))]
    a = judge_fabric.analyse({"leaves": {}, "pairs": pairs}, t)
    assert a["baseline"] == 100.0 and a["source"] == "the median of round 1's 5 pair figures"
    assert a["status"] == ["pass"] * 4 + ["slow"]
    findings = judge_fabric.judge({"leaves": {}, "pairs": pairs[:3]}, t)
    assert codes(findings) == [("FABRIC_NO_BASELINE", "error")]


def test_the_margin_is_the_inventory_s():
    pairs = [pair("n1", "n2", 90.0)]
    assert judge_fabric.analyse({"pairs": pairs}, T)["status"] == ["pass"]
    tight = dict(T, gpufleet_fabric_slow_margin=0.05)
    assert judge_fabric.analyse({"pairs": pairs}, tight)["status"] == ["slow"]


def test_findings_sit_on_the_rows_of_the_nodes_they_name_and_never_on_a_proven_node():
    t = complete({"gpufleet_fabric_pair_busbw_gbps": 46.0})
    result = {"leaves": {"a": None, "b": None, "c": None, "d": None, "e": None},
              "pairs": [{"nodes": ["a", "b"], "round": 1, "busbw_gbps": 20.0, "error": None},
                        {"nodes": ["c", "d"], "round": 1, "busbw_gbps": 46.0, "error": None},
                        {"nodes": ["e", "c"], "round": 1, "busbw_gbps": None, "error": "rc=1: ssh"},
                        {"nodes": ["a", "c"], "round": 2, "busbw_gbps": 21.0, "error": None},
                        {"nodes": ["b", "d"], "round": 2, "busbw_gbps": 45.0, "error": None},
                        {"nodes": ["a", "d"], "round": 3, "busbw_gbps": 22.0, "error": None}]}
    placed = dict((f["code"] + ":" + ",".join(sorted(f["message"].split(":")[0].split(" ")[-3:])), subjects)
                  for subjects, f in judge_fabric.attributed(result, t))
    assert placed == {"FABRIC_NODE_SLOW:a": ["a"], "FABRIC_PAIR_ERROR:<->,c,e": ["e"]}


def test_a_bad_node_on_a_bad_leaf_is_accused_and_the_leaf_still_blamed():
    # a1 is slow everywhere (inside its leaf too), leaf A's uplinks are slow: the pairs inside A without a1 pass.
    leaves = dict(("a%d" % i, "A") for i in range(6))
    leaves.update(("b%d" % i, "B") for i in range(4))
    leaves.update(("c%d" % i, "C") for i in range(4))
    pairs = [pair("a0", "a1", 50.0), pair("a2", "a3", 99.0), pair("a4", "b0", 40.0), pair("a5", "c0", 42.0),
             pair("b1", "b2", 99.0), pair("c1", "c2", 100.0), pair("b3", "c3", 98.0),
             pair("a1", "a2", 48.0, 2), pair("a0", "a4", 99.0, 2), pair("b0", "b1", 100.0, 2),
             pair("c0", "c1", 100.0, 2), pair("a5", "a3", 99.0, 2),
             pair("a1", "a3", 47.0, 3)]
    a = judge_fabric.analyse({"leaves": leaves, "pairs": pairs}, T)
    assert list(a["accused"]) == ["a1"] and list(a["leaves_blamed"]) == ["A"]
    findings = judge_fabric.judge({"leaves": leaves, "pairs": pairs}, T)
    assert codes(findings) == [("FABRIC_LEAF_SLOW", "fail"), ("FABRIC_NODE_SLOW", "fail")]


def test_a_leaf_is_not_blamed_through_an_accused_node_whose_only_evidence_is_crossing_pairs():
    # Without a1's pairs only one crossing pair is left: fewer than gpufleet_fabric_leaf_min_crossing.
    leaves = {"a0": "A", "a1": "A", "a2": "A", "a3": "A", "b0": "B", "b1": "B", "c0": "C", "c1": "C"}
    pairs = [pair("a0", "a1", 50.0), pair("a2", "a3", 99.0), pair("a1", "b0", 40.0), pair("a0", "c0", 40.0),
             pair("b1", "c1", 99.0), pair("a1", "a2", 45.0, 2), pair("a1", "a3", 45.0, 3)]
    a = judge_fabric.analyse({"leaves": leaves, "pairs": pairs}, T)
    assert list(a["accused"]) == ["a1"] and a["leaves_blamed"] == {}
