# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What every check judge does first: a tool that could not run, or a check that was not run; and the door every judge
goes through (stdlib only).

The shape of a result is checked once, where it enters the controller: rules/reading.py validates it against the
module's JSON Schema and a result that does not match is a RESULT_INVALID error naming the key; the judge is not
called. On the node a judge reads the observations its own module just built. So a judge trusts the schema's shape,
and an exception inside it is a bug in the judge: it is never turned into "unreadable input" here (the report shows
it as RULE_ERROR, a test sees the traceback). The door only refuses a result that is not a mapping at all.

A judge module (judge_<check>.py) declares CHECK (the module it judges), THRESHOLDS (the inventory names it reads)
and CODES: every finding it can return, code -> (severity, what it means), the one severity of that code.
docs/rules.md is generated from the CODES (hack/gen_rules_doc.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULTS


def complete(t):
    """The thresholds a judge reads: those given over the defaults (None = unset, as in thresholds.resolve), so a
    module that passes only its own options still gets every name."""
    out = dict(DEFAULTS)
    if isinstance(t, dict):
        out.update((k, v) for k, v in t.items() if v is not None)
    return out


def unreadable(check, host, why):
    """The error finding of a result the judge cannot read: no verdict, and the reason."""
    return finding("error", "CHECK_ERROR", "%s: the %s result could not be judged: %s" % (host, check, why),
                   "rerun %s on %s with this collection's module; if it persists, report a kentino.gpufleet bug with "
                   "the result" % (check, host), [why])


def judge_door(check, shape=dict, empty=None, takes_t=True):
    """Decorator for judge(result, t, host, ...) and figures(result, ...): completes the thresholds (the argument
    after the result, when takes_t) and answers a result that is not a `shape` with one CHECK_ERROR finding (judges)
    or with empty() (figures, when `empty` is given). What the judge raises is raised (see the module docstring)."""

    def wrap(fn):
        @functools.wraps(fn)
        def door(result, *args, **kwargs):
            if takes_t and args:
                args = (complete(args[0]),) + tuple(args[1:])
            host = str(args[1]) if len(args) > 1 else str(kwargs.get("host", "this node"))
            if not isinstance(result, shape):
                if empty is not None:
                    return empty()
                return [unreadable(check, host, "it is %s, not %s" % (
                    type(result).__name__, "a mapping" if shape is dict else "a list"))]
            return fn(result, *args, **kwargs)

        return door

    return wrap

# code -> (severity, what it means). docs/rules.md is generated from these.
CODES = {
    "CHECK_ERROR": ("error", "a check's tool could not run (not found, not executable, no entrypoint) or timed out; "
                             "the tool's own reason and the last lines it printed"),
}


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
    if not isinstance(size, int) or isinstance(size, bool):
        return "? B" if size is None else "%s B" % (size,)
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return "%d %s" % (size // factor, unit)
    return "%d B" % size
