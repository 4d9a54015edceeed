# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Plan the rounds of a fabric search (controller side, pure Python; docs/fabric.md).

Round 1 puts every node in one disjoint pair, all pairs run at once. On each leaf switch (the inventory's
gpufleet_fabric_leaf) about half the nodes pair inside the leaf and half with nodes of other leaves, each leaf's
crossing pairs going to as many different leaves as there are: so a slow leaf (every crossing pair slow, the inside
pairs not) is told from a slow node, and never confused with the leaf at the other end. Each later round pairs every
suspect (judge_fabric.analyse: a member of a slow or errored pair that has not passed, or a node not tested yet) with
a partner it has not met (next_round says which first), each node in at most one pair per round. The search ends
when no suspect is left, none can be paired, or after max_rounds. Who is accused is judge_fabric's decision alone.
"""

from __future__ import annotations

import random
import re

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_fabric
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete

# A leaf name reaches reports and commands: letters, digits and ._:- (the spec of gpufleet_fabric_leaf).
LEAF_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:-]{0,63}\Z")


def leaf_errors(leaves):
    """Messages for every node whose leaf name is not a clean name (empty or None: the node has no leaf)."""
    return ["host %s: gpufleet_fabric_leaf=%r is not a leaf switch name (letters, digits and ._:-, at most 64): fix "
            "it in host_vars/group_vars" % (node, leaf) for node, leaf in sorted(leaves.items())
            if leaf not in (None, "") and not (isinstance(leaf, str) and LEAF_NAME.match(leaf))]


def _by_leaf(leaves):
    groups = {}
    for node in sorted(leaves):
        groups.setdefault(leaves[node], []).append(node)
    return groups


def first_round(leaves, seed=0):
    """[(a, b)] disjoint pairs over every node of `leaves` ({node: leaf or None}); an odd node out waits for round 2.
    seed: the order of nodes inside each leaf (the same seed gives the same plan)."""
    rng = random.Random(seed)
    pairs, crossing = [], {}
    for leaf, nodes in sorted(_by_leaf(leaves).items(), key=lambda kv: str(kv[0])):
        nodes = list(nodes)
        rng.shuffle(nodes)
        # A leaf needs pairs inside it and pairs leaving it to be judged; nodes without a leaf all pair across.
        inside = 2 * (len(nodes) // 4) if leaf is not None else 0
        pairs.extend((nodes[i], nodes[i + 1]) for i in range(0, inside, 2))
        if nodes[inside:]:
            crossing[leaf] = nodes[inside:]
    met = set()
    while sum(len(v) for v in crossing.values()) > 1:
        # The leaf with most nodes left goes first; its partner leaf is the fullest one it has not met yet.
        order = sorted(crossing, key=lambda k: (-len(crossing[k]), str(k)))
        leaf = order[0]
        others = [k for k in order[1:] if (leaf, k) not in met] or order[1:]
        other = others[0] if others else leaf  # one leaf left: pair inside it
        if other == leaf and len(crossing[leaf]) < 2:
            break
        a = crossing[leaf].pop()
        b = crossing[other].pop()
        met.update([(leaf, other), (other, leaf)])
        pairs.append((a, b))
        for k in {leaf, other}:
            if not crossing[k]:
                del crossing[k]
    return pairs


def next_round(result, t):
    """[(suspect, partner)] for the next round, from the pairs so far; [] when the search is done.

    Each suspect's partner is, in this order: a proven node on its own leaf (a pair that does not touch the leaf's
    uplinks), another suspect of its leaf (a pass proves both; a slow pair counts against neither, only proven
    partners do), a proven node elsewhere. Proven partners on a slow leaf are scarce, so they go first to the
    suspects of a slow pair inside their leaf: that evidence points at a node, not at the uplinks, and such a
    suspect is never paired with another suspect."""
    t = complete(t)
    analysis = judge_fabric.analyse(result, t)
    if analysis["floor"] is None:
        return []
    leaves = result.get("leaves") or {}
    met, inside_slow = set(), set()
    for i, pair in enumerate(result.get("pairs") or []):
        a, b = pair["nodes"]
        met.update([(a, b), (b, a)])
        if analysis["status"][i] == "slow" and leaves.get(a) is not None and leaves.get(a) == leaves.get(b):
            inside_slow.update([a, b])
    proven = sorted(set(analysis["proven"]) - set(analysis["accused"]))
    suspects = sorted(analysis["suspects"], key=lambda n: (n not in inside_slow, n))
    pairable = [n for n in suspects if n not in inside_slow]  # the suspects another suspect may pair with
    busy, out = set(), []

    def free(nodes, node, same_leaf):
        return [p for p in nodes if p not in busy and p != node and (node, p) not in met
                and (not same_leaf or (leaves.get(node) is not None and leaves.get(p) == leaves.get(node)))]

    for node in suspects:
        if node in busy:
            continue
        choices = (free(proven, node, True) or ([] if node in inside_slow else free(pairable, node, True))
                   or free(proven, node, False))
        if choices:
            busy.update([node, choices[0]])
            out.append((node, choices[0]))
    return out


def start(leaves, seed=0):
    """The search before any round: {"pairs": [], "leaves", "rounds": 0, "plan": round 1's pairs}. ValueError (every
    bad leaf name) before any round."""
    errors = leaf_errors(leaves)
    if errors:
        raise ValueError("; ".join(errors))
    leaves = dict((node, leaf or None) for node, leaf in leaves.items())
    return {"pairs": [], "leaves": leaves, "rounds": 0, "plan": [list(p) for p in first_round(leaves, seed)]}


def record(result, answers, t, max_rounds=4):
    """Record the answers to result["plan"] as the next round, then plan the one after (result["plan"]: [] when the
    search is done). answers: [{"nodes": [a, b], "busbw_gbps", "error", "evidence", "rails" (optional)}]; a planned pair without an
    answer is recorded as an error (never evidence against anyone)."""
    by_pair = dict((tuple(a["nodes"]), a) for a in answers or [])
    result["rounds"] += 1
    for a, b in result["plan"]:
        answer = by_pair.get((a, b)) or {"error": "the pair test gave no answer", "busbw_gbps": None}
        result["pairs"].append({"nodes": [a, b], "round": result["rounds"], "busbw_gbps": answer.get("busbw_gbps"),
                                "error": answer.get("error"), "evidence": list(answer.get("evidence") or [])})
        if answer.get("rails") is not None:  # the pair's per-rail ib_write_bw, where the nodes have InfiniBand
            result["pairs"][-1]["rails"] = list(answer["rails"])
    result["plan"] = [list(p) for p in next_round(result, t)] if result["rounds"] < max_rounds else []
    return result


def search(leaves, run_round, t, max_rounds=4, seed=0):
    """Run the search in-process: run_round(round_no, [(a, b)]) -> [{"nodes": [a, b], "busbw_gbps", "error",
    "evidence"}] runs one round's pairs (in parallel) and answers each (the playbook runs the same steps, start and
    record, one task each). Returns the judge's input with the rounds run: {"pairs", "leaves", "rounds", "plan"}."""
    result = start(leaves, seed)
    while result["plan"]:
        record(result, run_round(result["rounds"] + 1, [tuple(p) for p in result["plan"]]), t, max_rounds)
    return result


