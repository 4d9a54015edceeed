# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Filter kentino.gpufleet.systemd_arg: one word of an Exec*= line, quoted for systemd (plugin_utils/unit_values)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.unit_values import systemd_arg


def _systemd_arg(value):
    try:
        return systemd_arg(value)
    except ValueError as exc:
        raise AnsibleFilterError("systemd_arg: %s" % exc) from None


class FilterModule:
    def filters(self):
        return {"systemd_arg": _systemd_arg}
