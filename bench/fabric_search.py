#!/usr/bin/env python3
"""How many rounds the fabric search needs, how often it names the culprit, and whether it ever accuses a healthy node.

64 simulated nodes on 8 leaf switches (sim/gpufleet_sim/ib_fabric.py: 8 rails a node, a normal run-to-run noise of
--noise on every pair figure), many seeded trials per fault kind: none, one bad node, two bad nodes (a slow NIC or a
bad cable on a random rail, each at a random factor of --factor-min..--factor-max of its rate), one bad leaf (its
uplinks at such a factor), one bad node on a bad leaf (node_on_leaf: both named), a leaf that slows only when most of
its nodes run one test (scale_leaf: no pair shows it; the bisection over groups must). Each trial runs the search of plugins/plugin_utils/fabric/search.py in-process, every
round's pairs answered by the simulated fabric, and judges it with plugins/module_utils/judge_fabric.py against the
platform baseline (a healthy pair's figure; --baseline median: the run's own median instead), then runs the bisection
over the leaves' groups (search.bisect: every leaf's nodes together, then the halves of each slow group).
Per fault kind: `fabric_search kind=<k> rounds_max=<n> found=<fraction> accused_healthy=<n> trials=<n>` (found: the
accused nodes are exactly the bad ones and the blamed leaf exactly the bad one, nothing when none is bad;
accused_healthy: healthy nodes accused, summed over the trials; group_rounds_max: the bisection's rounds; wrong_group:
groups blamed at scale that are not the scale_leaf's). Then the totals, and the search's wall time in
simulated time: rounds x one pair test (each round's pairs run at once), as a ratio to one pair test.
Goals: one bad node in <= 2 rounds, two in <= 3, a bad leaf (also with a bad node on it) blamed on the leaf in >= 95% of trials, 0 healthy nodes
accused over >= 10,000 trials, a search within 3x one pair test.

Usage: bench/fabric_search.py [--trials 2000] [--nodes 64] [--leaves 8] [--noise 0.03]
"""

import argparse
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(REPO / "sim"))

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_fabric  # noqa: E402
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete  # noqa: E402
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.fabric import search  # noqa: E402
from gpufleet_sim.ib_fabric import Fabric  # noqa: E402

KINDS = ("none", "one_node", "two_nodes", "one_leaf", "node_on_leaf", "scale_leaf")


