# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Rank -> host -> local rank -> GPU (index, PCI, UUID), from what the nodes reported (pure, stdlib only).

Sources, strongest first: the RANK/LOCAL_RANK/CUDA_VISIBLE_DEVICES of live workers; the dump file of a rank on a node
(a rank's dump is written on its own node); torchrun's `[default<local>]:[rank<global>]:` prefixes in a node's log;
the elastic summary's `host`/`rank (local_rank)` records; the ranks that printed watchdog lines in a node's log. A
rank claimed by two nodes (logs on shared storage) keeps only its strongest, unambiguous source. torchrun gives each
node a contiguous block of ranks, so a gap inside a node's block (the rank that died without a word) belongs to it.
Local rank L uses CUDA device L (torch.cuda.set_device(local_rank)); CUDA_VISIBLE_DEVICES maps it to a physical GPU,
and nvidia-smi's PCI order numbers the GPUs, lost ones included.
"""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci

STRENGTH = {"process": 5, "dump": 4, "log_prefix": 3, "elastic_summary": 3, "log_rank": 2, "block": 1}


def _add(claims, rank, host, source, local=None):
    claims.setdefault(rank, []).append({"host": host, "source": source, "local_rank": local})


def rank_map(hosts, merged_logs, flight_items=None):
    """{rank: {host, local_rank, basis [sources], conflict [hosts]}} for every rank any node told about."""
    claims = {}
    hostnames = {}
    for host, ev in hosts.items():
        if not isinstance(ev, dict):
            continue
        hostnames[str(ev.get("host") or host)] = host
        for proc in ev.get("processes") or []:
            env = proc.get("env") or {}
            try:
                _add(claims, int(env["RANK"]), host, "process", int(env["LOCAL_RANK"]))
            except (KeyError, TypeError, ValueError):
                continue
    for rank, host in flight_items or []:
        _add(claims, rank, host, "dump")
    for (host, rank), local in merged_logs.get("local_ranks", {}).items():
        _add(claims, rank, host, "log_prefix", local)
    for record in merged_logs.get("elastic") or []:
        host = hostnames.get(str(record.get("host")))
        if host is not None and isinstance(record.get("rank"), int):
            _add(claims, record["rank"], host, "elastic_summary", record.get("local_rank"))
    for host, ranks in (merged_logs.get("ranks_by_host") or {}).items():
        for rank in ranks:
            _add(claims, rank, host, "log_rank")
    out = {}
    for rank, items in claims.items():
        by_host = {}
        for item in items:
            by_host.setdefault(item["host"], []).append(item)
        best = max(by_host.items(), key=lambda kv: (max(STRENGTH[i["source"]] for i in kv[1]), len(kv[1]), kv[0]))
        strength = {h: max(STRENGTH[i["source"]] for i in its) for h, its in by_host.items()}
        top = [h for h, s in strength.items() if s == strength[best[0]]]
        locals_ = [i["local_rank"] for i in best[1] if isinstance(i["local_rank"], int)]
        out[rank] = {"host": best[0] if len(top) == 1 else None, "local_rank": locals_[0] if locals_ else None,
                     "basis": sorted({i["source"] for i in best[1]}), "conflict": sorted(by_host) if len(top) > 1 else []}
    _blocks(out)
    return out


def _blocks(ranks):
    """Local ranks and missing ranks from torchrun's contiguous per-node blocks."""
    per_host = {}
    for rank, info in ranks.items():
        if info["host"] is not None:
            per_host.setdefault(info["host"], []).append(rank)
    known_sizes = [len(v) for v in per_host.values()]
    nproc = max(known_sizes) if known_sizes else 0
    for host, members in per_host.items():
        members.sort()
        lo, hi = members[0], members[-1]
        explicit = {r: ranks[r]["local_rank"] for r in members if ranks[r]["local_rank"] is not None}
        if explicit:
            base = {r - loc for r, loc in explicit.items()}
            lo = base.pop() if len(base) == 1 else lo
        if hi - lo + 1 > max(nproc, len(members)):
            continue  # not one contiguous block: leave local ranks unknown rather than guess
        for rank in range(lo, hi + 1):
            info = ranks.get(rank)
            if info is None:
                ranks[rank] = {"host": host, "local_rank": rank - lo, "basis": ["block"], "conflict": []}
            elif info["local_rank"] is None and info["host"] == host:
                info["local_rank"] = rank - lo
                info["basis"] = sorted(set(info["basis"]) | {"block"})


def assign_by_elimination(ranks, world_size, host):
    """Ranks no node claimed, when exactly one node left no evidence: one contiguous block of them is that node's."""
    unclaimed = [r for r in range(world_size) if (ranks.get(r) or {}).get("host") is None]
    per_node = max([sum(1 for i in ranks.values() if i["host"] == h) for h in {i["host"] for i in ranks.values()
                                                                              if i["host"]}] or [0])
    if not unclaimed or unclaimed[-1] - unclaimed[0] + 1 != len(unclaimed) or (per_node and len(unclaimed) > per_node):
        return
    for rank in unclaimed:
        ranks[rank] = {"host": host, "local_rank": rank - unclaimed[0] if len(unclaimed) == per_node else None,
                       "basis": ["elimination"], "conflict": []}


def gpu_table(evidence):
    """{index: {index, pci, uuid, name, lost}} of one node: nvidia-smi's GPUs and the lost ones (at the row nvidia-smi
    printed their error in, else in PCI order when the present GPUs follow it)."""
    present = {}
    ids = ((evidence or {}).get("kernel") or {}).get("gpu_ids") or {}
    for gpu in (evidence or {}).get("gpus") or []:
        index = gpu.get("index")
        if isinstance(index, int):
            pci = normalize_pci(gpu.get("pci"))
            present[index] = {"index": index, "pci": pci, "uuid": gpu.get("uuid") or (ids.get(pci) or {}).get("uuid"),
                              "name": gpu.get("name"), "lost": bool(gpu.get("lost"))}
    lost = set()
    for problem in (evidence or {}).get("gpu_problems") or []:
        if problem.get("kind") == "lost" and normalize_pci(problem.get("pci")):
            lost.add(normalize_pci(problem["pci"]))
    for pci in ((evidence or {}).get("kernel") or {}).get("lost_gpus") or []:
        if normalize_pci(pci):
            lost.add(normalize_pci(pci))
    lost -= {g["pci"] for g in present.values()}
    if not lost:
        return present
    ordered = sorted({g["pci"] for g in present.values() if g["pci"]} | lost)
    # nvidia-smi numbers GPUs in PCI bus order: the lost ones take the free numbers, if the present ones agree.
    if all(g["pci"] in ordered and ordered.index(g["pci"]) == i for i, g in present.items()):
        for pci in lost:
            index = ordered.index(pci)
            present[index] = {"index": index, "pci": pci, "uuid": (ids.get(pci) or {}).get("uuid"), "name": None,
                              "lost": True}
    return present


def _visible(value):
    if value is None:
        return None
    text = str(value).strip()
    if text in ("", "all"):
        return None
    return [v.strip() for v in text.split(",") if v.strip()]


def gpu_for(evidence, local_rank, cuda_visible_devices=None):
    """The physical GPU of a local rank on a node: {index, pci, uuid, name, lost, basis} (values None when unknown)."""
    empty = {"index": None, "pci": None, "uuid": None, "name": None, "lost": None, "basis": None}
    if not isinstance(local_rank, int) or local_rank < 0:
        return dict(empty, basis="local rank unknown")
    table = gpu_table(evidence)
    visible = _visible(cuda_visible_devices)
    order = None
    for proc in (evidence or {}).get("processes") or []:
        env = proc.get("env") or {}
        if env.get("LOCAL_RANK") == str(local_rank):
            visible = _visible(env.get("CUDA_VISIBLE_DEVICES")) or visible
            order = env.get("CUDA_DEVICE_ORDER")
    basis = "local rank %d uses CUDA device %d" % (local_rank, local_rank)
    target = local_rank
    if visible is not None:
        if local_rank >= len(visible):
            return dict(empty, basis="local rank %d beyond CUDA_VISIBLE_DEVICES=%s" % (local_rank, ",".join(visible)))
        entry = visible[local_rank]
        if entry.upper().startswith("GPU-"):
            match = [g for g in table.values() if (g["uuid"] or "").lower().startswith(entry.lower())]
            if not match:
                return dict(empty, basis="CUDA_VISIBLE_DEVICES entry %s matches no GPU of the node" % entry)
            found = dict(match[0])
            found["basis"] = basis + ", CUDA_VISIBLE_DEVICES=%s" % entry
            return found
        if not entry.isdigit():
            return dict(empty, basis="CUDA_VISIBLE_DEVICES entry %s (MIG or unknown) is not mapped" % entry)
        target = int(entry)
        basis += ", CUDA_VISIBLE_DEVICES entry %d" % target
    gpu = table.get(target)
    if gpu is None:
        return dict(empty, index=target, basis=basis + "; the node reported no GPU %d" % target)
    found = dict(gpu)
    found["basis"] = basis + ("" if order == "PCI_BUS_ID" else
                              " (numbering as nvidia-smi's PCI order: CUDA_DEVICE_ORDER=PCI_BUS_ID or identical GPUs)")
    return found
