# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""One verdict for the hung job, its confidence, and the findings (pure, stdlib only).

Candidates are ranks named by the dumps (never joined the stuck collective or joined it after the others' timeout,
ran another collective, GPU never started it, left no dump, left a dump that could not be read) and by the logs
(behind in its group, another collective at the same sequence, silent, earlier sequence; torch's desync report, NCCL's
RAS status, torch's flight-recorder analyzer). A rank named by both scores higher. Then the join: the rank's GPU, that
GPU's hardware issue in the window.
Confidence:
  high    the rank is proven (dumps or process-group status) and the cause is in evidence: a hardware issue on its
          GPU, or the mismatched collective with the code location from the dumps;
  medium  proven rank without a cause, a cause with weakly proven rank, a mismatch seen only in the logs;
  low     weak evidence only (a silent rank, an earlier sequence, a missing dump), or hardware without any rank;
  none    no hang found in the evidence.
Two equally suspect ranks are named together and lower the confidence, unless one hardware issue (a PSU rail, one
GPU) explains them all, or only one of them has hardware evidence.
"""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem.hardware import rel_text, weight

CHECK = "job_postmortem"
SCORES = {"never_joined": 3, "late_joined": 3, "mismatch": 3, "not_started": 2, "missing_dump": 1, "refused_dump": 1,
          "pg_status": 2, "op_mismatch": 2, "silent": 1, "earlier_seq": 1,
          # what torch's desync report, NCCL's RAS and torch's analyzer name (reports.py)
          "fr_missing": 3, "fr_mismatch": 2, "desync_report": 2, "ras_behind": 2, "ras_missing": 2}
MISMATCH_BASES = ("mismatch", "op_mismatch", "fr_mismatch")
LEVELS = ("none", "low", "medium", "high")


def finding(severity, code, message, action, evidence=None, gpu=None, pci=None):
    return {"severity": severity, "code": code, "gpu": gpu, "pci": pci, "check": CHECK, "message": message,
            "action": action, "evidence": [str(e)[:500] for e in (evidence or []) if e][:20]}


def candidates(flight, logs):
    """Ranks under suspicion, merged by rank: {rank: {score, bases, reasons, frames, op, seq}}, best first."""
    found = {}
    for item in (flight or {}).get("culprits") or []:
        c = found.setdefault(item["rank"], {"rank": item["rank"], "score": 0, "bases": [], "reasons": [],
                                            "frames": [], "op": None, "seq": None, "sources": set()})
        c["score"] = max(c["score"], SCORES.get(item["basis"], 1))
        c["bases"].append(item["basis"])
        c["reasons"].append(item["reason"])
        c["frames"] = c["frames"] or item.get("frames") or []
        c["op"], c["seq"] = c["op"] or item.get("op"), c["seq"] or item.get("seq")
        c["sources"].add("dumps")
    culprit = (logs or {}).get("culprit")
    named = []
    if culprit and isinstance(culprit.get("rank"), int):
        named = [(culprit["rank"], culprit.get("basis"), culprit["reason"])]
        silent = [r for r in (logs or {}).get("silent_ranks") or [] if isinstance(r, int)]
        if culprit.get("basis") == "silent" and len(silent) > 1:
            # The logs cannot tell silent ranks apart: each of them is as suspect as the first.
            named = [(r, "silent", "rank %d reported no timeout while the others timed out waiting (%d ranks silent)"
                      % (r, len(silent))) for r in silent[:64]]
    named += [(n["rank"], n["basis"], n["reason"]) for n in (logs or {}).get("named") or []
              if isinstance(n.get("rank"), int)]
    for rank, basis, reason in named:
        c = found.setdefault(rank, {"rank": rank, "score": 0, "bases": [], "reasons": [], "frames": [], "op": None,
                                    "seq": None, "sources": set()})
        c["score"] = max(c["score"], SCORES.get(basis, 1))
        if reason not in c["reasons"]:
            c["bases"].append(basis)
            c["reasons"].append(reason)
        c["sources"].add("logs")
    for c in found.values():
        if len(c["sources"]) == 2 and c["score"] >= 2:
            c["score"] += 1  # dumps and logs agree (two weak hints stay weak)
        c["sources"] = sorted(c["sources"])
    return sorted(found.values(), key=lambda c: (-c["score"], c["rank"]))


def _hw_for(cand, hw):
    """The worst hardware issue on the candidate's GPU (an issue of its PSU rail counts)."""
    pci = (cand.get("gpu") or {}).get("pci")
    if not pci:
        return None
    mine = [i for i in hw.get(cand.get("host"), []) if pci in i["pcis"] and i["kind"] != "application"]
    return mine[0] if mine else None


def _where(cand):
    gpu = cand.get("gpu") or {}
    host = cand.get("host") or "an unknown node"
    if gpu.get("index") is None:
        return "%s (GPU unknown: %s)" % (host, gpu.get("basis") or "no GPU map")
    return "%s GPU %s (PCI %s)" % (host, gpu["index"], gpu.get("pci") or "unknown")


def _rank_text(cand):
    local = cand.get("local_rank")
    return "rank %d%s" % (cand["rank"], " (local rank %d)" % local if isinstance(local, int) else "")


def decide(cands, hw, window, unreachable=(), have_dumps=False):
    """The verdict: {kind, confidence, rank(s), host, gpu, pci, message, action, reasons, evidence, tie}."""
    t_ref = window.get("t_fire")
    if not cands:
        return _no_rank(hw, window, have_dumps)
    top = [c for c in cands if c["score"] == cands[0]["score"]]
    for c in top:
        c["issue"] = _hw_for(c, hw)
    with_hw = [c for c in top if c["issue"]]
    tie = False
    if len(top) > 1:
        shared = {id(c["issue"]) for c in top if c["issue"]}
        if len(with_hw) == len(top) and len(shared) == 1:
            pass  # one issue (a rail, one GPU) explains every tied rank
        elif len(with_hw) == 1:
            top = with_hw
        else:
            tie = True
    lead = top[0]
    strong = lead["score"] >= 2
    issue = lead.get("issue")
    ranks = [c["rank"] for c in top]
    reasons = [r for c in top for r in c["reasons"]]
    verdict = {"kind": None, "confidence": None, "ranks": ranks, "rank": lead["rank"], "host": lead.get("host"),
               "local_rank": lead.get("local_rank"), "gpu": (lead.get("gpu") or {}).get("index"),
               "pci": (lead.get("gpu") or {}).get("pci"), "uuid": (lead.get("gpu") or {}).get("uuid"),
               "tie": tie, "reasons": reasons, "frames": lead.get("frames") or [], "t_rel_s": None,
               "message": None, "action": None, "evidence": []}
    names = ", ".join("%s on %s" % (_rank_text(c), _where(c)) for c in top)
    if issue and not tie:
        verdict.update({"kind": "hardware", "confidence": "high" if strong else "medium",
                        "t_rel_s": issue["t_rel_s"], "evidence": issue["lines"]})
        what = "XID %s %s" % (issue["xid"], rel_text(issue["t_rel_s"])) if issue["xid"] else issue["description"]
        if issue["kind"] == "psu_rail":
            what = "%s %s" % (issue["description"], rel_text(issue["t_rel_s"]))
        verdict["message"] = "%s: %s (%s); %s stopped the job: %s" % (
            _where(lead), what, issue["description"], ", ".join(_rank_text(c) for c in top), reasons[0])
        verdict["action"] = issue["action"]
    elif any(b in MISMATCH_BASES for b in lead["bases"]):
        frames = lead.get("frames") or []
        verdict.update({"kind": "software", "confidence": "high" if frames and not tie else "medium"})
        at = frames[0] if frames else "the collective call of %s (no dump frames: enable the flight recorder)" % \
            _rank_text(lead)
        said = next((r for b, r in zip(lead["bases"], lead["reasons"], strict=True) if b in MISMATCH_BASES),
                    reasons[0])
        verdict["message"] = "no hardware evidence: mismatched collective in your code at %s; %s" % (at, said)
        verdict["action"] = ("fix the training code so that every rank calls the same collectives in the same order "
                             "(%s calls %s there); TORCH_DISTRIBUTED_DEBUG=DETAIL reports such a mismatch at the "
                             "call instead of a timeout" % (_rank_text(lead), lead.get("op") or "another collective"))
        verdict["evidence"] = frames
    else:
        verdict.update({"kind": "tie" if tie else "rank", "confidence": "medium" if strong else "low"})
        verdict["message"] = "%s %s: %s" % (names, "are equally suspect" if tie else "stopped the job", reasons[0])
        verdict["action"] = ("no hardware evidence for %s in the window: read %s's own output around T (an exception, "
                             "a data-loader or storage stall, the OOM killer), then run kentino.gpufleet.preflight on "
                             "%s before restarting" % (_where(lead), _rank_text(lead), lead.get("host") or "it"))
        if tie:
            verdict["action"] = "check each of: " + "; ".join(_where(c) for c in top) + ". " + verdict["action"]
    if tie and verdict["confidence"] == "high":
        verdict["confidence"] = "medium"
    if lead.get("host") in unreachable:
        verdict["confidence"] = LEVELS[max(1, LEVELS.index(verdict["confidence"]) - 1)]
        verdict["message"] += " (%s gave no evidence - unreachable or not collected - so its GPUs could not be " \
                              "checked)" % lead["host"]
    verdict["evidence"] = list(verdict["evidence"]) + reasons
    verdict["t_ref"] = t_ref
    return verdict


def _no_rank(hw, window, have_dumps):
    serious = [(host, i) for host, issues in hw.items() for i in issues if weight(i) >= 2]
    base = {"ranks": [], "rank": None, "host": None, "local_rank": None, "gpu": None, "pci": None, "uuid": None,
            "tie": False, "reasons": [], "frames": [], "t_rel_s": None, "evidence": [], "t_ref": window.get("t_fire")}
    if len(serious) == 1:
        host, issue = serious[0]
        base.update({"kind": "hardware", "confidence": "low", "host": host, "gpu": issue["gpus"][0],
                     "pci": issue["pcis"][0], "t_rel_s": issue["t_rel_s"], "evidence": issue["lines"],
                     "action": issue["action"],
                     "message": "%s GPU %s (PCI %s): XID %s %s (%s); no rank evidence names it, but it is the only "
                                "hardware event of the job's window" % (host, issue["gpus"][0], issue["pcis"][0],
                                                                        issue["xid"], rel_text(issue["t_rel_s"]),
                                                                        issue["description"])})
        return base
    if window.get("t_fire") is None and not serious:
        base.update({"kind": "no_hang_found", "confidence": "none",
                     "message": "no timeout, heartbeat kill or stuck collective in the evidence of the window",
                     "action": "check the logs/dumps paths (logs, journal_units, dump_prefixes) and the window "
                               "(since/until); set TORCH_NCCL_TRACE_BUFFER_SIZE so the next hang leaves dumps"})
        return base
    base.update({"kind": "undetermined", "confidence": "low" if serious else "none",
                 "message": "the job hung but no rank stands out%s" % (
                     ": hardware events on %s" % "; ".join("%s GPU %s XID %s" % (h, i["gpus"][0], i["xid"])
                                                           for h, i in serious) if serious else
                     " (every rank that dumped joined the stuck collective and agrees on it)" if have_dumps else
                     " (no flight-recorder dumps, and the watchdog lines single out no rank)"),
                 "action": "check the network between the nodes (NCCL_DEBUG=INFO, the NICs and switch ports), and "
                           "enable the flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=20000) for the next run"})
    return base
