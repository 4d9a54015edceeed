# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Filter kentino.gpufleet.alert_finding: the finding of a node's Alertmanager alerts (plugin_utils/alerts.py), the
newest by its parsed startsAt, never by the text."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.alerts import AlertError, finding


def _alert_finding(alerts):
    try:
        return finding(alerts)
    except AlertError as exc:
        raise AnsibleFilterError("the alert cannot be acted on: %s" % exc) from None


class FilterModule:
    def filters(self):
        return {"alert_finding": _alert_finding}
