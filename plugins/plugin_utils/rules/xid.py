# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""XID events and lost GPUs from every source -> findings and the XID timeline (judge: module_utils/judge_xid).

Sources of "this GPU is gone": xid_facts events and lost_gpus (the read before the burn and the one after), and the
`lost` problems of gpu_facts, gpu_sample and gpu_burn (nvidia-smi's "GPU is lost" while the kernel log may say
nothing). Every source is joined to the GPU table by PCI address.
"""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_xid

CHECK = "xid_facts"


def _events(xid_reads):
    events, seen = [], set()
    for xid in xid_reads:
        for event in xid.get("events") or []:
            key = (event.get("line"), event.get("xid"), event.get("pci"), event.get("time"), event.get("uptime_s"))
            if key not in seen:
                seen.add(key)
                events.append(event)
    return events


def lost_entries(xid_reads, problem_sources):
    """[{index, pci, time_s, line, why}] of every GPU some source saw vanish."""
    out = []
    for xid in xid_reads:
        for pci in xid.get("lost_gpus") or []:
            out.append({"pci": pci, "line": "xid_facts lost_gpus: %s (fell off the bus)" % pci, "why": "lost"})
    for name, problems in problem_sources:
        for problem in problems or []:
            if problem.get("kind") == "lost":
                out.append({"index": problem.get("index"), "pci": problem.get("pci"),
                            "line": problem.get("line") or problem.get("message"), "why": "lost (%s)" % name})
    return out


def apply(node, xid_reads, problem_sources, unread=None):
    """xid_reads: validated gpufleet_xid dicts; problem_sources: [(module, problems list)]; unread: why the read after
    the burn (a preflight's since the boot) failed, or None: the check is then an error, its XIDs unknown, not absent."""
    gpus = {g["pci"]: i for i, g in node.gpus.items() if g.get("pci")}
    for xid in xid_reads:
        for pci, ids in (xid.get("gpu_ids") or {}).items():
            gpu = node.gpu(pci=pci)
            for key in ("uuid", "serial"):
                if gpu is not None and ids.get(key) and not gpu.get(key):
                    gpu[key] = str(ids[key])
    findings, timeline = judge_xid.judge(_events(xid_reads), lost_entries(xid_reads, problem_sources), node.t,
                                         node.host, gpus)
    seen, init_failures = set(), []
    for read in xid_reads:
        for item in read.get("init_failures") or []:
            if (item.get("pci"), item.get("minor"), item.get("line")) not in seen:
                seen.add((item.get("pci"), item.get("minor"), item.get("line")))
                init_failures.append(item)
    findings += judge_xid.judge_init_failures(init_failures, node.host, gpus)
    if unread:
        findings.append({"severity": "error", "code": "CHECK_ERROR", "message": "%s: the kernel log's XID read "
                         "failed: %s" % (node.host, unread), "action": "make xid_facts runnable on %s (see the reason: "
                         "the journal or dmesg readable, the state directory writable), then rerun; the XIDs of the "
                         "run are unknown, not absent" % node.host, "evidence": [unread]})
    node.timeline = timeline
    node.judged(CHECK, findings, {"events": len(timeline)})
