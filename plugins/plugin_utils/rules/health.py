# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""gpu_facts -> the node's GPU table, then findings: unreadable nvidia-smi, missing GPUs, memory-health counters,
busy GPUs (judges: module_utils/judge_gpu_health and judge_busy)."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_busy, judge_gpu_health

MODULE = "gpu_facts"
_METRICS = ("temperature_c", "power_w", "pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max",
            "pcie_replays", "ecc_volatile_corrected", "ecc_volatile_uncorrected", "retired_pages_sbe",
            "retired_pages_dbe", "remapped_rows_correctable", "remapped_rows_uncorrectable", "memory_total_mib")


def read_gpus(node, facts):
    for item in facts.get("gpufleet_gpus") or []:
        gpu = node.gpu(item["index"], item["pci"])
        for key in ("serial", "name", "uuid"):
            if item.get(key) is not None:
                gpu[key] = str(item[key])
        for key in _METRICS:
            if item.get(key) is not None and not isinstance(item[key], bool):
                gpu["metrics"].setdefault(key, item[key])


def apply(node, facts, lost_pcis, busy_is_finding=True):
    """busy_is_finding: a GPU running someone else's process is GPU_BUSY (burn-in, preflight); an audit reads nodes
    at work and only counts them (figure busy_gpus)."""
    findings = judge_gpu_health.judge(facts, node.t, node.host, lost_pcis)
    gpus = facts.get("gpufleet_gpus") or []
    busy = judge_busy.judge(gpus, node.t, node.host)
    if busy_is_finding:
        findings += busy
    expected, source = judge_gpu_health.expected_count(facts, node.t)
    figures = {"gpus": facts.get("gpufleet_gpu_count"), "expected_gpus": expected, "expected_source": source}
    if not busy_is_finding:
        figures["busy_gpus"] = len(judge_busy.busy_gpus(gpus, node.t["gpufleet_busy_ignore_processes"]))
    node.judged(MODULE, findings, figures)
