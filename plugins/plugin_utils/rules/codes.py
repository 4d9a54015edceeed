# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Every finding code of the fleet report and its one severity (controller side).

A code is declared in exactly one CODES table, next to the function that makes it: the judges'
(plugins/module_utils/judge_*.py), the door's (judge_common), the rules' own (rules/__init__.py, rules/reach.py).
Its severity there is a verdict, or the name of the inventory threshold whose value it is (GPU_BUSY:
gpufleet_busy_gpu_severity). Nothing else decides a severity: tests/unit/report/test_severity_table.py checks every
finding the code can make, literally and as judged on the recorded runs, against this table.
"""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import (
    judge_baseline,
    judge_busy,
    judge_common,
    judge_dcgm,
    judge_drift,
    judge_dryrun,
    judge_env,
    judge_fabric,
    judge_gpu_burn,
    judge_gpu_health,
    judge_ib,
    judge_nccl,
    judge_nvlink,
    judge_samples,
    judge_snapshot,
    judge_storage,
    judge_trend,
    judge_xid,
)

JUDGES = (judge_common, judge_gpu_health, judge_busy, judge_xid, judge_samples, judge_gpu_burn, judge_dcgm,
          judge_nccl, judge_storage, judge_env, judge_dryrun, judge_snapshot, judge_nvlink, judge_trend, judge_drift,
          judge_baseline, judge_fabric, judge_ib)


def tables():
    """[(where, CODES)] of every table: the judges' and the rules' own."""
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import reach

    return [(m.__name__.rsplit(".", 1)[-1], m.CODES) for m in JUDGES] + [("rules", rules.CODES), ("reach", reach.CODES)]


def table():
    """{code: severity} of every code; ValueError when a code is declared twice (two places would decide it)."""
    out, where = {}, {}
    for name, codes in tables():
        for code, (severity, _meaning) in codes.items():
            if code in out:
                raise ValueError("finding code %s is declared in %s and in %s: one table per code" % (
                    code, where[code], name))
            out[code], where[code] = severity, name
    return out


def severity_of(code, thresholds=None):
    """The severity a finding of this code has on a node with these thresholds (None for an unknown code)."""
    severity = table().get(code)
    if severity is not None and severity.startswith("gpufleet_"):
        return (thresholds or {}).get(severity) or judge_common.DEFAULTS[severity]
    return severity
