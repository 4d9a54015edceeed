# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What a run puts into the history, read from the report's nodes (verdicts, findings, figures) and from the
observations the report judged (the GPU table, the snapshot's extra readings, the XID events): one node record per
host with its GPU rows, XID events and versions. Every input was checked against its module's schema first; GPUs are
known by UUID (else serial, else PCI address), never by position.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import (
    read_result,
    schema_errors,
    xid_before,
)

# gpu_facts keys -> gpu_runs columns
_FACT_COLUMNS = {
    "temperature_c": "temperature_c", "power_w": "power_w", "power_limit_w": "power_limit_w",
    "ecc_volatile_corrected": "ecc_corr_vol", "ecc_volatile_uncorrected": "ecc_uncorr_vol",
    "ecc_aggregate_corrected": "ecc_corr_agg", "ecc_aggregate_uncorrected": "ecc_uncorr_agg",
    "retired_pages_sbe": "retired_sbe", "retired_pages_dbe": "retired_dbe", "retired_pages_pending": "retired_pending",
    "remapped_rows_correctable": "remap_corr", "remapped_rows_uncorrectable": "remap_uncorr",
    "remapped_rows_pending": "remap_pending", "remapped_rows_failure": "remap_failure", "pcie_replays": "pcie_replays",
    "pcie_gen_current": "pcie_gen", "pcie_width_current": "pcie_width", "pcie_gen_max": "pcie_gen_max",
    "pcie_width_max": "pcie_width_max", "vbios": "vbios",
}
BANK_LEVELS = ("max", "high", "partial", "low", "none")


def parse_time(text):
    """Epoch seconds of an ISO 8601 time (a naive one is UTC), or None."""
    if not isinstance(text, str) or not text.strip():
        return None
    value = text.strip().replace(",", ".")
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _value(value):
    if isinstance(value, bool):
        return 1 if value else 0
    return value if isinstance(value, (int, float, str)) or value is None else str(value)


def facts_of(hv):
    """The validated GPU table facts of a host, or None."""
    facts_in = hv.get("ansible_facts") if isinstance(hv.get("ansible_facts"), dict) else {}
    keys = ("gpufleet_gpus", "gpufleet_gpu_count", "gpufleet_driver_version", "gpufleet_gpu_problems",
            "gpufleet_pci_gpus")
    facts = {k: facts_in[k] for k in keys if k in facts_in}
    if not facts or schema_errors("gpu_facts", facts):
        return None
    return facts


def snapshot_of(hv):
    """The validated health_snapshot result of a host, or None."""
    state, data, _reason = read_result("health_snapshot", hv.get("gpufleet_result_health_snapshot"))
    return data if state in ("ok", "skipped") and data else None


def xid_events_of(hv):
    """XID events of the host's validated XID reads (before the burn and after), deduplicated."""
    facts_in = hv.get("ansible_facts") if isinstance(hv.get("ansible_facts"), dict) else {}
    reads = []
    for read in (xid_before(hv), facts_in.get("gpufleet_xid")):
        if read is not None and not schema_errors("xid_facts", read):
            reads.append(read)
    out, seen = [], set()
    for read in reads:
        for event in read.get("events") or []:
            if event.get("counted") is False or event.get("xid") is None:
                continue
            key = "|".join(str(event.get(k)) for k in ("line", "xid", "pci", "time", "uptime_s", "boot_id"))
            digest = hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:32]
            if digest in seen:
                continue
            seen.add(digest)
            out.append({"pci": event.get("pci"), "xid": event.get("xid"), "ts": parse_time(event.get("time")),
                        "severity": event.get("severity"), "digest": digest})
    return out


def _gpu_name_group(gpus):
    names = [g.get("name") for g in gpus if g.get("name")]
    return max(sorted(set(names)), key=names.count) if names else None


