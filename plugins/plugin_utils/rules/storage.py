# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""checkpoint_storage results -> findings and the checkpoint figures (judge: module_utils/judge_storage)."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_storage

MODULE = "checkpoint_storage"


def apply(node, data):
    findings = judge_storage.judge(data, node.t, node.host)
    node.judged(MODULE, findings, judge_storage.figures(data), data.get("not_run"), data)