def trial(kind, seed, args, t):
    rng = random.Random("%s:%s" % (kind, seed))
    per_leaf = args.nodes // args.leaves
    leaves = dict(("leaf%02d-n%02d" % (i, j), "leaf%02d" % i) for i in range(args.leaves) for j in range(per_leaf))
    nodes = sorted(leaves)
    faults, bad_nodes, bad_leaf = [], set(), None
    if kind in ("one_leaf", "node_on_leaf"):
        bad_leaf = rng.choice(sorted(set(leaves.values())))
        faults.append({"kind": "bad_leaf", "leaf": bad_leaf, "factor": rng.uniform(args.factor_min, args.factor_max)})
    if kind in ("one_node", "two_nodes", "node_on_leaf"):
        on = [n for n in nodes if leaves[n] == bad_leaf] if bad_leaf else nodes
        bad_nodes = set(rng.sample(on, 2 if kind == "two_nodes" else 1))
    if kind == "scale_leaf":
        # The leaf slows only when most of its nodes run one test: no pair shows it, the bisection over groups must.
        bad_leaf = rng.choice(sorted(set(leaves.values())))
        faults.append({"kind": "scale_leaf", "leaf": bad_leaf, "min_nodes": max(2, per_leaf - 2),
                       "factor": rng.uniform(args.factor_min, args.factor_max)})
    if bad_nodes:
        for node in sorted(bad_nodes):
            faults.append({"kind": rng.choice(("slow_nic", "bad_cable")), "node": node,
                           "rail": rng.randrange(8), "factor": rng.uniform(args.factor_min, args.factor_max)})
    by_leaf = {}
    for node, leaf in leaves.items():
        by_leaf.setdefault(leaf, []).append(node)
    fabric = Fabric({"leaves": by_leaf, "faults": faults, "noise": args.noise, "seed": "%s:%s" % (kind, seed)})

    def run_round(rnd, plan):
        return [dict(fabric.pair(a, b, rnd), nodes=[a, b]) for a, b in plan]

    result = search.search(leaves, run_round, t, max_rounds=args.max_rounds, seed=seed)
    analysis = judge_fabric.analyse(result, t)
    accused, blamed = set(analysis["accused"]), set(analysis["leaves_blamed"])
    # Then the bisection over the leaves' groups, every leaf's nodes together.
    groups = search.bisect(leaves, lambda rnd, plan: [fabric.group(g, "g%d" % rnd) for g in plan], analysis["floor"],
                           max_rounds=args.max_rounds)
    at_scale = [frozenset(groups["groups"][g["group"]]["nodes"])
                for g in judge_fabric.analyse_groups(groups["groups"], analysis["floor"])["at_scale"]]
    if kind == "scale_leaf":
        found = not accused and not blamed and at_scale == [frozenset(n for n in nodes if leaves[n] == bad_leaf)]
        wrong_group = len(at_scale) - (1 if found else 0)
    else:
        found = accused == bad_nodes and blamed == ({bad_leaf} if bad_leaf else set()) and not at_scale
        wrong_group = len(at_scale)
    wrong_leaf = len(blamed - ({bad_leaf} if kind != "scale_leaf" else set()))
    return result["rounds"], found, len(accused - bad_nodes), wrong_leaf, groups["rounds"], wrong_group


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000, help="trials per fault kind")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--leaves", type=int, default=8)
    parser.add_argument("--noise", type=float, default=0.03, help="standard deviation of the run-to-run noise")
    parser.add_argument("--factor-min", type=float, default=0.3)
    parser.add_argument("--factor-max", type=float, default=0.75)
    parser.add_argument("--max-rounds", type=int, default=4)
    parser.add_argument("--baseline", choices=("platform", "median"), default="platform")
    parser.add_argument("--pair-test-s", type=float, default=120.0,
                        help="one two-node all_reduce_perf sweep, seconds (the simulated time unit)")
    args = parser.parse_args(argv)
    fabric = Fabric({})
    t = complete({"gpufleet_fabric_pair_busbw_gbps": fabric.healthy_gbps() if args.baseline == "platform" else None})
    print("fabric_search nodes=%d leaves=%d noise=%g fault_factor=%g..%g margin=%g accuse_partners=%d baseline=%s" % (
        args.nodes, args.leaves, args.noise, args.factor_min, args.factor_max, t["gpufleet_fabric_slow_margin"],
        t["gpufleet_fabric_accuse_partners"], args.baseline))
    totals = {"trials": 0, "accused_healthy": 0, "wrong_leaf": 0, "rounds_max": 0, "wrong_group": 0}
    start = time.process_time()
    for k, kind in enumerate(KINDS):
        rounds_max, found, healthy, wrong_leaf, group_rounds_max, wrong_group = 0, 0, 0, 0, 0, 0
        for i in range(args.trials):
            rounds, ok, accused_healthy, blamed_wrong, group_rounds, group_wrong = trial(kind, k * 1000003 + i, args, t)
            rounds_max = max(rounds_max, rounds)
            group_rounds_max = max(group_rounds_max, group_rounds)
            wrong_group += group_wrong
            found += ok
            healthy += accused_healthy
            wrong_leaf += blamed_wrong
        print("fabric_search kind=%s rounds_max=%d found=%.4f accused_healthy=%d wrong_leaf=%d trials=%d "
              "group_rounds_max=%d wrong_group=%d" % (kind, rounds_max, found / float(args.trials), healthy,
                                                      wrong_leaf, args.trials, group_rounds_max, wrong_group))
        totals["wrong_group"] += wrong_group
        totals["trials"] += args.trials
        totals["accused_healthy"] += healthy
        totals["wrong_leaf"] += wrong_leaf
        totals["rounds_max"] = max(totals["rounds_max"], rounds_max)
    cpu = time.process_time() - start
    print("fabric_search total accused_healthy=%d wrong_leaf=%d wrong_group=%d trials=%d "
          "controller_cpu_ms_per_search=%.2f" % (totals["accused_healthy"], totals["wrong_leaf"], totals["wrong_group"],
                                                 totals["trials"], 1000 * cpu / totals["trials"]))
    rounds = totals["rounds_max"]
    print("fabric_search_time pair_test_s=%g search_s=%g ratio=%d (rounds_max x one pair test; all pairs of %d nodes "
          "in disjoint rounds: %d rounds)" % (args.pair_test_s, rounds * args.pair_test_s, rounds, args.nodes,
                                              args.nodes - 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
