# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The post-mortem's findings in the collection's finding contract (pure, stdlib only).

{severity pass|warn|error|fail, code, gpu, pci, check, message (naming host and GPU), action, evidence [raw lines]}:
the verdict first, then the hardware events of the window, then what could not be collected or read.
"""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem.hardware import rel_text
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem.verdict import finding

VERDICT_CODES = {"hardware": ("JOB_HANG_HARDWARE", "fail"), "software": ("JOB_HANG_SOFTWARE", "fail"),
                 "rank": ("JOB_HANG_RANK", "fail"), "tie": ("JOB_HANG_TIE", "fail"),
                 "undetermined": ("JOB_HANG_UNDETERMINED", "warn"), "no_hang_found": ("NO_HANG_FOUND", "warn")}


def build(result):
    v = result["verdict"]
    code, severity = VERDICT_CODES[v["kind"]]
    out = [finding(severity, code, "%s [confidence: %s]" % (v["message"], v["confidence"]), v["action"],
                   v["evidence"], v.get("gpu"), v.get("pci"))]
    for host, issues in sorted(result["hardware"].items()):
        for issue in issues:
            if v["kind"] == "hardware" and host == v.get("host") and v.get("pci") in issue["pcis"]:
                continue  # the verdict itself
            code, sev = issue["code"], issue["severity"]  # judge_xid's, as in the fleet report
            gpus = ", ".join(str(g) for g in issue["gpus"])
            out.append(finding(sev, code, "%s GPU %s (PCI %s): XID %s %s (%s)" % (
                host, gpus, ", ".join(str(p) for p in issue["pcis"]), issue["xid"], rel_text(issue["t_rel_s"]),
                issue["description"]), issue["action"], issue["lines"],
                issue["gpus"][0] if len(issue["gpus"]) == 1 else None, issue["pcis"][0] if len(issue["pcis"]) == 1
                else None))
    ranks_by_host = {}
    for rank, info in result["ranks"].items():
        ranks_by_host.setdefault(info.get("host"), []).append(rank)
    for host, reason in sorted(result["hosts_without_evidence"].items()):
        mine = sorted(ranks_by_host.get(host) or [])
        out.append(finding("error", "NO_EVIDENCE", "%s: %s; its ranks%s are 'no evidence', the rest was analysed" % (
            host, reason, " (%s)" % _short(mine) if mine else ""),
            "bring %s back (ssh, power) and run the post-mortem again for its logs, dumps and kernel log" % host))
    for host, errors in sorted(result["errors"].items()):
        for error in errors[:10]:
            out.append(finding("error", "COLLECTION_ERROR", "%s: %s" % (host, error), "fix the access named in the "
                               "message and run the post-mortem again", [error]))
    flight = result.get("flight") or {}
    for refused in flight.get("refused") or []:
        out.append(finding("error", "DUMP_REFUSED", "rank %s: %s" % (refused["rank"], refused["error"]),
                           "the other ranks' dumps were analysed; keep this file for inspection (it was not run)",
                           [refused["error"]]))
    for group in flight.get("groups") or []:
        if group.get("key") == flight.get("root_group") and group.get("missing_dump"):
            out.append(finding("warn", "DUMP_MISSING", "no flight-recorder dump from rank(s) %s of process group %s" % (
                _short(group["missing_dump"]), group.get("desc") or group.get("name")),
                "a rank without a dump died or hung hard, or its node was not collected; set "
                "TORCH_NCCL_DUMP_ON_TIMEOUT=1 and TORCH_NCCL_TRACE_BUFFER_SIZE on every node (training_env role)"))
    kills = result["logs"].get("heartbeat_kills") or []
    if kills:
        out.append(finding("warn", "HEARTBEAT_KILL", "the heartbeat monitor killed rank(s) %s: their NCCL watchdog was "
                           "stuck (a CUDA/NCCL call hung)" % _short(sorted({k["rank"] for k in kills
                                                                           if isinstance(k["rank"], int)})),
                           "a hung CUDA call on a rank often means its GPU stopped answering: check those GPUs' "
                           "XIDs", [k["line"] for k in kills]))
    for host, skew in sorted(result["clock"].items()):
        out.append(finding("warn", "CLOCK_SKEW", "%s's clock is %+.1f s off the controller's: times across nodes "
                           "compare only that precisely" % (host, skew), "synchronise the clocks (chrony/NTP)"))
    for rank, info in sorted(result["ranks"].items()):
        if info.get("conflict"):
            out.append(finding("warn", "RANK_MAP_CONFLICT", "rank %d is claimed by %s equally: its node is unknown" % (
                rank, ", ".join(info["conflict"])), "give each node its own log path (logs on shared storage "
                "show every rank on every node)"))
    return out


def _short(ranks, limit=16):
    text = ",".join(str(r) for r in ranks[:limit])
    return text + (",... (%d)" % len(ranks) if len(ranks) > limit else "")
