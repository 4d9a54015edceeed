# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge a fabric search: two-node pair tests -> the culprit node or leaf switch, with its evidence and action.

The decision rule, and its false-accusation control:
- a pair is `slow` when its bus bandwidth is below the baseline by more than gpufleet_fabric_slow_margin (default
  15%: five standard deviations of the few-percent run-to-run spread of a two-node all_reduce), `error` when the
  test could not run or gave no figure (never evidence against anyone), else `pass`;
- a node is `proven` when one of its pair tests passed;
- a leaf switch is blamed when at least gpufleet_fabric_leaf_min_crossing pairs cross it (one end on it), every one
  of them is slow, and pairs inside it ran and none of them is slow: its uplinks, not its nodes;
- a node is accused when it never passed and is slow, not explained by a blamed leaf, with at least
  gpufleet_fabric_accuse_partners different proven partners, one of them on its own leaf (when it has one). A healthy
  node is accused only if noise pushed two of its tests with two different good partners below the margin, and it
  never passed.
`analyse` is the rule; the search (plugin_utils/fabric/search.py) reads it to plan each next round, and `judge`
turns it into findings. Stdlib only.

The result it reads: {"pairs": [{"nodes": [a, b], "round": n, "busbw_gbps": float or None, "error": str or None,
"evidence": [lines], "rails": [{"hca", "gbps" (ib_write_bw, Gb/s) or None, "error", "evidence"}] where the nodes have
InfiniBand}], "leaves": {node: leaf or None}, "link_history": {"a|b" (a < b): {"median_gbps", "runs"}}}
(link_history: the fleet report adds it from the history).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door

CHECK = "fabric"
THRESHOLDS = ("gpufleet_fabric_pair_busbw_gbps", "gpufleet_fabric_slow_margin", "gpufleet_fabric_accuse_partners",
              "gpufleet_fabric_leaf_min_crossing", "gpufleet_fabric_rail_write_gbps")

CODES = {
    "FABRIC_NODE_SLOW": ("fail", "a node slow with gpufleet_fabric_accuse_partners different proven partners and "
                                 "never passing: its NIC, its cable to the leaf or the leaf's port"),
    "FABRIC_LEAF_SLOW": ("fail", "every pair crossing a leaf switch slow while the pairs inside it are not: the "
                                 "leaf's uplinks"),
    "FABRIC_PAIR_ERROR": ("error", "a pair test that could not run or gave no figure: neither node is accused"),
    "FABRIC_PAIR_SLOW": ("warn", "a slow pair that no accused node or blamed leaf explains (an intermittent fault, "
                                 "or the search ran out of rounds or partners)"),
    "FABRIC_LINK_DEGRADED": ("warn", "a pair that passed, but below its own link's median of at least "
                                     "LINK_MIN_RUNS earlier runs by more than gpufleet_fabric_slow_margin: a link "
                                     "slower than it used to be"),
    "FABRIC_RAIL_SLOW": ("warn", "one InfiniBand rail of a pair (ib_write_bw between the two nodes' HCAs of that rail) "
                                 "below gpufleet_fabric_rail_write_gbps by more than gpufleet_fabric_slow_margin"),
    "FABRIC_RAIL_ERROR": ("error", "a rail's ib_write_bw that could not run or gave no figure: neither node is accused"),
    "FABRIC_GROUP_SLOW": ("fail", "a group of nodes (a leaf's, bisected) slow together while each half of it passes: a "
                                  "fault that shows only at scale"),
    "FABRIC_NO_BASELINE": ("error", "no baseline: gpufleet_fabric_pair_busbw_gbps unset and too few pair figures "
                                    "for the run's own median"),
}

# Pair figures the run's median needs before it can stand in for an unset baseline.
MEDIAN_MIN_PAIRS = 4
# Errored pair tests after which a node is no longer retried in the same search.
MAX_ERRORS = 2
# Earlier figures of a link (in the history) before its own median can judge it.
LINK_MIN_RUNS = 3


