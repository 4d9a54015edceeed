# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The history's rules (controller side): trends, version drift and baselines judged from the history store, and
what changed since the node's previous run, added to the report's judged nodes.

The judges are pure functions in module_utils (judge_trend, judge_drift, judge_baseline); this file only reads the
store, builds their inputs from it and from this run's records, and adds their findings as the checks `trend`,
`drift` and `baseline`. Each node's own clock is its `now` (the time its GPUs were read), so simulated and real
nodes alike compare readings on one time line.
"""

from __future__ import annotations

from datetime import datetime, timezone

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_baseline, judge_drift, judge_trend
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import rank, worst
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_trend import DAY_S
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.records import node_record
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import ident_of

# Counters whose change since the previous run is worth a line (gpu_runs column -> words).
COUNTER_CHANGES = (("ecc_corr_agg", "corrected ECC (lifetime)"), ("ecc_corr_vol", "corrected ECC (volatile)"),
                   ("ecc_uncorr_agg", "uncorrected ECC (lifetime)"), ("ecc_uncorr_vol", "uncorrected ECC (volatile)"),
                   ("retired_sbe", "retired pages (SBE)"), ("retired_dbe", "retired pages (DBE)"),
                   ("remap_corr", "remapped rows (correctable)"), ("remap_uncorr", "remapped rows (uncorrectable)"),
                   ("banks_low", "banks at Low"), ("banks_none", "banks at None"), ("pcie_replays", "PCIe replays"))
NODE_VERSION_KEYS = ("driver", "dcgm", "kernel", "bios")
SERIES_DAYS = 60.0


def iso(ts):
    return datetime.fromtimestamp(ts, timezone.utc).replace(microsecond=0).isoformat() if ts is not None else None


def add_findings(node, check, findings, figures=None):
    """Add a check's findings to a judged report node and recompute its verdicts (node, GPUs, worst, action)."""
    by_index = {g["index"]: g for g in node.get("gpus") or []}
    for f in findings:
        f = dict(f, check=check)
        if f.get("gpu") is not None and f.get("pci") is None and f["gpu"] in by_index:
            f["pci"] = by_index[f["gpu"]].get("pci")
        node["findings"].append(f)
        if f.get("gpu") in by_index:
            by_index[f["gpu"]]["findings"].append(f)
    verdict = worst((f["severity"] for f in findings), "pass")
    node["checks"][check] = {"verdict": "error" if verdict == "unreachable" else verdict,
                             "reasons": [f["message"] for f in findings][:20], "figures": dict(figures or {})}
    node["findings"].sort(key=lambda f: -rank(f["severity"]))
    for gpu in node.get("gpus") or []:  # findings only add: a verdict only rises (a GPU left unknown stays so)
        gpu["verdict"] = worst([gpu["verdict"]] + [f["severity"] for f in findings if f.get("gpu") == gpu["index"]])
    if node["verdict"] != "unreachable":
        node["verdict"] = worst(f["severity"] for f in node["findings"])
        node["worst"] = node["findings"][0] if node["findings"] else None
        node["action"] = node["worst"]["action"] if node["worst"] else None


# ---- inputs of the judges ----------------------------------------------------------------------------------------
def _trend_input(history, node, rec, t):
    now = rec["ts"]
    span = (float(t["gpufleet_trend_recent_days"]) + float(t["gpufleet_trend_window_days"]) + 1.0) * DAY_S
    leak_xids = t.get("gpufleet_ecc_leak_xids") or [92]
    gpus = []
    for row in rec["gpus"]:
        gpu_id = history.gpu_id(rec["host"], ident_of(row)) if history else None
        past = history.gpu_series(gpu_id, since=now - span, until=now - 1e-6) if gpu_id else []
        events = dict((d, ts) for ts, d in history.xid_events(gpu_id, leak_xids, now - span)) if gpu_id else {}
        for event in rec["xids"]:
            if event.get("pci") == row["pci"] and event.get("xid") in leak_xids and event.get("ts") is not None:
                events.setdefault(event["digest"], event["ts"])
        gpus.append({"index": row.get("idx"), "pci": row["pci"], "uuid": row.get("uuid"),
                     "samples": past + [row], "xid92_ts": sorted(events.values())})
    return {"now_ts": now, "gpus": gpus,
            "node": {"reachable": bool(node.get("reachable")),
                     "last_pass_ts": history.last_pass(rec["host"]) if history else None}}


def _drift_peers(history, records, rec, t):
    peers = {}
    if history is not None:
        since = rec["ts"] - 2 * float(t["gpufleet_trend_window_days"]) * DAY_S
        for host, (grp, versions) in history.latest_versions(since).items():
            if grp == rec["grp"]:
                peers[host] = versions
    for other in records.values():
        if other["grp"] == rec["grp"] and other["reachable"] and other.get("versions"):
            peers[other["host"]] = other["versions"]
    return [{"host": h, "versions": v} for h, v in sorted(peers.items())]