def group_plan(leaves, min_size=4):
    """The bisection's first round: every leaf's nodes as one group (leaves of at least min_size nodes)."""
    return [nodes for leaf, nodes in sorted(_by_leaf(leaves).items(), key=lambda kv: str(kv[0]))
            if leaf is not None and len(nodes) >= min_size]


def next_groups(groups, floor):
    """The halves of every slow group not tested yet (a half of fewer than 2 nodes is the pair tests' job)."""
    tested = set(tuple(sorted(g["nodes"])) for g in groups)
    plan = []
    for i in judge_fabric.analyse_groups(groups, floor)["slow"]:
        nodes = sorted(groups[i]["nodes"])
        if len(nodes) >= 4:
            plan += [h for h in (nodes[:len(nodes) // 2], nodes[len(nodes) // 2:]) if tuple(h) not in tested]
    return plan


def start_groups(result, floor):
    """After the pair rounds: the bisection's state in the search (result["groups"], ["group_rounds"] and
    ["group_plan"]: every leaf's nodes as one group). No plan without a floor (no baseline: nothing can be judged)."""
    result["groups"] = list(result.get("groups") or [])
    result["group_rounds"] = 0
    result["group_plan"] = [list(g) for g in group_plan(result.get("leaves") or {})] if floor is not None else []
    return result


def record_groups(result, answers, floor, max_rounds=4):
    """Record the answers to result["group_plan"] as the next group round ({"nodes", "busbw_gbps", "error",
    "evidence"}; a planned group without one is an error), then plan both halves of every slow group (an empty plan
    after max_rounds)."""
    by_group = dict((tuple(a["nodes"]), a) for a in answers or [])
    result["group_rounds"] += 1
    for nodes in result["group_plan"]:
        answer = by_group.get(tuple(nodes)) or {"error": "the group test gave no answer", "busbw_gbps": None}
        result["groups"].append({"nodes": list(nodes), "round": result["group_rounds"],
                                 "busbw_gbps": answer.get("busbw_gbps"), "error": answer.get("error"),
                                 "evidence": list(answer.get("evidence") or [])})
    result["group_plan"] = ([list(g) for g in next_groups(result["groups"], floor)]
                            if result["group_rounds"] < max_rounds else [])
    return result


def bisect(leaves, run_round, floor, max_rounds=4):
    """Bisection over the leaves for a fault that only shows at scale: round 1 runs every leaf's nodes as one group
    (all groups at once), each later round both halves of every slow group; a slow group whose halves both pass is
    judge_fabric's FABRIC_GROUP_SLOW. run_round(round_no, [[nodes]]) -> [{"busbw_gbps", "error"}] in plan order (the
    playbook runs the same steps, start_groups and record_groups). Returns {"groups": [{"nodes", "round",
    "busbw_gbps", "error", "evidence"}], "rounds"}."""
    result = start_groups({"leaves": leaves}, floor)
    while result["group_plan"]:
        plan = result["group_plan"]
        answers = list(run_round(result["group_rounds"] + 1, plan) or [])
        answers = [dict(answers[i] if i < len(answers) else {}, nodes=list(nodes)) for i, nodes in enumerate(plan)]
        record_groups(result, [a for a in answers if len(a) > 1], floor, max_rounds)
    return {"groups": result["groups"], "rounds": result["group_rounds"]}