def _median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0


def baseline(pairs, t):
    """(baseline GB/s or None, where it comes from). The inventory's figure, else the median of the first round's
    figures: the fleet's own typical pair, sound while fewer than half the first round's pairs are faulty."""
    explicit = t.get("gpufleet_fabric_pair_busbw_gbps")
    if explicit is not None:
        return float(explicit), "gpufleet_fabric_pair_busbw_gbps"
    first = min([p.get("round", 1) for p in pairs] or [1])
    figures = [p["busbw_gbps"] for p in pairs if p.get("round", 1) == first and _figure(p) is not None]
    if len(figures) < MEDIAN_MIN_PAIRS:
        return None, ("gpufleet_fabric_pair_busbw_gbps is unset and round %d has %d pair figures (%d needed for the "
                      "run's median)" % (first, len(figures), MEDIAN_MIN_PAIRS))
    return _median(figures), "the median of round %d's %d pair figures" % (first, len(figures))


def _figure(pair):
    value = pair.get("busbw_gbps")
    if pair.get("error") or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def status(pair, floor):
    """pass, slow or error: one pair test against the floor."""
    value = _figure(pair)
    if value is None or floor is None:
        return "error"
    return "slow" if value < floor else "pass"


def _leaf_names(leaves):
    return sorted(set(v for v in leaves.values() if v))


def _leaf_rule(leaf, pairs, states, leaves, min_crossing, without):
    """{crossing, inside} pair indexes when the leaf is to blame: at least min_crossing pairs cross it, all slow, and
    pairs inside it ran, none slow; pairs with a node of `without` (the leaf's accused nodes) left out. None otherwise."""
    ran = [i for i, p in enumerate(pairs) if states[i] != "error" and not any(n in without for n in p["nodes"])]
    crossing = [i for i in ran if sum(leaves.get(n) == leaf for n in pairs[i]["nodes"]) == 1]
    inside = [i for i in ran if all(leaves.get(n) == leaf for n in pairs[i]["nodes"])]
    if (len(crossing) >= min_crossing and all(states[i] == "slow" for i in crossing)
            and inside and not any(states[i] == "slow" for i in inside)):
        return {"crossing": crossing, "inside": inside}
    return None


def _accuse(pairs, states, leaves, passed, need, blamed):
    """({accused node: [slow pair index]}, {node: proven slow partners}) with the blamed leaves' crossing pairs
    explained (evidence against nobody)."""
    explained = set(i for seen in blamed.values() for i in seen["crossing"])
    slow_partners, slow_pairs = {}, {}
    for i, pair in enumerate(pairs):
        if states[i] != "slow" or i in explained:
            continue
        a, b = pair["nodes"]
        for node, other in ((a, b), (b, a)):
            slow_pairs.setdefault(node, []).append(i)
            if other in passed:
                slow_partners.setdefault(node, set()).add(other)
    # A node on a leaf needs one of those partners on its own leaf: a pair inside a leaf does not touch its uplinks,
    # so a leaf fault the rule above could not pin (too few pairs) never turns into accusations of its nodes.
    accused = dict((node, slow_pairs[node]) for node, partners in slow_partners.items()
                   if len(partners) >= need and node not in passed
                   and (not leaves.get(node) or any(leaves.get(p) == leaves[node] for p in partners)))
    return accused, slow_partners