def _figures_for_baseline(node, rec):
    """[(metric, detail, gpu row or None, value, check verdict)] of this run."""
    out = []
    checks = node.get("checks") or {}
    burn_verdict = (checks.get("gpu_burn") or {}).get("verdict")
    for row in rec["gpus"]:
        if row.get("burn_gflops") is not None:
            out.append(("burn_gflops", "", row, row["burn_gflops"], burn_verdict))
    fig = rec.get("figures") or {}
    if fig.get("nccl_busbw_gbps") is not None:
        out.append(("nccl_busbw_gbps", str(fig.get("nccl_largest_size_bytes") or ""), None, fig["nccl_busbw_gbps"],
                    (checks.get("nccl_test") or {}).get("verdict")))
    if fig.get("storage_write_mb_per_s") is not None:
        out.append(("storage_write_mb_per_s", "", None, fig["storage_write_mb_per_s"],
                    (checks.get("checkpoint_storage") or {}).get("verdict")))
    return out


def _baseline(history, node, rec, playbook, reset, t):
    """The judge's input, and this run's figures as the history keeps them for later baselines: in
    rec["figures"]["baseline"], [gpu identity or '', metric, detail, value, state] with state "ok" (a sample of the
    baseline when a burn-in's check passed or warned), "low" (more than the allowed drop below it) or "bad" (its check
    failed or erred: no sample)."""
    known = history.baselines(rec["host"]) if history else {}
    items, kept = [], []
    for metric, detail, row, value, verdict in _figures_for_baseline(node, rec):
        key = (ident_of(row) if row else "", metric, detail)
        base = known.get(key)
        good = verdict in ("pass", "warn")
        if base is not None and not reset:
            item = {"metric": metric, "detail": detail, "unit": judge_baseline.METRICS[metric][1],
                    "gpu": row.get("idx") if row else None, "pci": row["pci"] if row else None,
                    "value": value, "baseline": base}
            items.append(item)
            assessed = judge_baseline.assess(item, t)
            kept.append(list(key) + [value, "low" if assessed and assessed["low"] else "ok" if good else "bad"])
        elif playbook == "burn_in" and good:
            # Where the node's own reference starts: its first good burn-in (or the one after gpufleet_baseline_reset).
            rec["baselines"].append({"metric": metric, "detail": detail, "gpu_pci": row["pci"] if row else None,
                                     "value": value})
            kept.append(list(key) + [value, "ok"])
    if kept:
        rec["figures"] = dict(rec.get("figures") or {}, baseline=kept)
    return {"figures": items}


# ---- changes since the previous run ------------------------------------------------------------------------------
def _change(changes, scope, what, before, after, gpu=None, pci=None):
    changes.append({"scope": scope, "gpu": gpu, "pci": pci, "what": what,
                    "before": before if isinstance(before, (int, float, str)) or before is None else str(before),
                    "after": after if isinstance(after, (int, float, str)) or after is None else str(after)})


def changes_since(history, node, rec, playbook):
    """(previous run summary or None, [change]) against the host's previous run of the same playbook (else any)."""
    if history is None:
        return None, []
    prev = (history.node_runs(rec["host"], limit=1, playbook=playbook, before_ts=rec["ts"])
            or history.node_runs(rec["host"], limit=1, before_ts=rec["ts"]))
    if not prev:
        return None, []
    prev = prev[0]
    changes = []
    if prev["verdict"] != node["verdict"]:
        _change(changes, "node", "verdict", prev["verdict"], node["verdict"])
    codes = {f["code"] for f in node.get("findings") or []}
    for code in sorted(codes - set(prev["codes"])):
        _change(changes, "node", "new finding", None, code)
    for code in sorted(set(prev["codes"]) - codes):
        _change(changes, "node", "finding gone", code, None)
    before_versions = prev.get("versions") or {}
    for key in NODE_VERSION_KEYS:
        if before_versions.get(key) and rec.get(key) and before_versions[key] != rec[key]:
            _change(changes, "node", key, before_versions[key], rec[key])
    before_gpus = {g["pci"]: g for g in history.gpu_rows_of(prev["id"])}
    now_gpus = {g["pci"]: g for g in rec["gpus"]}
    for pci in sorted(set(before_gpus) | set(now_gpus)):
        old, new = before_gpus.get(pci), now_gpus.get(pci)
        index = (new or old).get("idx")
        if new is None:
            _change(changes, "gpu", "GPU gone", old.get("uuid") or old.get("serial"), None, index, pci)
            continue
        if old is None:
            _change(changes, "gpu", "GPU new", None, new.get("uuid") or new.get("serial"), index, pci)
            continue
        if ident_of(old) != ident_of(new):
            _change(changes, "gpu", "GPU replaced", ident_of(old), ident_of(new), index, pci)
            continue
        for key in ("vbios", "inforom"):
            if old.get(key) and new.get(key) and old[key] != new[key]:
                _change(changes, "gpu", key, old[key], new[key], index, pci)
        for column, words in COUNTER_CHANGES:
            a, b = old.get(column), new.get(column)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a != b:
                _change(changes, "gpu", words, a, b, index, pci)
    xids = {}
    for event in rec["xids"]:
        xids[event["xid"]] = xids.get(event["xid"], 0) + 1
    for code, count in sorted(xids.items()):
        _change(changes, "node", "XID %s events" % code, None, count)
    summary = {"run_id": prev["run_id"], "playbook": prev["playbook"], "time": iso(prev["ts"]),
               "verdict": prev["verdict"]}
    return summary, changes


