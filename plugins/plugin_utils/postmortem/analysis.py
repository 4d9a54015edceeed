# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The whole post-mortem from the nodes' job_evidence results (pure, stdlib only; never raises on bad input).

hosts: {inventory host: job_evidence result | {"unreachable": True, "msg"} | {"failed": True, "msg"} | None}.
A node without evidence keeps its ranks as "no evidence"; everything else is analysed.
"""

from __future__ import annotations

import os
import tempfile

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import hardware, logs, topology, verdict
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem.flight import analyse_dumps

STORE_PREFIX = "gpufleet-dumps-"  # plugins/action/job_evidence.py writes the dumps' bytes there

DEFAULTS = {"since": None, "until": None, "world_size": None, "pre_s": 300.0, "post_s": 600.0, "psu_rails": {},
            "thresholds": {}, "notes": [],
            "cuda_visible_devices": {}, "max_dump_bytes": 64 * 1024 * 1024, "max_dump_seconds": 20.0,
            "max_memory_bytes": 1024 ** 3, "now": None, "skew_s": 5.0, "workers": 0}


def _split(hosts):
    good, bad = {}, {}
    for host, result in sorted((hosts or {}).items()):
        if not isinstance(result, dict):
            bad[host] = "no result: the node was not reached or the collection did not run there"
        elif result.get("unreachable"):
            bad[host] = "unreachable: %s" % str(result.get("msg") or "no message")[:300]
        elif result.get("failed") or result.get("skipped"):
            bad[host] = "collection failed: %s" % str(result.get("msg") or "no message")[:300]
        else:
            good[host] = result
    return good, bad


def _dump_items(good, window, notes):
    """(rank, name, loader) per usable dump; a rank dumped on two nodes (shared storage) is read once, said so."""
    seen, items, skipped = {}, [], []
    lo = window.get("since")
    for host, ev in good.items():
        for dump in ev.get("dumps") or []:
            rank, name = dump.get("rank"), "%s:%s" % (host, dump.get("path"))
            if not isinstance(rank, int):
                continue
            data = dump.get("data_b64") or _stored(dump.get("data_file"))
            if dump.get("error") or dump.get("skipped") or not data:
                skipped.append({"rank": rank, "file": name, "host": host,
                                "error": dump.get("error") or "not sent: %s" % (dump.get("skipped") or "no data")})
                continue
            if lo is not None and isinstance(dump.get("mtime"), (int, float)) and dump["mtime"] < lo:
                skipped.append({"rank": rank, "file": name, "host": host, "stale": True,
                                "error": "written before the job's window: an older job's dump, not used"})
                continue
            if rank in seen:
                notes.append("rank %d has a dump on %s and on %s (shared storage?): the first is used"
                             % (rank, seen[rank], host))
                continue
            seen[rank] = host
            items.append((rank, name, data))  # base64 decoded by the reader (in its worker process), or a loader
    return items, seen, skipped


def stored_dump_files(hosts):
    """The controller files the job_evidence action wrote for these results (to delete once read)."""
    return [path for result in (hosts or {}).values() if isinstance(result, dict)
            for dump in result.get("dumps") or [] if isinstance(dump, dict)
            for path in [_store_path(dump.get("data_file"))] if path]


def _store_path(path):
    """A data_file only where the job_evidence action writes (a gpufleet-dumps-* directory of the controller's temp
    directory): a path from anywhere else in a result is never read nor deleted."""
    if not isinstance(path, str) or not path:
        return None
    real = os.path.realpath(path)
    parent = os.path.dirname(real)
    if os.path.dirname(parent) != os.path.realpath(tempfile.gettempdir()) \
            or not os.path.basename(parent).startswith(STORE_PREFIX):
        return None
    return real


def _stored(path):
    """A loader of a stored dump's bytes (read when the reader gets to it), or None."""
    real = _store_path(path)
    if real is None:
        return None

    def load():
        with open(real, "rb") as fh:
            return fh.read()
    return load


def _world_size(options, flight, good):
    if isinstance(options.get("world_size"), int) and options["world_size"] > 0:
        return options["world_size"], "given"
    for group in (flight or {}).get("groups") or []:
        if group.get("desc") == "default_pg" and group.get("members"):
            return max(group["members"]) + 1, "flight-recorder pg_config"
    for ev in good.values():
        for proc in ev.get("processes") or []:
            try:
                return int(proc["env"]["WORLD_SIZE"]), "WORLD_SIZE of a live worker"
            except (KeyError, TypeError, ValueError):
                continue
    return None, None


