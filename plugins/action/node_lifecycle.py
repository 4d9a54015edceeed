# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Action kentino.gpufleet.node_lifecycle: read or move a node's lifecycle in the history, on the controller.

The transition itself is history/lifecycle.py's (one table, one write transaction: two triggers for one node at once
make one quarantine); this adds what the lifecycle playbook asks around it: the fault the node is out for, the rungs
tried since, the ladder's next rung and its validation, and whether a validation passed since the node was last
quarantined. Documentation and the argument_spec live in plugins/modules/node_lifecycle.py.
"""

from __future__ import annotations

import datetime
import getpass
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import PASSING
from ansible_collections.kentino.gpufleet.plugins.modules.node_lifecycle import ARGUMENT_SPEC
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import repair_ladder
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle, rma
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, HistoryError, run_path

# The runs that validate a node (a passing audit reads, it does not load the GPUs).
VALIDATING_PLAYBOOKS = ("preflight", "burn_in")
LEMON_KEYS = ("gpufleet_lemon_quarantines", "gpufleet_lemon_window_days")


def passed_since(runs, since):
    """The newest validation run (preflight or burn-in) that passed after `since` (epoch seconds), or None."""
    return next(({"run_id": r["run_id"], "playbook": r["playbook"], "ts": r["ts"], "verdict": r["verdict"]}
                 for r in runs if r["playbook"] in VALIDATING_PLAYBOOKS and r["verdict"] in PASSING
                 and (since is None or r["ts"] > since)), None)


def describe(rows, runs, nvswitch=False, started=None):
    """What the playbook needs of a node's lifecycle rows and its runs (newest first): the state, the fault, the
    rungs tried, the next rung with its validation, the passing validation since the last quarantine, and the return
    to service that a fault started at `started` came before (the fault already handled)."""
    fault = lifecycle.fault_of(rows)
    back = lifecycle.handled_before(rows, started)
    quarantined = [r["ts"] for r in rows if r["to_state"] == "quarantined"]
    info = {"state": lifecycle.state_of(rows), "out_of_service": lifecycle.state_of(rows) in lifecycle.OUT_OF_SERVICE,
            "fault": None, "tried": lifecycle.rungs_tried(rows), "next": None,
            "validation_passed": passed_since(runs, quarantined[-1] if quarantined else None),
            "quarantined_ts": quarantined[-1] if quarantined else None,
            "handled": None if back is None else {
                "ts": back["ts"], "reason": back["reason"], "actor": back["actor"],
                "at": datetime.datetime.fromtimestamp(back["ts"], datetime.timezone.utc).isoformat(timespec="seconds")}}
    if fault is not None:
        xid = repair_ladder.xid_of(fault["evidence"])
        info["fault"] = {k: fault[k] for k in ("ts", "code", "gpu", "reason", "evidence")}
        info["fault"]["xid"] = xid
        step = repair_ladder.next_rung(fault["code"] or "", info["tried"], xid, nvswitch)
        info["next"] = dict(step, validate=repair_ladder.validation_vars(step["validate"]))
    return info


def _lemon_settings(hostvars, host):
    node = hostvars.get(host) or {}
    out = {}
    for key in LEMON_KEYS:
        if key in node:
            try:
                out[key] = float(node[key]) if key.endswith("_days") else int(node[key])
            except (TypeError, ValueError):
                raise AnsibleActionFail("node %s: %s must be a number, got %r" % (host, key, node[key])) from None
            if out[key] < 0:
                raise AnsibleActionFail("node %s: %s must be at least 0, got %r" % (host, key, node[key]))
    return out


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host, to_state = args["host"], args["state"]
        hostvars = task_vars.get("hostvars") or {}
        if host not in hostvars:
            raise AnsibleActionFail("node %r is not a host of the inventory: name it as the inventory does" % host)
        actor = args["actor"] or "operator:%s" % getpass.getuser()
        evidence = list(args["evidence"] or [])
        if args["rung"]:
            if args["rung"] not in repair_ladder.ORDER:
                raise AnsibleActionFail("node %s: rung %r is not a rung of the ladder (%s)" % (
                    host, args["rung"], ", ".join(repair_ladder.ORDER)))
            evidence.insert(0, lifecycle.RUNG_LINE + args["rung"])
        # Unless given, the run's own places: gpufleet_report_dir (default reports) and gpufleet_history_dir.
        report_dir = args["report_dir"] or self._templar.template(task_vars.get("gpufleet_report_dir")) or "reports"
        history_dir = args["history_dir"] or self._templar.template(task_vars.get("gpufleet_history_dir"))
        path = run_path(report_dir, history_dir)
        settings = _lemon_settings(hostvars, host)
        dry = bool(self._task.check_mode)
        # A query or a dry run only reads (and finds an empty lifecycle where no history exists yet).
        reading = dry or (to_state == "query" and not args["bundle"])
        try:
            history = History(path, readonly=reading) if not reading or os.path.exists(path) else None
        except HistoryError as exc:
            raise AnsibleActionFail("node %s: the lifecycle needs the history: %s" % (host, exc)) from exc
        try:
            rows = history.lifecycle_of(host) if history else []
            started = args["fault_started"]
            before = describe(rows, history.node_runs(host) if history else [], args["nvswitch"], started)
            added = []
            if to_state != "query":
                if to_state == "healthy" and before["state"] != "healthy" and args["require_validation"] and \
                        not before["validation_passed"]:
                    raise AnsibleActionFail(
                        "node %s: no preflight or burn-in passed since it was quarantined%s: it stays out of service. "
                        "Run the repair (gpufleet repair %s) or a preflight first" % (
                            host, "" if before["quarantined_ts"] is None else " (at %s)" % before["quarantined_ts"],
                            host))
                # healthy is reached through validating (the table has no shortcut around a validation).
                path_states = [to_state]
                if to_state == "healthy" and before["state"] in ("quarantined", "rma"):
                    path_states = ["validating", "healthy"]
                for state in path_states:
                    if dry:
                        new = lifecycle.plan(rows, host, state, args["reason"], actor, args["code"], args["gpu"],
                                             evidence, t=settings, started=started)
                    else:
                        new = lifecycle.transition(history, host, state, args["reason"], actor, args["code"],
                                                   args["gpu"], evidence, t=settings, started=started)["added"]
                    rows, added = rows + new, added + new
            if args["bundle"] and not dry:
                rma.add_history(args["bundle"], path, host)
            after = describe(rows, history.node_runs(host) if history else [], args["nvswitch"], started)
        except lifecycle.LifecycleError as exc:
            raise AnsibleActionFail(str(exc)) from exc
        except HistoryError as exc:
            raise AnsibleActionFail("node %s: the lifecycle could not be recorded: %s" % (host, exc)) from exc
        finally:
            if history is not None:
                history.close()
        result.update(after)
        result.update({"changed": bool(added), "host": host, "previous": before["state"], "added": added,
                       "history_path": path,
                       "msg": "node %s: %s" % (host, " -> ".join([before["state"]] + [r["to_state"] for r in added])
                                               if added else "stays %s" % before["state"])})
        if before["handled"] and not added:
            result["msg"] += (" (its fault started before the node's return to service at %s: already handled)"
                              % before["handled"]["at"])
        if dry:
            result["msg"] += " (dry run: nothing recorded)"
        return result