def ecc_series(history, rec, trend_input):
    """{gpu index: [[days relative to now, corrected ECC per day]]} of the GPUs whose counter moved."""
    now = rec["ts"]
    out = {}
    for gpu in trend_input["gpus"]:
        samples = gpu["samples"]
        if history is not None:
            gpu_id = history.gpu_id(rec["host"], ident_of(samples[-1]))
            if gpu_id:
                samples = history.gpu_series(gpu_id, since=now - SERIES_DAYS * DAY_S, until=now - 1e-6) + [
                    samples[-1]]
        points = [[round((ts - now) / DAY_S, 3), value] for ts, value in judge_trend.ecc_rate_series(samples)]
        if any(p[1] for p in points):
            out[str(gpu["index"])] = points
    return out


# ---- the whole fleet ---------------------------------------------------------------------------------------------
def annotate(nodes, data, history, run_ts, playbook, reset_baselines=False):
    """Judge trends, drift and baselines for every report node from the history (an open store, or None when there
    is none yet) and this run; record what changed since each node's previous run. Returns the history records of
    this run (with the baselines it sets), ready for History.record()."""
    records = {}
    for node in nodes:
        records[node["host"]] = node_record(node, data.get(node["host"]) or {}, run_ts, playbook)
    for node in nodes:
        rec = records[node["host"]]
        t = complete(node.get("thresholds") or {})
        host = node["host"]
        trend_in = _trend_input(history, node, rec, t)
        findings = judge_trend.judge(trend_in, t, host)
        for fig in judge_trend.figures(trend_in, t):
            for gpu in node.get("gpus") or []:
                if gpu["index"] == fig["index"]:
                    for key in ("ecc_per_day_recent", "ecc_per_day_earlier", "replays_per_day"):
                        if fig.get(key) is not None:
                            gpu["metrics"][key] = fig[key]
                    gpu["metrics"]["xid92_events_in_window"] = fig["xid92_events"]
        add_findings(node, "trend", findings, {"gpus": len(trend_in["gpus"]),
                                               "points": sum(len(g["samples"]) for g in trend_in["gpus"])})
        if rec["reachable"] and rec.get("versions"):
            drift_in = {"group": rec["grp"], "versions": rec["versions"],
                        "peers": _drift_peers(history, records, rec, t)}
            fig = judge_drift.figures(drift_in, t)
            add_findings(node, "drift", judge_drift.judge(drift_in, t, host), dict(
                ("%s_reference" % k, "%s (%s)" % (v["reference"], v["source"]) if v["reference"] else v["source"])
                for k, v in fig.items()))
        if rec["reachable"]:
            base_in = _baseline(history, node, rec, playbook, reset_baselines, t)
            add_findings(node, "baseline", judge_baseline.judge(base_in, t, host), {
                "compared": len(base_in["figures"]), "recorded": len(rec["baselines"])})
        previous, changes = changes_since(history, node, rec, playbook)
        node["history"] = {"previous": previous, "changes": changes[:200], "time": iso(rec["ts"]),
                           "ecc_per_day": ecc_series(history, rec, trend_in) if rec["reachable"] else {},
                           "lifecycle": lifecycle_view(history, host)}
        _refresh(rec, node)
    return list(records.values())


LIFECYCLE_SHOWN = 10


def lifecycle_view(history, host):
    """The node's lifecycle as the history held it when this run was judged: its state (history/lifecycle.py decides
    it), since when, and its newest transitions; None when it has none. A quarantine this run makes is recorded after
    the report, which names it in its `quarantine` section."""
    rows = history.lifecycle_of(host) if history is not None else []
    if not rows:
        return None
    return {"state": lifecycle.state_of(rows), "since": iso(rows[-1]["ts"]), "transitions": [
        {"time": iso(r["ts"]), "from": r["from_state"], "to": r["to_state"], "actor": r["actor"],
         "reason": r["reason"], "code": r["code"], "gpu": r["gpu"]} for r in rows[-LIFECYCLE_SHOWN:]]}


def _refresh(rec, node):
    """The record carries the node's final verdicts and codes (history findings included)."""
    rec["verdict"] = node["verdict"]
    rec["codes"] = ",".join(sorted({f["code"] for f in node["findings"]})) or None
    by_pci = {g.get("pci"): g for g in node.get("gpus") or []}
    for row in rec["gpus"]:
        gpu = by_pci.get(row["pci"])
        if gpu is not None:
            row["verdict"] = gpu["verdict"]
            row["codes"] = ",".join(sorted({f["code"] for f in gpu["findings"]})) or None
    if rec["doc"] is not None:
        rec["doc"] = node
