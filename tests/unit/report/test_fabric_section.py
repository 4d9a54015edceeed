"""The fleet report's fabric section: built from a fabric search, valid against report_schema.json, its verdict in the
gate (a blamed leaf is on no node's row), rendered in report.md and report.html; a search that does not match its
schema is an error section, never a pass."""

from ansible_collections.kentino.gpufleet.plugins.plugin_utils import report, rules

LEAVES = dict(("%s%d" % (leaf, i), "leaf-%s" % leaf) for leaf in "abc" for i in range(1, 5))
SLOW_LEAF = [  # leaf-b's uplinks: every pair crossing it slow; the pairs inside the leaves, and a to c, not
    (["a1", "a2"], 46.0), (["b1", "b2"], 45.5), (["c1", "c2"], 46.5), (["a3", "b3"], 22.0), (["b4", "c3"], 23.0),
    (["a4", "c4"], 45.8)]


def search(pairs, **extra):
    return dict({"leaves": LEAVES, "rounds": 1, "thresholds": {"gpufleet_fabric_pair_busbw_gbps": 46.0},
                 "pairs": [{"nodes": n, "round": 1, "busbw_gbps": v, "error": None, "evidence": []} for n, v in pairs]},
                **extra)


def build(fabric, fail_on="fail"):
    hosts = sorted(LEAVES)
    nodes = report.evaluate_fleet(hosts, dict((h, {"gpufleet_result_fabric": fabric}) for h in hosts))
    doc = report.build_report(nodes, "r1", playbook="fabric", fail_on=fail_on)
    report.add_fabric(doc, fabric)
    report.validate_report(doc)
    return doc


def test_a_blamed_leaf_fails_the_gate_without_accusing_its_nodes():
    doc = build(search(SLOW_LEAF))
    assert [f["code"] for f in doc["fabric"]["findings"]] == ["FABRIC_LEAF_SLOW"]
    assert doc["fabric"]["findings"][0]["nodes"] == []
    assert {n["verdict"] for n in doc["nodes"]} == {"pass"}
    assert doc["summary"]["gate"] == {"fail_on": "fail", "failed": True, "fabric": True, "nodes": []}
    assert doc["summary"]["verdict"] == "fail"
    files = report.render_all(doc)
    assert "## Fabric: FAIL" in files["report.md"] and "FAILED: the fabric (see its section)" in files["report.md"]
    assert '<section id="fabric">' in files["report.html"] and "leaf switch leaf-b" in files["report.html"]


def test_a_search_that_does_not_match_its_schema_is_an_error_section_and_an_error_on_every_row():
    doc = build(dict(search(SLOW_LEAF), pairs="not a list"))
    assert doc["fabric"]["verdict"] == "error" and "does not match its schema" in doc["fabric"]["error"]
    assert {n["verdict"] for n in doc["nodes"]} == {"error"}
    assert doc["summary"]["gate"]["failed"]


def test_the_rule_is_a_registered_check():
    assert ("fabric", rules.fabric) in rules.CHECKS


def test_a_pair_error_gates_through_its_node_not_a_second_time_as_the_fabric():
    doc = build(search(SLOW_LEAF[:3] + [(["a3", "b3"], None)]))
    assert [n["host"] for n in doc["nodes"] if n["verdict"] == "error"] == ["a3", "b3"]
    assert doc["summary"]["gate"] == {"fail_on": "fail", "failed": True, "fabric": False, "nodes": ["a3", "b3"]}


HEALTHY = [(["a1", "a2"], 46.0), (["b1", "b2"], 45.5), (["c1", "c2"], 46.5), (["a3", "b3"], 45.0)]


def test_the_pairs_rails_and_the_bisection_s_groups_are_in_the_section_and_a_group_slow_at_scale_gates():
    fabric = search(HEALTHY, groups=[
        {"nodes": ["b1", "b2", "b3", "b4"], "round": 1, "busbw_gbps": 20.0, "error": None,
         "evidence": ["on b1: mpirun -np 32 --allow-run-as-root -H b1:8,b2:8,b3:8,b4:8 all_reduce_perf"]},
        {"nodes": ["b1", "b2"], "round": 2, "busbw_gbps": 46.0, "error": None, "evidence": []},
        {"nodes": ["b3", "b4"], "round": 2, "busbw_gbps": 45.0, "error": None, "evidence": []}],
        group_rounds=2, group_plan=[])
    fabric["pairs"][0]["rails"] = [{"hca": "mlx5_0", "gbps": 391.0, "error": None,
                                    "evidence": ["on a2: ib_write_bw -d mlx5_0 -p 18515 --report_gbits"]}]
    doc = build(fabric)
    assert [(g["nodes"], g["status"]) for g in doc["fabric"]["groups"]] == [
        (["b1", "b2", "b3", "b4"], "slow"), (["b1", "b2"], "pass"), (["b3", "b4"], "pass")]
    assert doc["fabric"]["pairs"][0]["rails"][0]["evidence"] == ["on a2: ib_write_bw -d mlx5_0 -p 18515 --report_gbits"]
    found = [f for f in doc["fabric"]["findings"] if f["code"] == "FABRIC_GROUP_SLOW"]
    assert len(found) == 1 and found[0]["nodes"] == [] and "-H b1:8,b2:8,b3:8,b4:8" in found[0]["evidence"][-1]
    assert doc["summary"]["gate"]["fabric"] and {n["verdict"] for n in doc["nodes"]} == {"pass"}