def node_record(node, hv, run_ts, playbook):
    """The history record of one report node (its GPU rows, XID events, versions and figures)."""
    facts = facts_of(hv) or {}
    snap = snapshot_of(hv) or {}
    extras = {g.get("pci"): g for g in snap.get("gpus") or [] if g.get("pci")}
    table = {g.get("pci"): g for g in facts.get("gpufleet_gpus") or [] if g.get("pci")}
    report_gpus = {g.get("pci"): g for g in node.get("gpus") or [] if g.get("pci")}
    read_times = [parse_time(e.get("read_at")) for e in extras.values()]
    read_times = [t for t in read_times if t is not None]
    ts = max(read_times) if read_times else run_ts
    gpus = []
    for pci in sorted(set(table) | set(report_gpus)):
        item, rep, extra = table.get(pci) or {}, report_gpus.get(pci) or {}, extras.get(pci) or {}
        row = {"pci": pci, "idx": item.get("index", rep.get("index")), "uuid": item.get("uuid") or rep.get("uuid"),
               "serial": item.get("serial") or rep.get("serial"), "name": item.get("name") or rep.get("name"),
               "verdict": rep.get("verdict"), "ts": parse_time(extra.get("read_at")) or ts}
        for key, column in _FACT_COLUMNS.items():
            row[column] = _value(item.get(key))
        metrics = rep.get("metrics") or {}
        row["burn_gflops"] = metrics.get("burn_gflops")
        row["util_pct"] = extra.get("utilization_gpu_pct")
        row["inforom"] = extra.get("inforom_image")
        banks = extra.get("remap_banks") or {}
        for level in BANK_LEVELS:
            row["banks_" + level] = banks.get(level)
        row["codes"] = ",".join(sorted({f["code"] for f in rep.get("findings") or []})) or None
        gpus.append(row)
    versions = dict(snap.get("versions") or {})
    versions.setdefault("driver", facts.get("gpufleet_driver_version"))
    if "vbios" not in versions:
        versions["vbios"] = {str(g["idx"]): g["vbios"] for g in gpus if g.get("vbios") and g.get("idx") is not None}
    platform = snap.get("platform") or {}
    versions.setdefault("board", platform.get("board_name") or platform.get("product_name"))
    versions = {k: v for k, v in versions.items() if v not in (None, {}, "")}
    checks = node.get("checks") or {}
    figures = {}
    nccl = (checks.get("nccl_test") or {}).get("figures") or {}
    if nccl.get("busbw_gbps") is not None:
        figures["nccl_busbw_gbps"] = nccl["busbw_gbps"]
        figures["nccl_largest_size_bytes"] = nccl.get("largest_size_bytes")
    storage = (checks.get("checkpoint_storage") or {}).get("figures") or {}
    if storage.get("write_mb_per_s") is not None:
        figures["storage_write_mb_per_s"] = storage["write_mb_per_s"]
    group = (node.get("thresholds") or {}).get("gpufleet_drift_group") or _gpu_name_group(gpus) or "unknown"
    return {
        "host": node["host"], "ts": ts, "verdict": node["verdict"], "reachable": 1 if node.get("reachable") else 0,
        "stage": node.get("stage"), "grp": group, "driver": versions.get("driver"), "dcgm": versions.get("dcgm"),
        "kernel": versions.get("kernel"), "bios": versions.get("bios"),
        "board_serial": platform.get("board_serial") or platform.get("product_serial"),
        "product": platform.get("product_name"), "gpu_count": len(gpus) if gpus else None,
        "codes": ",".join(sorted({f["code"] for f in node.get("findings") or []})) or None,
        "figures": figures or None, "versions": versions or None, "gpus": gpus, "xids": xid_events_of(hv),
        "baselines": [], "doc": node if playbook in ("burn_in", "preflight") else None, "playbook": playbook,
    }


def run_record(doc):
    # A fabric search's figures per link: pairs that gave one (slow or not); an error measured nothing.
    links = [{"a": min(p["nodes"]), "b": max(p["nodes"]), "busbw_gbps": p["busbw_gbps"]}
             for p in (doc.get("fabric") or {}).get("pairs") or [] if p["status"] != "error"]
    return {"run_id": doc["run_id"], "playbook": doc.get("playbook"), "started": doc.get("started"),
            "finished": doc.get("finished"), "ts": parse_time(doc.get("finished")) or parse_time(doc.get("started")),
            "verdict": doc["summary"]["verdict"], "interrupted": bool(doc.get("interrupted")), "fabric_links": links}
