# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Filter kentino.gpufleet.check_thresholds: every inventory threshold a check's judge reads, resolved from the host's
variables exactly as the fleet report resolves them, for the check module's `thresholds` option: the node's own
verdict is computed from the same numbers as the report's (plugin_utils/node_verdict.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.hostvars import plain
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.node_verdict import threshold_names, thresholds_for


def _check_thresholds(variables, module):
    try:
        names = threshold_names(module)
    except ValueError as exc:
        raise AnsibleFilterError("check_thresholds: %s" % exc) from None
    values = {}
    for name in names:
        if name in variables:
            values[name] = plain(variables[name])
    t, errors = thresholds_for(module, values)
    if errors:  # the run guard refuses these before any node is touched; here only when it did not run
        raise AnsibleFilterError("check_thresholds: %s" % "; ".join(errors))
    return t


class FilterModule:
    def filters(self):
        return {"check_thresholds": _check_thresholds}
