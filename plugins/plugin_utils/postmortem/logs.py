# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The job's watchdog evidence from every node's logs: merged, cut to the job's window, judged (pure, stdlib only).

Nodes parse their own logs (module_utils/torch_watchdog via job_evidence) and send events with times. Here:
- job_window(): the window of the job to explain. Given since/until are used as they are; otherwise "the last timeout
  in the logs": T_last is the latest timeout or process-group status line, the job's timeouts are those within
  CLUSTER_S before it, T (when the watchdog fired) the first of them, and the window runs from T minus the longest
  ran-for (when the stuck collective started) minus pre_s to T_last plus post_s (heartbeat kills come minutes later).
- merge(): every event of every node inside the window, tagged with its host; events without a time are kept
  (torch <= 2.3 prints none) and counted.
- analyse(): the culprit from the merged evidence with torch_watchdog.find_culprit (a rank behind in its group, a
  rank that ran another collective, a rank that never reported, a rank that timed out on an earlier sequence), and
  the ranks torch's desync report, NCCL's RAS status and torch's flight-recorder analyzer name (reports.named).
"""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_watchdog import find_culprit
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import reports

CLUSTER_S = 120.0
KINDS = ("timeouts", "pg_status", "heartbeat_kills", "desync", "terminate", "agent_failures", "oom")


def _streams(evidence):
    for log in (evidence or {}).get("logs") or []:
        parsed = log.get("parsed") if isinstance(log, dict) else None
        if isinstance(parsed, dict):
            yield log, parsed


def job_window(hosts, since=None, until=None, flight=None, pre_s=300.0, post_s=600.0):
    """{since, until, t_fire, t_last, basis, timeout_s}: epoch seconds (None when unknown) and how they were found."""
    window = {"since": since, "until": until, "t_fire": None, "t_last": None, "basis": None, "timeout_s": None}
    if since is not None or until is not None:
        window["basis"] = "given"
    timed, kills = [], []
    for evidence in hosts.values():
        for _log, parsed in _streams(evidence):
            for kind in ("timeouts", "pg_status", "heartbeat_kills"):
                for event in parsed.get(kind) or []:
                    when = event.get("time")
                    if isinstance(when, (int, float)) and (since is None or when >= since) and \
                            (until is None or when <= until):
                        (kills if kind == "heartbeat_kills" else timed).append((when, event))
    # A hang the heartbeat monitor ended before any collective timed out (its timeout is shorter) is a hang too.
    timed = timed or kills
    if timed:
        t_last = max(t for t, _e in timed)
        cluster = [(t, e) for t, e in timed if t >= t_last - CLUSTER_S]
        t_fire = min(t for t, _e in cluster)
        ran = [e.get("ran_for_ms") or e.get("timeout_ms") or (e.get("stuck_s") or 0) * 1000 for _t, e in cluster]
        window.update({"t_fire": t_fire, "t_last": t_last, "timeout_s": max(ran) / 1000.0 if max(ran) else None})
        if window["basis"] is None:
            window.update({"since": t_fire - (window["timeout_s"] or 0) - pre_s, "until": t_last + post_s,
                           "basis": "last timeout in the logs"})
        return window
    stuck = _dump_times(flight)
    if stuck is not None:
        created_s, timeout_s = stuck
        t_fire = created_s + (timeout_s or 0)
        window.update({"t_fire": t_fire, "t_last": t_fire, "timeout_s": timeout_s})
        if window["basis"] is None:
            window.update({"since": created_s - pre_s, "until": t_fire + post_s,
                           "basis": "stuck collective in the flight-recorder dumps"})
    return window


def _dump_times(flight):
    """(creation time of the root group's stuck collective, its timeout) in seconds, from the dumps."""
    for group in (flight or {}).get("groups") or []:
        if group.get("key") == (flight or {}).get("root_group") and group.get("stuck_created_ns"):
            timeout = group.get("timeout_ms")
            return group["stuck_created_ns"] / 1e9, timeout / 1000.0 if timeout else None
    return None


def merge(hosts, since=None, until=None):
    """Events of every host's logs inside [since, until] (untimed events kept), each with its host."""
    merged = {kind: [] for kind in KINDS}
    merged.update({"elastic": [], "local_ranks": {}, "ranks_by_host": {}, "outside_window": 0, "untimed": 0,
                   "streams": 0, "lines_read": 0, "evidence": {}, "desync_reports": [], "ras": [], "fr_analysis": []})
    for host, evidence in sorted(hosts.items()):
        for _log, parsed in _streams(evidence):
            merged["streams"] += 1
            merged["lines_read"] += parsed.get("lines_read") or 0
            reporting = merged["ranks_by_host"].setdefault(host, set())
            for kind in KINDS:
                for event in parsed.get(kind) or []:
                    when = event.get("time")
                    if not isinstance(when, (int, float)):
                        merged["untimed"] += 1
                    elif (since is not None and when < since) or (until is not None and when > until):
                        merged["outside_window"] += 1
                        continue
                    item = dict(event)
                    item["host"] = host
                    merged[kind].append(item)
                    if kind in ("timeouts", "pg_status", "heartbeat_kills") and isinstance(event.get("rank"), int):
                        reporting.add(event["rank"])
            summary = parsed.get("elastic_summary") or {}
            for record in ([summary.get("root_cause")] if summary.get("root_cause") else []) + \
                    list(summary.get("failures") or []):
                if isinstance(record, dict):
                    merged["elastic"].append(dict(record, node=host))
            for rank, local in (parsed.get("local_ranks") or {}).items():
                try:
                    merged["local_ranks"][(host, int(rank))] = int(local)
                except (TypeError, ValueError):
                    continue
            lines = [line for line in parsed.get("evidence") or [] if isinstance(line, str)]
            merged["evidence"].setdefault(host, []).extend(lines[:40])
            _reports(merged, parsed, host, since, until)
    return merged


def _reports(merged, parsed, host, since, until):
    """The other formats of the same stream (job_sources.parse_job_lines): the desync report is cut to the window
    where it has a time; the RAS status and the analyzer's output are read whole (the operator ran them on the hang)."""
    for report in (parsed.get("desync_reports") or {}).get("reports") or []:
        when = report.get("time") if isinstance(report, dict) else None
        if not isinstance(report, dict) or (isinstance(when, (int, float)) and (
                (since is not None and when < since) or (until is not None and when > until))):
            continue
        merged["desync_reports"].append(dict(report, host=host))
    ras = parsed.get("ras")
    if isinstance(ras, dict) and (ras.get("communicators") or ras.get("dead")):
        merged["ras"].append(dict(ras, host=host))
    for block in (parsed.get("fr_analysis") or {}).get("collectives") or []:
        if isinstance(block, dict):
            merged["fr_analysis"].append(dict(block, host=host))


def analyse(merged, world_size=None):
    """The culprit from all nodes' watchdog lines, and what else the logs say about the hang."""
    timeouts, statuses = merged["timeouts"], merged["pg_status"]
    reporting = sorted({e["rank"] for kind in ("timeouts", "pg_status") for e in merged[kind]
                        if isinstance(e.get("rank"), int)})
    # Without the world size, the world is at least every rank seen: a gap among them is a rank that said nothing.
    world = world_size if world_size else (max(reporting) + 1 if reporting else None)
    culprit, silent = find_culprit(statuses, timeouts, reporting, world)
    if culprit is not None:
        culprit = dict(culprit)
        hosts = sorted({e["host"] for e in timeouts + statuses if e.get("rank") == culprit["rank"]})
        culprit["hosts"] = hosts
    seqs = [t["seq"] for t in timeouts if isinstance(t.get("seq"), int)]
    ops = sorted({t["op_type"] for t in timeouts if t.get("op_type")})
    return {
        "culprit": culprit,
        "silent_ranks": silent,
        "ranks_reporting": reporting,
        "timeouts": len(timeouts),
        "timed_out_seqs": sorted(set(seqs))[:20],
        "ops": ops,
        "heartbeat_kills": [{"rank": k.get("rank"), "pg": k.get("pg"), "host": k["host"], "stuck_s": k.get("stuck_s"),
                             "signals": k.get("signals") or [], "line": k.get("line")}
                            for k in merged["heartbeat_kills"]][:64],
        "desync": merged["desync"][:16],
        "backends": sorted({t.get("backend") for t in timeouts if t.get("backend")}),
        "named": reports.named(merged)[:256],
    }
