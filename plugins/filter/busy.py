# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Filters kentino.gpufleet.busy_gpus and kentino.gpufleet.busy_reason: the node's refusal to run invasive checks
uses the SAME predicate and ignore list as the report's GPU_BUSY finding (module_utils/judge_busy.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_busy import busy_gpus, refusal_reason


def _busy_gpus(gpus, ignore=None):
    if gpus is None:
        return []
    if not isinstance(gpus, list):
        raise AnsibleFilterError("busy_gpus expects the gpufleet_gpus list, got %s" % type(gpus).__name__)
    if ignore is not None and not (isinstance(ignore, list) and all(isinstance(x, str) for x in ignore)):
        raise AnsibleFilterError("gpufleet_busy_ignore_processes must be a list of process names, got %r" % (ignore,))
    return busy_gpus([g for g in gpus if isinstance(g, dict)], ignore or [])


def _busy_reason(busy):
    return refusal_reason(busy or [])


class FilterModule:
    def filters(self):
        return {"busy_gpus": _busy_gpus, "busy_reason": _busy_reason}
