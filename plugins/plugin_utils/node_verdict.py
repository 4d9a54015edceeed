# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What a check module needs so that its own verdict on the node is the fleet report's (controller side).

The report judges a module's observations with the judges below, the host's inventory thresholds and the node's
context (its GPU models, its interconnect). A stage gives the module exactly those: every threshold its judges read
(the judges' THRESHOLDS, resolved from the host's variables by thresholds.resolve, as the report resolves them:
the filter kentino.gpufleet.check_thresholds), and the context as options. tests/unit/report/test_node_verdict.py
checks, on the recorded runs and on inventories that change every threshold, that the two verdicts are the same.
"""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import (
    judge_busy,
    judge_dcgm,
    judge_dryrun,
    judge_env,
    judge_gpu_burn,
    judge_gpu_health,
    judge_ib,
    judge_nccl,
    judge_samples,
    judge_snapshot,
    judge_storage,
    judge_xid,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import resolve

# module -> the judges the report runs on its result (health_snapshot: each of its parts').
MODULE_JUDGES = {
    "gpu_sample": (judge_samples,),
    "gpu_burn": (judge_gpu_burn,),
    "dcgm_diag": (judge_dcgm,),
    "nccl_test": (judge_nccl,),
    "checkpoint_storage": (judge_storage,),
    "training_env_facts": (judge_env,),
    "train_dryrun": (judge_dryrun,),
    "ib_ports": (judge_ib,),
    "health_snapshot": (judge_snapshot, judge_gpu_health, judge_busy, judge_samples, judge_storage, judge_env,
                        judge_xid),
}


def threshold_names(module):
    """The inventory thresholds the judges of `module` read, in a stable order."""
    if module not in MODULE_JUDGES:
        raise ValueError("%r is not a check module with a verdict (known: %s)" % (module, ", ".join(MODULE_JUDGES)))
    names = []
    for judge in MODULE_JUDGES[module]:
        names += [n for n in judge.THRESHOLDS if n not in names]
    return names


def thresholds_for(module, values, host="this node"):
    """({name: value} of every threshold `module`'s judges read, resolved from a host's variables as the report
    resolves them (unset: the default), [errors])."""
    t, _sources, errors = resolve(values, host)
    names = threshold_names(module)
    return dict((name, t[name]) for name in names), [e for e in errors if any(n in e for n in names)]
