# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""dcgm_diag results -> findings (judge: module_utils/judge_dcgm)."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_dcgm

MODULE = "dcgm_diag"


def apply(node, data):
    pci_of = {i: g.get("pci") for i, g in node.gpus.items()}
    findings = judge_dcgm.judge(data, node.t, node.host, pci_of=pci_of)
    node.judged(MODULE, findings, {"level_requested": data.get("level_requested"), "level_run": data.get("level_run"),
                                   "dcgm_version": data.get("dcgm_version")}, data.get("not_run"), data)
