"""The bisection's group rounds as the playbook runs them, one step a call: start_groups after the pair rounds,
record_groups after each group round; a group launched like a pair test (from its first node, -H over all its
nodes, no rail tests)."""

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.fabric import pair_test, search

LEAVES = {"n1": "l1", "n2": "l1", "n3": "l1", "n4": "l1", "m1": "l2", "m2": "l2", "m3": "l2", "m4": "l2", "x": None}
FLOOR = 39.0


def test_a_group_is_launched_from_its_first_node_over_all_its_nodes_without_rails():
    nodes = ["n1", "n2", "n3", "n4"]
    hosts = dict((n, n + ".dc") for n in nodes)
    launch = pair_test.launch(nodes, hosts, dict.fromkeys(nodes, 8), dict.fromkeys(nodes, 60),
                              hcas=dict.fromkeys(nodes, ["mlx5_0"]))
    assert launch["launch_from"] == "n1" and launch["np"] == 32 and launch["rails"] is None
    assert launch["launcher_args"] == ["--allow-run-as-root", "-H", "n1.dc:8,n2.dc:8,n3.dc:8,n4.dc:8"]


def test_the_first_group_round_is_every_leaf_and_none_without_a_floor():
    assert search.start_groups({"leaves": LEAVES}, FLOOR)["group_plan"] == [["n1", "n2", "n3", "n4"],
                                                                             ["m1", "m2", "m3", "m4"]]
    assert search.start_groups({"leaves": LEAVES}, None)["group_plan"] == []


def answer(nodes, gbps=None, error=None):
    return {"nodes": list(nodes), "busbw_gbps": gbps, "error": error, "evidence": ["on %s: mpirun" % nodes[0]]}


def test_a_slow_group_is_halved_and_a_group_without_answer_is_an_error():
    state = search.start_groups({"leaves": LEAVES}, FLOOR)
    search.record_groups(state, [answer(["n1", "n2", "n3", "n4"], 20.0)], FLOOR)
    assert [g["error"] for g in state["groups"]] == [None, "the group test gave no answer"]
    assert state["group_plan"] == [["n1", "n2"], ["n3", "n4"]] and state["group_rounds"] == 1
    search.record_groups(state, [answer(["n1", "n2"], 46.0), answer(["n3", "n4"], 45.0)], FLOOR)
    assert state["group_plan"] == [] and state["group_rounds"] == 2
    assert state["groups"][0]["evidence"] == ["on n1: mpirun"]


def test_the_group_rounds_stop_at_max_rounds():
    state = search.start_groups({"leaves": LEAVES}, FLOOR)
    search.record_groups(state, [answer(["n1", "n2", "n3", "n4"], 20.0)], FLOOR, max_rounds=1)
    assert state["group_plan"] == []
