# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What every check judge does first: a tool that could not run, or a check that was not run (stdlib only)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding


def could_not_run(result, check, host):
    """[error finding] when the result says the tool did not start or timed out, else []."""
    tool = result.get("tool") or {}
    if tool.get("error"):
        reason = "%s could not run: %s" % (check, tool["error"])
    elif tool.get("timed_out"):
        # duration_s includes the kill's grace period, so it is not the timeout the operator set: say what it is.
        reason = ("%s timed out: killed with its process group after running %s s (a hung GPU or tool; raise the "
                  "timeout if the run is legitimately longer)" % (check, tool.get("duration_s")))
    else:
        return []
    evidence = list(result.get("output_tail") or [])
    if tool.get("argv"):
        evidence.append("argv: %s rc=%s timed_out=%s" % (" ".join(str(a) for a in tool["argv"]), tool.get("rc"),
                                                         tool.get("timed_out")))
    return [finding("error", "CHECK_ERROR", "%s: %s" % (host, reason),
                    "make %s runnable on %s (see the reason), then rerun; no result is not a pass" % (check, host),
                    evidence or [reason])]


def fmt_size(size):
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return "%d %s" % (size // factor, unit)
    return "%d B" % size
