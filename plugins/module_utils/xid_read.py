# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""xid_facts' read of the kernel log as its registered result (stdlib only: runs on the node).

One reader for the xid_facts module, the burn's job, which reads the XIDs of the window after its load (gpu_burn's
option xid_window) instead of a module round trip of their own, and health_snapshot's XID part.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_reader import ReadError, read_kernel_log
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool


def read(module, source="auto", path=None, state_file=None, since=None, timeout_s=60, overrides=None,
         max_events=500, journalctl=None, dmesg=None):
    """One read of the kernel log from the position saved in state_file (kernel_log_reader.KernelLogRead; the caller
    saves the new one). Raises ReadError. overrides: parsed (xid_policy.parse_overrides); journalctl, dmesg: the
    tools' paths when not on PATH, looked up for the sources that use them."""
    return read_kernel_log(
        source,
        journalctl=find_tool(module, "journalctl", journalctl) if source in ("auto", "journal") else None,
        dmesg=find_tool(module, "dmesg", dmesg) if source in ("auto", "dmesg") else None,
        path=path, state_file=state_file, since=since, timeout_s=timeout_s,
        scanner_options={"severity_overrides": overrides or {}, "max_events": max_events})


def registered(module, source="auto", state_file=None, **options):
    """xid_facts' result: {changed, ansible_facts: {gpufleet_xid}, tool, warnings}, or {failed, msg, tool, notes}
    when the log cannot be read or the position not saved (never raises for either). options: read()'s."""
    try:
        read_ = read(module, source, state_file=state_file, **options)
    except ReadError as exc:
        return {"failed": True, "msg": "xid_facts on %s: %s" % (os.uname()[1], exc), "tool": exc.tool,
                "notes": exc.notes}
    tool = read_.tool.as_dict() if read_.tool is not None else None
    if state_file and not module.check_mode:
        try:
            read_.save()
        except (IOError, OSError) as exc:
            return {"failed": True, "tool": tool,
                    "msg": "xid_facts: cannot save the read position to %s: %s. Fix: make its directory writable "
                           "(become: true) or choose another state_file" % (state_file, exc)}
    return {"changed": False, "ansible_facts": {"gpufleet_xid": read_.facts()}, "tool": tool,
            "warnings": list(read_.position_notes)}
