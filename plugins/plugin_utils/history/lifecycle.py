# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""A node's lifecycle, as data in the history store (controller side).

    healthy -> suspect -> quarantined -> repairing -> validating -> healthy
                               |                           |
                               +-> lemon -> rma            +-> quarantined (the next rung, or rma)

Every transition is one row of the store's `lifecycle` table: from, to, reason, the finding code and GPU it is
about, its evidence lines, who made it (ACTORS) and when. TRANSITIONS is the one table of what may follow what, and
who may make it; `plan` is the pure decision (what rows a request adds to a node's rows), `transition` writes it in
one transaction, so two triggers for one node at once (the watcher's alert and the nightly audit) give one quarantine.

The lemon rule: a node quarantined for a new fault (from healthy or suspect) gpufleet_lemon_quarantines times within
gpufleet_lemon_window_days goes on to lemon, then rma: a fault that comes back within days was not fixed by repair.
"""

from __future__ import annotations

import re
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import lines
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULTS

STATES = ("healthy", "suspect", "quarantined", "repairing", "validating", "lemon", "rma")
# States in which the node is out of service (drained in Slurm): a new trigger adds nothing.
OUT_OF_SERVICE = ("quarantined", "repairing", "validating", "lemon", "rma")
FINDERS = ("audit", "burn_in", "preflight", "watcher", "alert")
VALIDATORS = ("preflight", "burn_in", "repair")
# Who makes a transition: a finder, the repair ladder, a validation, the lemon rule, or an operator
# ("operator:<name>", allowed for every transition of the table).
ACTOR = re.compile(r"\A(?:audit|burn_in|preflight|watcher|alert|repair|lemon_rule|operator:[A-Za-z0-9._@-]{1,64})\Z")

# (from, to) -> (who besides an operator may make it, what it means). The one table: the store, the CLI, the
# playbook and docs/lifecycle.md read it.
TRANSITIONS = {
    ("healthy", "suspect"): (FINDERS, "a warning, or an alert to confirm"),
    ("healthy", "quarantined"): (FINDERS, "a critical finding: drained in Slurm"),
    ("suspect", "quarantined"): (FINDERS, "the suspicion confirmed: drained in Slurm"),
    ("suspect", "healthy"): (VALIDATORS, "a validation passed: the suspicion is cleared"),
    ("quarantined", "repairing"): (("repair",), "a rung of the repair ladder starts"),
    ("quarantined", "validating"): (VALIDATORS, "re-validated without a repair (an operator fixed it by hand)"),
    ("quarantined", "lemon"): (("lemon_rule",), "quarantined too often: repair does not fix it"),
    ("quarantined", "rma"): (("repair",), "the repair ladder is exhausted"),
    ("repairing", "validating"): (("repair",), "the rung ran: its validation starts"),
    ("repairing", "quarantined"): (("repair",), "the rung could not run or failed: the node stays out"),
    ("validating", "healthy"): (VALIDATORS, "the validation passed: resumed in Slurm"),
    ("validating", "quarantined"): (VALIDATORS, "the validation failed: the next rung, or rma"),
    ("lemon", "rma"): (("lemon_rule",), "a lemon goes to RMA with its evidence bundle"),
    ("rma", "validating"): ((), "the replaced part is back: validate before it returns"),
}
CODE = re.compile(r"\A[A-Z][A-Z0-9_]{0,63}\Z")
GPU = re.compile(r"\A(?:[0-9]{1,3}|[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-7])?)\Z")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_REASON = 300


class LifecycleError(ValueError):
    """A transition refused: the message names the node, the states and what is allowed instead."""


def state_of(rows):
    """A node's current state: the newest transition's target (healthy without any)."""
    return rows[-1]["to_state"] if rows else "healthy"


def allowed(from_state, to_state, actor):
    """None when `actor` may move a node from `from_state` to `to_state`, else why not."""
    if from_state not in STATES or to_state not in STATES:
        return "unknown state %r -> %r (states: %s)" % (from_state, to_state, ", ".join(STATES))
    entry = TRANSITIONS.get((from_state, to_state))
    if entry is None:
        nexts = sorted(t for f, t in TRANSITIONS if f == from_state)
        return "%s -> %s is not a transition of the lifecycle (from %s: %s)" % (
            from_state, to_state, from_state, ", ".join(nexts))
    if not actor.startswith("operator:") and actor not in entry[0]:
        return "%s -> %s is made by %s, not %s" % (from_state, to_state,
                                                   ", ".join(entry[0] + ("an operator",)), actor)
    return None


def _check_inputs(host, reason, actor, code, gpu):
    if not isinstance(actor, str) or not ACTOR.match(actor):
        raise LifecycleError("node %s: actor %r is not one of %s or operator:<name>" % (
            host, actor, ", ".join(FINDERS + ("repair", "lemon_rule"))))
    if not isinstance(reason, str) or not reason.strip() or CONTROL.search(reason) or len(reason) > MAX_REASON:
        raise LifecycleError("node %s: the reason must be one line of 1 to %d characters without control "
                             "characters, got %r" % (host, MAX_REASON, reason))
    if code is not None and not (isinstance(code, str) and CODE.match(code)):
        raise LifecycleError("node %s: finding code %r is not UPPER_SNAKE (e.g. XID_CRITICAL)" % (host, code))
    if gpu is not None and not (isinstance(gpu, str) and GPU.match(gpu)):
        raise LifecycleError("node %s: GPU %r is neither an index nor a PCI address dddd:bb:dd" % (host, gpu))


def lemon_count(rows, now, window_days):
    """How many times the node was quarantined for a new fault (from healthy or suspect) in the window."""
    since = now - window_days * 86400.0
    return sum(1 for r in rows if r["to_state"] == "quarantined" and r["from_state"] in ("healthy", "suspect")
               and r["ts"] >= since)


def handled_before(rows, started):
    """The node's last return to service (its newest validating -> healthy row) when a fault that started at
    `started` (epoch seconds: an alert's startsAt) began before it, else None. Such a trigger is the fault already
    handled, not a new one: an alert keeps firing for its hour and Alertmanager repeats it (repeat_interval), so a
    node released within that hour would be drained again by the same old XID."""
    if started is None:
        return None
    back = next((r for r in reversed(rows) if r["from_state"] == "validating" and r["to_state"] == "healthy"), None)
    return back if back is not None and started < back["ts"] else None


def plan(rows, host, to_state, reason, actor, code=None, gpu=None, evidence=(), now=None, t=None, started=None):
    """The rows a request adds to a node's transitions `rows` (pure). A request for the state the node is in adds
    nothing, and so does a finder's request the table does not allow while the node is out of service (the second
    trigger of one fault; a failed validation is allowed and moves it), and a finder's request about a fault that
    started (`started`, epoch seconds) before the node's last return to service (handled_before); a
    transition the table does not allow raises LifecycleError. A quarantine for a new fault that makes the lemon rule
    true adds quarantined -> lemon -> rma behind it."""
    _check_inputs(host, reason, actor, code, gpu)
    now = time.time() if now is None else now
    current = state_of(rows)
    why = allowed(current, to_state, actor)
    if to_state == current or (why and actor in FINDERS and current in OUT_OF_SERVICE and to_state in (
            "suspect", "quarantined")):
        return []
    if actor in FINDERS and to_state in ("suspect", "quarantined") and handled_before(rows, started):
        return []
    if why:
        raise LifecycleError("node %s: %s" % (host, why))
    row = {"ts": now, "from_state": current, "to_state": to_state, "reason": reason, "code": code, "gpu": gpu,
           "evidence": lines(list(evidence)), "actor": actor}
    new = [row]
    t = dict(DEFAULTS, **(t or {}))
    limit, days = int(t["gpufleet_lemon_quarantines"]), float(t["gpufleet_lemon_window_days"])
    if to_state == "quarantined" and current in ("healthy", "suspect") and limit > 0:
        count = lemon_count(rows + new, now, days)
        if count >= limit:
            why = "quarantined %d times in %g days (gpufleet_lemon_quarantines %d): repair does not fix it" % (
                count, days, limit)
            new.append(dict(row, from_state="quarantined", to_state="lemon", reason=why, actor="lemon_rule"))
            new.append(dict(row, from_state="lemon", to_state="rma", reason="a lemon goes to RMA with its evidence "
                            "bundle", actor="lemon_rule"))
    return new


def transition(history, host, to_state, reason, actor, code=None, gpu=None, evidence=(), now=None, t=None,
               started=None):
    """Write what `plan` decides, atomically (one write transaction reads the node's rows and adds the new ones).
    Returns {host, previous, state, added}."""
    seen = {}

    def decide(rows):
        seen["previous"] = state_of(rows)
        return plan(rows, host, to_state, reason, actor, code, gpu, evidence, now, t, started)

    added = history.change_lifecycle(host, decide)
    return {"host": host, "previous": seen["previous"], "state": added[-1]["to_state"] if added else
            seen["previous"], "added": added}


def summary(rows, now=None, t=None):
    """What a view shows of a node's lifecycle: its state, since when, the quarantines counting for the lemon rule."""
    t = dict(DEFAULTS, **(t or {}))
    now = time.time() if now is None else now
    return {"state": state_of(rows), "since": rows[-1]["ts"] if rows else None,
            "quarantines_in_window": lemon_count(rows, now, float(t["gpufleet_lemon_window_days"])),
            "lemon_quarantines": int(t["gpufleet_lemon_quarantines"]),
            "window_days": float(t["gpufleet_lemon_window_days"]), "transitions": rows}


def fault_of(rows):
    """The fault the node is out of service for: the newest quarantine for a new fault (from healthy or suspect),
    as its row (code, gpu, evidence, ts), or None."""
    return next((r for r in reversed(rows) if r["to_state"] == "quarantined" and r["from_state"] in (
        "healthy", "suspect")), None)


RUNG_LINE = "rung: "


def rungs_tried(rows):
    """The repair rungs tried since the node's newest fault (each repairing row names its rung as an evidence line
    `rung: <name>`), oldest first."""
    fault = fault_of(rows)
    if fault is None:
        return []
    since = rows.index(fault)
    return [line[len(RUNG_LINE):] for r in rows[since:] if r["to_state"] == "repairing"
            for line in r["evidence"][:1] if line.startswith(RUNG_LINE)]
