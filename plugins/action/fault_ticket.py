# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Action kentino.gpufleet.fault_ticket: open (or update) the ticket of a node's fault through a webhook, on the
controller. plugin_utils/tickets.py renders and posts; the history keeps the ticket, so a repeat of the same fault
within the window updates it. Never fails the play: a ticket that could not be sent is a named warning, and the
quarantine it reports stays. Documentation and the argument_spec live in plugins/modules/fault_ticket.py.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext

from ansible.plugins.action import ActionBase
from ansible_collections.kentino.gpufleet.plugins.modules.fault_ticket import ARGUMENT_SPEC
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import tickets
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, HistoryError, run_path


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host, code, gpu = args["host"], args["code"], args["gpu"] or ""
        result.update(changed=False, host=host, ticket=None, action=None)

        def done(state, detail=""):
            ok = state in ("created", "updated")
            result.update(ticket_state=state, msg="node %s: ticket for %s%s: %s%s" % (
                host, code, " GPU " + gpu if gpu else "", state, ": " + detail if detail else ""))
            if not ok and state != "not_configured":
                result["warnings"] = ["%s (%s). The quarantine stands." % (result["msg"], tickets.STATES[state])]
            return result

        if not args["url"]:
            return done("not_configured")
        errors = tickets.check(args["url"], args["template"], args["headers"], args["timeout"])
        if args["window_hours"] < 0:
            errors.append("gpufleet_ticket_update_hours must be at least 0, got %r" % args["window_hours"])
        if errors:
            return done("bad_input", "; ".join(errors))
        report_dir = args["report_dir"] or self._templar.template(task_vars.get("gpufleet_report_dir")) or "reports"
        history_dir = args["history_dir"] or self._templar.template(task_vars.get("gpufleet_history_dir"))
        path = run_path(report_dir, history_dir)
        now = time.time()
        try:  # read only: a dry run creates no history, and a write comes after the POST
            with History(path, readonly=True) if os.path.exists(path) else nullcontext() as history:
                open_ticket = history and history.ticket_of(host, code, gpu, now - args["window_hours"] * 3600.0)
        except HistoryError as exc:
            open_ticket = None
            result["history_error"] = str(exc)
        if open_ticket and open_ticket["tracker"] != args["template"]:
            open_ticket = None  # another tracker's ticket: this one opens its own
        action = "update" if open_ticket else "create"
        values = {"action": action, "ticket": open_ticket["ticket"] if open_ticket else None, "node": host,
                  "state": args["state"], "code": code, "gpu": gpu, "reason": args["reason"] or "",
                  "evidence": list(args["evidence"] or []), "bundle": args["bundle"], "actor": args["actor"] or "",
                  "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "project": args["project"] or "",
                  "updates": (open_ticket["updates"] + 1) if open_ticket else 0}
        try:
            request = tickets.render(args["template"], values)
            if not (isinstance(request, dict) and isinstance(request.get("body"), dict)
                    and isinstance(request.get("path", ""), str) and " " not in request.get("path", "")):
                raise ValueError("it must be a JSON object with a body object and an optional path without spaces")
        except Exception as exc:  # a site's template: any Jinja or JSON error is its author's to fix
            return done("bad_input", "gpufleet_ticket_template %s does not render to the request JSON: %s" % (
                args["template"], exc))
        result.update(action=action, ticket=values["ticket"])
        if self._task.check_mode:
            result.update(ticket_state="planned", request=request)
            return result
        status, answer, failure, detail = tickets.post(args["url"].rstrip("/") + request.get("path", ""),
                                                       request["body"], args["headers"], args["timeout"])
        if failure:
            return done(failure, detail)
        result["changed"] = True
        ticket = values["ticket"] if action == "update" else tickets.ticket_id(answer, request.get("id_field", "id"))
        if ticket is None:
            return done("no_ticket_id", "HTTP %s, no %r in the answer" % (status, request.get("id_field", "id")))
        result["ticket"] = ticket
        try:
            with History(path) as history:
                history.record_ticket(host, code, gpu, args["template"], ticket, now, update=action == "update")
        except HistoryError as exc:
            result["warnings"] = ["node %s: ticket %s was sent but could not be kept in the history (%s): a repeat "
                                  "of this fault will open another" % (host, ticket, exc)]
        return done("updated" if action == "update" else "created", "%s %s (HTTP %s)" % (
            args["template"], ticket, status))