def analyse(result, t):
    """The rule applied to every pair so far: {baseline, floor, source, status [per pair], proven,
    leaves_blamed {leaf: {crossing, inside}}, accused {node: [pair index]}, slow_partners {node: set},
    suspects [nodes the next round tests], unresolved [pair index]}."""
    pairs = result.get("pairs") or []
    leaves = result.get("leaves") or {}
    margin = float(t.get("gpufleet_fabric_slow_margin"))
    need = int(t.get("gpufleet_fabric_accuse_partners"))
    min_crossing = int(t.get("gpufleet_fabric_leaf_min_crossing"))
    base, source = baseline(pairs, t)
    floor = base * (1.0 - margin) if base is not None else None
    states = [status(p, floor) for p in pairs]
    passed = set(n for i, p in enumerate(pairs) if states[i] == "pass" for n in p["nodes"])

    blamed = dict((leaf, seen) for leaf, seen in
                  ((leaf, _leaf_rule(leaf, pairs, states, leaves, min_crossing, ())) for leaf in _leaf_names(leaves))
                  if seen)
    accused, slow_partners = _accuse(pairs, states, leaves, passed, need, blamed)
    # A bad node on a bad leaf: its slow pairs inside the leaf keep the plain rule from blaming the leaf. The rule
    # holds again without the pairs of the leaf's accused nodes, and the leaf is blamed when those nodes stay accused
    # on the rest of their evidence (the leaf's crossing pairs then count against nobody).
    for leaf in _leaf_names(leaves):
        without = [n for n in accused if leaves.get(n) == leaf]
        seen = _leaf_rule(leaf, pairs, states, leaves, min_crossing, without) if leaf not in blamed and without else None
        if not seen:
            continue
        trial = dict(blamed, **{leaf: seen})
        still, partners = _accuse(pairs, states, leaves, passed, need, trial)
        if all(n in still for n in without):
            blamed, accused, slow_partners = trial, still, partners
    explained = set(i for seen in blamed.values() for i in seen["crossing"])

    # Who the next round tests: members of slow pairs (explained by a leaf or not: a leaf's verdict is confirmed by
    # its nodes passing inside it), members of errored pairs (up to MAX_ERRORS errors each: a node that keeps
    # failing to run is reported, not retried forever), and nodes not tested yet; none that passed or is accused.
    tested = set(n for p in pairs for n in p["nodes"])
    slow_members = set(n for i, p in enumerate(pairs) if states[i] == "slow" for n in p["nodes"])
    errors = {}
    for i, pair in enumerate(pairs):
        for node in pair["nodes"] if states[i] == "error" else ():
            errors[node] = errors.get(node, 0) + 1
    error_members = set(n for n, count in errors.items() if count < MAX_ERRORS)
    suspects = sorted((slow_members | error_members | (set(leaves) - tested)) - passed - set(accused))
    unresolved = [i for i, p in enumerate(pairs) if states[i] == "slow" and i not in explained
                  and not any(n in accused for n in p["nodes"])]
    return {"baseline": base, "floor": floor, "source": source, "status": states, "proven": passed,
            "leaves_blamed": blamed, "accused": accused, "slow_partners": slow_partners, "suspects": suspects,
            "unresolved": unresolved}