def analyse(hosts, **options):
    opts = dict(DEFAULTS)
    opts.update({k: v for k, v in options.items() if v is not None})
    good, bad = _split(hosts)
    notes = list(opts["notes"])
    window = logs.job_window(good, opts["since"], opts["until"], None, opts["pre_s"], opts["post_s"])
    items, dump_hosts, skipped = _dump_items(good, window, notes)
    flight = None
    if items or skipped:
        flight = analyse_dumps(items, opts["world_size"], workers=opts["workers"], max_bytes=opts["max_dump_bytes"],
                               max_seconds=opts["max_dump_seconds"], max_memory=opts["max_memory_bytes"],
                               unread=[s for s in skipped if not s.get("stale")])
        for refused in flight["refused"]:
            refused.setdefault("host", dump_hosts.get(refused["rank"]))
        if window["basis"] is None:
            window = logs.job_window(good, opts["since"], opts["until"], flight, opts["pre_s"], opts["post_s"])
    world, world_basis = _world_size(opts, flight, good)
    merged = logs.merge(good, window["since"], window["until"])
    log_result = logs.analyse(merged, world)
    # A rank's dump file is written on its own node: a refused one still says where the rank ran.
    used = [(rank, host) for rank, host in dump_hosts.items()
            if rank in set((flight or {}).get("ranks_with_dump") or [])]
    used += [(r["rank"], r["host"]) for r in (flight or {}).get("refused") or [] if r.get("host")]
    ranks = topology.rank_map(good, merged, used)
    if len(bad) == 1 and world:
        topology.assign_by_elimination(ranks, world, next(iter(bad)))
    gpus = {host: topology.gpu_table(ev) for host, ev in good.items()}
    hw, outside = {}, 0
    for host, ev in good.items():
        events, out = hardware.events_in_window(ev.get("kernel"), window["since"], window["until"])
        outside += out
        by_pci = {g["pci"]: i for i, g in gpus[host].items() if g.get("pci")}
        t = dict((opts["thresholds"] or {}).get(host) or {})  # the node's inventory thresholds (judge_xid's)
        rails = (opts["psu_rails"] or {}).get(host)
        if isinstance(rails, dict) and rails:
            t["gpufleet_psu_rails"] = rails
        hw[host] = hardware.issues(events, by_pci, t, window["t_fire"], host)
    cands = verdict.candidates(flight, log_result)
    for cand in cands:
        info = ranks.get(cand["rank"]) or {}
        cand["host"], cand["local_rank"] = info.get("host"), info.get("local_rank")
        cand["gpu"] = topology.gpu_for(good.get(cand["host"]), cand["local_rank"],
                                       (opts["cuda_visible_devices"] or {}).get(cand["host"])) \
            if cand["host"] in good else None
    decided = verdict.decide(cands, hw, window, unreachable=set(bad),
                             have_dumps=bool((flight or {}).get("ranks_with_dump")))
    rank_gpus = {}
    for rank, info in ranks.items():
        if info.get("host") in good and isinstance(info.get("local_rank"), int):
            gpu = topology.gpu_for(good[info["host"]], info["local_rank"],
                                   (opts["cuda_visible_devices"] or {}).get(info["host"]))
            rank_gpus[rank] = {"index": gpu.get("index"), "pci": gpu.get("pci")}
    return {
        "window": window, "world_size": world, "world_size_basis": world_basis, "hosts_ok": sorted(good),
        "hosts_without_evidence": bad, "flight": flight, "logs": log_result, "merged_counts": {
            "streams": merged["streams"], "lines_read": merged["lines_read"], "outside_window": merged["outside_window"],
            "untimed_events": merged["untimed"], "xid_events_outside_window": outside},
        "ranks": ranks, "rank_gpus": rank_gpus, "gpus": gpus, "hardware": hw, "candidates": cands,
        "verdict": decided,
        "clock": _clock(good, opts), "notes": notes, "errors": {h: list(ev.get("errors") or []) for h, ev in good.items()},
        "log_evidence": merged["evidence"],
    }


def _clock(good, opts):
    now = opts.get("now")
    if not isinstance(now, (int, float)):
        return {}
    return {host: round(ev["now"] - now, 1) for host, ev in good.items() if isinstance(ev.get("now"), (int, float))
            and abs(ev["now"] - now) > opts["skew_s"]}

