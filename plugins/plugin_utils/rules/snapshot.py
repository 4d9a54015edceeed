# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""health_snapshot results -> findings (judge: module_utils/judge_snapshot), and its parts to the existing rules.

The snapshot's GPU table and XIDs arrive as facts and are judged like gpu_facts' and xid_facts' (rules/health.py,
rules/xid.py). Its reading as a sample, the checkpoint storage and the training environment are the results of
gpu_sample, checkpoint_storage and training_env_facts, validated with the snapshot's schema, and go to their rules.
"""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_snapshot
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import env, samples, storage

MODULE = "health_snapshot"
_LEVELS = ("max", "high", "partial", "low", "none")


def apply(node, data):
    for gpu in data.get("gpus") or []:
        node.gpu(gpu.get("index"), gpu.get("pci"))
        banks = gpu.get("remap_banks") or {}
        for level in _LEVELS:
            node.metric(gpu.get("index"), "remap_banks_" + level, banks.get(level))
        for key in ("utilization_gpu_pct", "clocks_sm_mhz"):
            node.metric(gpu.get("index"), key, gpu.get(key))
    parts = data.get("parts") or {}
    figures = {"budget_s": data.get("budget_s"), "duration_s": data.get("duration_s")}
    figures.update(("%s_s" % name, (part or {}).get("duration_s")) for name, part in parts.items())
    node.judged(MODULE, judge_snapshot.judge(data, node.t, node.host), figures, data.get("not_run"))
    for key, rule in (("gpu_sample", samples), ("storage", storage), ("env", env)):
        if data.get(key) is not None:
            series = dict(node.series)
            rule.apply(node, data[key])
            node.series = series  # one reading is not a curve: the report's charts are for sampled runs
