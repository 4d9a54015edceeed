# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""nccl_test results -> findings, with the node's GPU models for the busbw floor (judge: module_utils/judge_nccl)."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_nccl

MODULE = "nccl_test"


def apply(node, data, interconnect=None):
    """interconnect: what the NVLink read found (the pipeline runs rules/nvlink.py first: NCCL reads it)."""
    names = node.gpu_names()
    topology = interconnect
    findings = judge_nccl.judge(data, node.t, node.host, gpu_names=names, sources=node.sources, topology=topology)
    node.judged(MODULE, findings, judge_nccl.figures(data, node.t, names, node.sources, topology),
                data.get("not_run"), data)


def not_applicable(data):
    """Why there is nothing to check (a node with one GPU: no collective between GPUs), else None."""
    why = str(data.get("not_run") or "")
    return why if why.startswith(judge_nccl.ONE_GPU) else None
