# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""train_dryrun results -> findings (judge: module_utils/judge_dryrun)."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_dryrun

MODULE = "train_dryrun"


def apply(node, data):
    findings = judge_dryrun.judge(data, node.t, node.host)
    node.judged(MODULE, findings, {"world_size": data.get("world_size"), "step_time_s": data.get("step_time_s")},
                data.get("not_run"), data)
