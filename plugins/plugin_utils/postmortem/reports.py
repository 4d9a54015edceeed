# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The ranks that torch's desync report, NCCL's RAS status and torch's flight-recorder analyzer name (pure, stdlib only).

The nodes parse them (module_utils/torch_desync_report, nccl_ras, torch_fr_analysis, through job_sources); here each
becomes {rank, basis, reason, host} for verdict.candidates (the reason quotes what the report says):
  desync_report  torch's own store-based analysis: the ranks at the lowest collective (never joined any, joined but
                 did not finish, finished but did not join the next); ignored when it names every rank it saw
  ras_behind     a communicator's ranks at the lowest launched-operation count, when they are the fewer (RAS samples
                 launches on a live job: on a hung one the counts no longer move)
  ras_missing    a communicator's rank that sent RAS no data (its process dead or unreachable)
  fr_missing     the analyzer's "Not all ranks joining collective": the ranks that never joined the collective the
                 others wait in
  fr_mismatch    the analyzer's culprit of a collective that does not match across ranks (type, size, state)
"""

from __future__ import annotations


def _where(item):
    if not item or item.get("pid") is None:
        return ""
    return " (GPU %s, process %s on node %s)" % (item.get("gpu"), item.get("pid"), item.get("node"))


def _desync(report, host):
    out = []
    seen = set(report.get("snapshot_ranks") or [])
    who = "torch's desync report (rank %s's watchdog, %s #%s, on %s)" % (
        report.get("reporter"), report.get("collective") or "collective", report.get("seq"), host)
    for rank in report.get("missing") or []:
        out.append({"rank": rank, "basis": "desync_report",
                    "reason": "%s: rank %d never joined any collective of the process group" % (who, rank)})
    for lag in report.get("lagging") or []:
        ranks = [r for r in lag.get("ranks") or [] if isinstance(r, int)]
        if not ranks or (seen and set(ranks) >= seen):
            continue  # every rank it saw is "behind": it narrows nothing
        for rank in ranks:
            if lag.get("state") == "finished_not_joined":
                what = "finished collective #%s but never joined #%s, where the others wait" % (
                    lag.get("seq"), lag.get("next_seq"))
            else:
                what = "joined collective #%s but never finished it, while the others went on" % lag.get("seq")
            out.append({"rank": rank, "basis": "desync_report",
                        "reason": "%s: rank %d %s" % (who, rank, what)})
    return out


def _ras(comm, host, dead_pids):
    out = []
    label = "NCCL RAS (communicator %s %s, read on %s)" % (comm.get("id"), comm.get("hash"), host)
    for counts in comm.get("op_counts") or []:
        groups = [g for g in counts.get("groups") or [] if isinstance(g.get("operation"), int)]
        if len(groups) < 2:
            continue
        low = min(groups, key=lambda g: g["operation"])
        others = [g for g in groups if g is not low]
        ahead = max(others, key=lambda g: g["operation"])
        if low["ranks_total"] >= sum(g["ranks_total"] for g in others):
            continue  # the majority is behind: the few ahead ran something else, no rank is singled out here
        for item in low.get("ranks") or []:
            out.append({"rank": item["rank"], "basis": "ras_behind",
                        "reason": "%s: rank %d%s has launched up to %s operation %d while %d ranks are at %d" % (
                            label, item["rank"], _where(item), counts.get("op"), low["operation"],
                            ahead["ranks_total"], ahead["operation"])})
    if comm.get("kind") == "INCOMPLETE":
        for item in comm.get("ranks") or []:
            dead = item.get("pid") in dead_pids
            out.append({"rank": item["rank"], "basis": "ras_missing",
                        "reason": "%s: rank %d%s sent no communicator data: its process is %s" % (
                            label, item["rank"], _where(item), "considered dead (unreachable via the RAS network)"
                            if dead else "dead or unreachable")})
    return out


def _fr(block, host):
    out = []
    what = "%s #%s of process group %s" % (block.get("collective") or "collective", block.get("seq"),
                                           block.get("pg") or "?")
    label = "torch's flight-recorder analyzer (read on %s)" % host
    for rank in block.get("missing") or []:
        out.append({"rank": rank, "basis": "fr_missing",
                    "reason": "%s: rank %d never joined %s (state %s)" % (label, rank, what,
                                                                          block.get("state") or "unknown")})
    for culprit in block.get("culprits") or []:
        out.append({"rank": culprit["rank"], "basis": "fr_mismatch",
                    "reason": "%s: rank %d is the culprit of %s: %s" % (label, culprit["rank"], what,
                                                                        culprit.get("detail"))})
    return out


def named(merged):
    """[{rank, basis, reason, host}] from every node's reports, in the order read (rank duplicates kept:
    verdict.candidates merges them by rank)."""
    out = []
    for report in merged.get("desync_reports") or []:
        out += [dict(n, host=report["host"]) for n in _desync(report, report["host"])]
    for ras in merged.get("ras") or []:
        dead_pids = {p.get("pid") for p in ras.get("dead") or []}
        for comm in ras.get("communicators") or []:
            out += [dict(n, host=ras["host"]) for n in _ras(comm, ras["host"], dead_pids)]
    for block in merged.get("fr_analysis") or []:
        out += [dict(n, host=block["host"]) for n in _fr(block, block["host"])]
    return out
