"""The fabric search's rounds against the simulated fabric: culprits named in bounded rounds, nobody healthy or
untestable accused (property tests over random faults), the first round's plan."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_fabric
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.fabric import search
from gpufleet_sim.ib_fabric import Fabric
from hypothesis import given, settings
from hypothesis import strategies as st

T = complete({"gpufleet_fabric_pair_busbw_gbps": 46.0})


def fleet(leaves=8, per_leaf=8):
    return dict(("l%dn%d" % (i, j), "leaf%d" % i) for i in range(leaves) for j in range(per_leaf))


def run(leaves, faults, noise=0.03, seed=0, t=T):
    by_leaf = {}
    for node, leaf in leaves.items():
        by_leaf.setdefault(leaf, []).append(node)
    fabric = Fabric({"leaves": by_leaf, "faults": faults, "noise": noise, "seed": seed})

    def run_round(rnd, plan):
        return [dict(fabric.pair(a, b, rnd), nodes=[a, b]) for a, b in plan]

    result = search.search(leaves, run_round, t, max_rounds=6, seed=seed)
    return result, judge_fabric.analyse(result, t)


def test_first_round_pairs_every_node_once_inside_and_across_each_leaf():
    leaves = fleet()
    plan = search.first_round(leaves)
    nodes = [n for p in plan for n in p]
    assert sorted(nodes) == sorted(leaves)
    for leaf in set(leaves.values()):
        inside = [p for p in plan if leaves[p[0]] == leaves[p[1]] == leaf]
        crossing = [p for p in plan if (leaves[p[0]] == leaf) != (leaves[p[1]] == leaf)]
        other_leaves = [leaves[p[1]] if leaves[p[0]] == leaf else leaves[p[0]] for p in crossing]
        assert len(inside) == 2 and len(crossing) == 4
        assert len(set(other_leaves)) == 4, "a leaf's crossing pairs go to different leaves"


def test_an_odd_node_out_is_tested_in_round_two():
    leaves = dict(("n%d" % i, None) for i in range(5))
    result, a = run(leaves, [])
    assert result["rounds"] == 2 and a["accused"] == {} and a["proven"] == set(leaves)


def test_one_slow_nic_is_found_in_two_rounds():
    result, a = run(fleet(), [{"kind": "slow_nic", "node": "l3n5", "rail": 2, "factor": 0.5}])
    assert sorted(a["accused"]) == ["l3n5"] and result["rounds"] <= 2


def test_two_bad_nodes_paired_with_each_other_are_found_in_three_rounds():
    leaves = fleet()
    a0, b0 = search.first_round(leaves)[0]
    result, a = run(leaves, [{"kind": "bad_cable", "node": a0, "rail": 0, "factor": 0.6},
                             {"kind": "slow_nic", "node": b0, "rail": 7, "factor": 0.4}])
    assert sorted(a["accused"]) == sorted([a0, b0]) and result["rounds"] == 3


def test_a_bad_leaf_is_blamed_not_its_nodes():
    result, a = run(fleet(), [{"kind": "bad_leaf", "leaf": "leaf4", "factor": 0.5}])
    assert list(a["leaves_blamed"]) == ["leaf4"] and a["accused"] == {} and result["rounds"] <= 2


# Wherever the bad node sits on its leaf (inside or crossing pair in round 1) and whatever the noise draws: the leaf's
# few proven nodes go to the node-side suspects first, its other suspects pair with each other, so both culprits are
# named in 3 rounds at most (4 before, when those partners went to the crossing pairs' members).
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("bad", ["l4n%d" % i for i in range(8)])
def test_a_bad_node_on_a_bad_leaf_is_accused_and_the_leaf_blamed_in_three_rounds(bad, seed):
    result, a = run(fleet(), [{"kind": "bad_leaf", "leaf": "leaf4", "factor": 0.5},
                              {"kind": "bad_cable", "node": bad, "rail": 1, "factor": 0.6}], seed=seed)
    assert list(a["leaves_blamed"]) == ["leaf4"] and list(a["accused"]) == [bad] and result["rounds"] <= 3
    assert judge_fabric.judge(result, T) and not a["unresolved"]


def test_a_flapping_port_is_an_error_never_an_accusation():
    result, a = run(fleet(), [{"kind": "flapping_port", "node": "l1n1", "rail": 3, "p_down": 1.0}])
    errors = [p for p, s in zip(result["pairs"], a["status"], strict=True) if s == "error"]
    assert errors and all("l1n1" in p["nodes"] for p in errors) and a["accused"] == {}


@st.composite
def faulty_fabrics(draw):
    n_leaves, per_leaf = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    leaves = fleet(n_leaves, per_leaf)
    nodes = sorted(leaves)
    faults = []
    for node in draw(st.lists(st.sampled_from(nodes), max_size=4, unique=True)):
        kind = draw(st.sampled_from(["slow_nic", "bad_cable", "flapping_port"]))
        fault = {"kind": kind, "node": node, "rail": draw(st.integers(0, 7))}
        fault.update({"p_down": draw(st.floats(0.1, 1.0))} if kind == "flapping_port"
                     else {"factor": draw(st.floats(0.05, 0.8))})
        faults.append(fault)
    if draw(st.booleans()):
        faults.append({"kind": "bad_leaf", "leaf": draw(st.sampled_from(sorted(set(leaves.values())))),
                       "factor": draw(st.floats(0.05, 0.8))})
    return leaves, faults, draw(st.integers(0, 1000))


@settings(max_examples=200, deadline=None)
@given(faulty_fabrics())
def test_no_healthy_or_untestable_node_is_ever_accused(case):
    leaves, faults, seed = case
    result, a = run(leaves, faults, noise=0.0, seed=seed)
    slow = set(f["node"] for f in faults if f["kind"] in ("slow_nic", "bad_cable"))
    assert set(a["accused"]) <= slow, (faults, a["accused"])
    assert result["rounds"] <= 6


def test_a_malformed_leaf_name_is_refused_before_any_round_naming_the_host():
    ran = []
    with pytest.raises(ValueError, match=r"host n2: gpufleet_fabric_leaf='leaf 1; reboot'"):
        search.search({"n1": "leaf1", "n2": "leaf 1; reboot", "n3": ""}, lambda rnd, plan: ran.append(plan), T)
    assert ran == []
    assert search.leaf_errors({"n1": "leaf-01", "n2": None, "n3": "", "n4": 7}) == [
        "host n4: gpufleet_fabric_leaf=7 is not a leaf switch name (letters, digits and ._:-, at most 64): fix it in "
        "host_vars/group_vars"]


def test_a_fault_that_shows_only_at_scale_is_bisected_to_the_group_where_it_shows():
    leaves = fleet(3, 8)
    by_leaf = {}
    for node, leaf in leaves.items():
        by_leaf.setdefault(leaf, []).append(node)
    fabric = Fabric({"leaves": by_leaf, "noise": 0.03, "seed": 5,
                     "faults": [{"kind": "scale_leaf", "leaf": "leaf1", "min_nodes": 6, "factor": 0.5}]})
    pairs, a = run(leaves, fabric.faults)
    assert a["accused"] == {} and a["leaves_blamed"] == {} and a["unresolved"] == [], "no pair shows it"
    result = search.bisect(leaves, lambda rnd, plan: [fabric.group(g, rnd) for g in plan], a["floor"])
    assert result["rounds"] == 2 and [len(g["nodes"]) for g in result["groups"]] == [8, 8, 8, 4, 4]
    found = judge_fabric.judge(dict(pairs, groups=result["groups"]), T)
    assert [f["code"] for f in found] == ["FABRIC_GROUP_SLOW"]
    assert found[0]["message"].startswith("the 8 nodes %s together are below" % ", ".join(sorted(by_leaf["leaf1"])))


def test_bisection_narrows_a_slow_node_and_never_blames_a_group_for_it():
    leaves = fleet(2, 8)
    by_leaf = {}
    for node, leaf in leaves.items():
        by_leaf.setdefault(leaf, []).append(node)
    fabric = Fabric({"leaves": by_leaf, "noise": 0.0, "faults": [{"kind": "slow_nic", "node": "l0n5", "rail": 2,
                                                                  "factor": 0.5}]})
    result = search.bisect(leaves, lambda rnd, plan: [fabric.group(g, rnd) for g in plan], 46.0 * 0.85)
    assert judge_fabric.analyse_groups(result["groups"], 46.0 * 0.85)["at_scale"] == []
    assert [sorted(g["nodes"]) for g in result["groups"] if g["round"] == 3] == [["l0n4", "l0n5"], ["l0n6", "l0n7"]]