def analyse_groups(groups, floor):
    """The bisection's rule (docs/fabric.md): {status [per group], slow [index], at_scale [{group, halves}]}: a slow
    group both of whose halves ran and passed is where the fault shows, at that size and not below."""
    states = [status(g, floor) for g in groups]
    index = dict((tuple(sorted(g["nodes"])), i) for i, g in enumerate(groups))
    at_scale = []
    for i, group in enumerate(groups):
        nodes = sorted(group["nodes"])
        halves = [index.get(tuple(nodes[:len(nodes) // 2])), index.get(tuple(nodes[len(nodes) // 2:]))]
        if states[i] == "slow" and None not in halves and all(states[j] == "pass" for j in halves):
            at_scale.append({"group": i, "halves": halves})
    return {"status": states, "slow": [i for i, s in enumerate(states) if s == "slow"], "at_scale": at_scale}


def _line(pair, state):
    """One test's evidence line: a pair's two nodes, or a group's."""
    figure = _figure(pair)
    shown = "%.1f GB/s" % figure if figure is not None else "no figure (%s)" % (pair.get("error") or "none")
    return "round %s %s: %s %s" % (pair.get("round", 1), " <-> ".join(pair["nodes"]), shown, state)


def _where(node, leaves):
    leaf = leaves.get(node)
    return " to leaf %s" % leaf if leaf else ""


@judge_door(CHECK)
def judge(result, t, host="the fabric"):
    """[finding] for the pairs of one fabric search (host: the name findings without a node use)."""
    return [f for _subjects, f in attributed(result, t, host)]


def attributed(result, t, host="the fabric"):
    """[(subjects, finding)]: judge's findings, each with the nodes on whose report rows it belongs: the accused node;
    the nodes of an errored or unexplained slow pair that never passed (a node proven by another test is not in
    doubt); every node when there is no baseline; none for a blamed leaf (its nodes are not accused)."""
    pairs = result.get("pairs") or []
    leaves = result.get("leaves") or {}
    a = analyse(result, t)
    out = []
    if a["floor"] is None:
        out.append((sorted(set(leaves) | set(n for p in pairs for n in p["nodes"])),
                    finding("error", "FABRIC_NO_BASELINE", "%s: no pair can be judged: %s" % (host, a["source"]),
                            "set gpufleet_fabric_pair_busbw_gbps to the two-node all_reduce busbw of two known-good "
                            "nodes of this platform, or test at least %d pairs" % (2 * MEDIAN_MIN_PAIRS),
                            [_line(p, "unjudged") for p in pairs[:10]])))
        return out
    floor = "%.1f GB/s (baseline %.1f GB/s from %s, less %g%%)" % (
        a["floor"], a["baseline"], a["source"], 100 * float(t.get("gpufleet_fabric_slow_margin")))

    def in_doubt(nodes):
        return [n for n in nodes if n not in a["proven"]]

    for leaf, seen in sorted(a["leaves_blamed"].items()):
        out.append(([], finding("fail", "FABRIC_LEAF_SLOW", "leaf switch %s: all %d pairs crossing it are below %s, "
                                "the %d pairs inside it are not: its uplinks are slow" % (
                                    leaf, len(seen["crossing"]), floor, len(seen["inside"])),
                                "check the uplinks of leaf %s to the spine (port counters, optics, cables, the leaf's "
                                "logs); its nodes are not accused" % leaf,
                                [_line(pairs[i], a["status"][i]) for i in seen["crossing"] + seen["inside"]])))
    for node in sorted(a["accused"]):
        partners = sorted(a["slow_partners"][node])
        out.append(([node], finding("fail", "FABRIC_NODE_SLOW", "%s: slow with %d different good partners (%s), "
                                    "below %s, and never passed" % (node, len(partners), ", ".join(partners), floor),
                                    "on %s check the NIC rails, their cables%s and the switch ports (ibstat, the port "
                                    "error counters): reseat or replace the cable or the NIC of the slow rail, then "
                                    "rerun the fabric search" % (node, _where(node, leaves)),
                                    [_line(pairs[i], "slow") for i in a["accused"][node]])))
    for i in a["unresolved"]:
        x, y = pairs[i]["nodes"]
        out.append((in_doubt([x, y]), finding(
            "warn", "FABRIC_PAIR_SLOW", "pair %s <-> %s: below %s, but neither node nor a leaf is proven at fault"
            % (x, y, floor), "rerun the fabric search; if the pair stays slow check the path between %s and %s "
            "(both nodes' ports and the switches between them)" % (x, y), [_line(pairs[i], "slow")])))
    out.extend(_rails(pairs, a, t, in_doubt))
    groups = result.get("groups") or []
    for seen in analyse_groups(groups, a["floor"])["at_scale"]:
        group = groups[seen["group"]]
        out.append(([], finding(
            "fail", "FABRIC_GROUP_SLOW", "the %d nodes %s together are below %s, each half of them passes: a fault "
            "that shows only at scale" % (len(group["nodes"]), ", ".join(sorted(group["nodes"])), floor),
            "check the switch these nodes share under load (its buffers, firmware, congestion control and logs); no "
            "single node is accused", [_line(groups[j], "pass") for j in seen["halves"]]
            + [_line(group, "slow")] + list(group.get("evidence") or [])[:1])))
    history = result.get("link_history") or {}
    for i, pair in enumerate(pairs):
        seen = history.get("|".join(sorted(pair["nodes"]))) or {}
        if a["status"][i] != "pass" or (seen.get("runs") or 0) < LINK_MIN_RUNS:
            continue
        own_floor = float(seen["median_gbps"]) * (1.0 - float(t.get("gpufleet_fabric_slow_margin")))
        if pair["busbw_gbps"] < own_floor:
            x, y = pair["nodes"]
            out.append(([x, y], finding(
                "warn", "FABRIC_LINK_DEGRADED", "link %s <-> %s: %.1f GB/s, below its own median of %.1f GB/s over %d "
                "earlier runs by more than %g%% (it still passes the fabric's floor)" % (
                    x, y, pair["busbw_gbps"], seen["median_gbps"], seen["runs"],
                    100 * float(t.get("gpufleet_fabric_slow_margin"))),
                "check the ports, cables and error counters of %s and %s on the path between them (ibstat, the "
                "port counters) before it gets worse; rerun the fabric search" % (x, y), [_line(pair, "pass")])))
    for i, pair in enumerate(pairs):
        if a["status"][i] == "error":
            x, y = pair["nodes"]
            out.append((in_doubt([x, y]), finding(
                "error", "FABRIC_PAIR_ERROR", "pair %s <-> %s: the test gave no figure (%s): neither node is accused"
                % (x, y, pair.get("error") or "no bus bandwidth"),
                "make the pair test run between %s and %s (SSH, mpirun, the test binary on both), then rerun the "
                "fabric search" % (x, y), list(pair.get("evidence") or [])[-5:] + [_line(pair, "error")])))
    return out


def _rails(pairs, a, t, in_doubt):
    """[(subjects, finding)] of the pairs' per-rail ib_write_bw figures against gpufleet_fabric_rail_write_gbps: a
    slow rail names the pair's accused node when it has one (which rail of the culprit), else its nodes in doubt."""
    expected = t.get("gpufleet_fabric_rail_write_gbps")
    margin = float(t.get("gpufleet_fabric_slow_margin"))
    out = []
    for pair in pairs:
        x, y = pair["nodes"]
        named = [n for n in (x, y) if n in a["accused"]] or in_doubt([x, y])
        for rail in pair.get("rails") or []:
            gbps, hca = rail.get("gbps"), rail.get("hca")
            if rail.get("error") or not isinstance(gbps, (int, float)) or isinstance(gbps, bool):
                out.append((in_doubt([x, y]), finding(
                    "error", "FABRIC_RAIL_ERROR", "pair %s <-> %s rail %s: ib_write_bw gave no figure (%s): neither "
                    "node is accused" % (x, y, hca, rail.get("error") or "no bandwidth"),
                    "make ib_write_bw run between %s and %s on %s (perftest installed on both, the HCA up, the "
                    "server reachable), then rerun the fabric search" % (x, y, hca), list(rail.get("evidence") or [])[-5:])))
            elif expected is not None and gbps < float(expected) * (1.0 - margin):
                out.append((named, finding(
                    "warn", "FABRIC_RAIL_SLOW", "pair %s <-> %s rail %s: %.1f Gb/s, below %.1f Gb/s "
                    "(gpufleet_fabric_rail_write_gbps %g less %g%%)" % (
                        x, y, hca, gbps, float(expected) * (1.0 - margin), float(expected), 100 * margin),
                    "check %s on %s: ibstat and the port counters, the cable to the leaf; reseat or replace the "
                    "cable or the NIC of that rail" % (hca, " and ".join(named) or "%s and %s" % (x, y)),
                    list(rail.get("evidence") or [])[-5:] + ["round %s %s <-> %s %s: %.1f Gb/s" % (
                        pair.get("round", 1), x, y, hca, gbps)])))
    return out
