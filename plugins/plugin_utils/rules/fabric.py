# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""A fabric search (the fabric_search action's result) -> the findings on one node's row, and the report's fabric
section (judge: module_utils/judge_fabric). One search, one rule: every node and the section are judged with the
thresholds the search was planned with (the action refuses hosts that disagree)."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_fabric
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import worst
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete

MODULE = "fabric"
SECTION_VERSION = 1


def _judged(data):
    t = complete(data.get("thresholds") or {})
    return t, judge_fabric.analyse(data, t), judge_fabric.attributed(data, t)


def apply(node, data):
    if node.host not in (data.get("leaves") or {}):
        return  # not in this search
    _t, a, attributed = _judged(data)
    own = [dict(f) for subjects, f in attributed if node.host in subjects]
    mine = [(i, p) for i, p in enumerate(data.get("pairs") or []) if node.host in p["nodes"]]
    figures = {"pair_tests": len(mine), "passed": sum(a["status"][i] == "pass" for i, _p in mine)}
    seen = [p["busbw_gbps"] for i, p in mine if a["status"][i] != "error"]
    if seen:
        figures["best_busbw_gbps"] = max(seen)
    node.judged(MODULE, own, figures, None if mine else "no pair test reached this node", data)


def section(data):
    """The report's fabric section: the pairs (figure and status), the baseline, the findings with the nodes they
    name, the verdict."""
    t, a, attributed = _judged(data)
    findings = [dict(f, nodes=list(subjects)) for subjects, f in attributed]
    for f in findings:
        for key in ("gpu", "pci"):
            f.pop(key, None)
    groups = data.get("groups") or []
    group_states = judge_fabric.analyse_groups(groups, a["floor"])["status"]
    return {
        "version": SECTION_VERSION,
        "verdict": worst([f["severity"] for f in findings], default="pass"),
        "rounds": int(data.get("rounds") or 0),
        "baseline_gbps": a["baseline"],
        "floor_gbps": a["floor"],
        "baseline_source": a["source"],
        "slow_margin": float(t["gpufleet_fabric_slow_margin"]),
        "leaves": dict((n, leaf) for n, leaf in sorted((data.get("leaves") or {}).items())),
        "pairs": [dict({"round": p.get("round", 1), "nodes": list(p["nodes"]), "busbw_gbps": p.get("busbw_gbps"),
                        "status": a["status"][i], "error": p.get("error")},
                       **({"rails": [{"hca": r.get("hca"), "gbps": r.get("gbps"), "error": r.get("error"),
                                      "evidence": list(r.get("evidence") or [])} for r in p["rails"]]}
                          if p.get("rails") else {}))
                  for i, p in enumerate(data.get("pairs") or [])],
        "groups": [{"round": g.get("round", 1), "nodes": list(g["nodes"]), "busbw_gbps": g.get("busbw_gbps"),
                    "status": group_states[i], "error": g.get("error")} for i, g in enumerate(groups)],
        "findings": findings,
    }
