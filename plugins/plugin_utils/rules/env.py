# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""training_env_facts results -> findings (judge: module_utils/judge_env)."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_env

MODULE = "training_env_facts"


def apply(node, data):
    findings = judge_env.judge(data, node.t, node.host)
    statuses = judge_env.statuses(data, node.t["gpufleet_env_expected"])
    node.judged(MODULE, findings, {"variables_ok": sum(1 for s in statuses.values() if s == "ok")},
                data.get("not_run"), data)
