# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Busy GPUs: a process on a GPU that is not ours. ONE predicate for the node's refusal to burn (busy.yml, through the
kentino.gpufleet.busy_gpus filter) and the GPU_BUSY finding in the report, with the same ignore list (stdlib only).

Burning a busy GPU would disturb someone's job and give wrong figures; a neighbour process is also the usual cause
of CUDA out-of-memory in a job that "should fit".
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, gpu_label
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door

CHECK = "gpu_facts"
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads: what a module passes it.
THRESHOLDS = ("gpufleet_busy_gpu_severity", "gpufleet_busy_ignore_processes")

CODES = {
    # The severity is the site's (a threshold): warn by default, fail in the training gate.
    "GPU_BUSY": ("gpufleet_busy_gpu_severity", "a process not in gpufleet_busy_ignore_processes runs on the GPU"),
}


def _name(process):
    return str(process.get("name") or "")


def foreign_processes(gpu, ignore):
    ignore = set(ignore or [])
    return [p for p in gpu.get("processes") or []
            if _name(p) not in ignore and _name(p).rsplit("/", 1)[-1] not in ignore]


def busy_gpus(gpus, ignore=()):
    """[{index, pci, processes}] of the GPUs with a process that is not in `ignore` (names or basenames)."""
    out = []
    for gpu in gpus or []:
        procs = foreign_processes(gpu, ignore)
        if procs:
            out.append({"index": gpu.get("index"), "pci": gpu.get("pci"), "processes": procs})
    return out


def refusal_reason(busy):
    """The node's reason for not running the invasive checks, or '' when no GPU is busy."""
    if not busy:
        return ""
    return "GPU %s busy: invasive checks not run (stop the process or set gpufleet_force=true)" % ", ".join(
        str(b["index"]) for b in busy)


@judge_door(CHECK, shape=list)
def judge(gpus, t, host):
    out = []
    for busy in busy_gpus(gpus, t["gpufleet_busy_ignore_processes"]):
        procs = busy["processes"]
        who = ", ".join("PID %s (%s, %s MiB)" % (p.get("pid"), p.get("name"), p.get("used_memory_mib"))
                        for p in procs)
        out.append(finding(t["gpufleet_busy_gpu_severity"], "GPU_BUSY", "%s is busy: %s" % (
            gpu_label(host, busy["index"], busy["pci"]), who),
            "stop %s or wait for it, then rerun; a neighbour process is the usual cause of CUDA OOM" % who,
            ["pid=%s name=%s used_memory_mib=%s" % (p.get("pid"), p.get("name"), p.get("used_memory_mib"))
             for p in procs], busy["index"], busy["pci"]))
    return out
