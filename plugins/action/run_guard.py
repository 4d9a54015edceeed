# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Action kentino.gpufleet.run_guard: refuse a run with a typo, a wrong type or an unwritable report directory before
any node is touched; give it a unique id and the reports lock. Documentation: plugins/modules/run_guard.py."""

from __future__ import annotations

import os
from datetime import datetime, timezone

from ansible import constants as C
from ansible import context
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import connection_loader
from ansible_collections.kentino.gpufleet.plugins.modules.run_guard import ARGUMENT_SPEC
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import run_guard
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.hostvars import host_value, read_host

MAX_ERRORS_SHOWN = 20


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    @staticmethod
    def _ssh_node(hostvars, host, poll, configured_ssh_args, default_poll):
        """(host, ssh_args, poll seconds) of a node reached over SSH, None for another connection (or a poll value
        that is not a number: type_errors says so). poll: the node's gpufleet_poll_interval_s, None when unset."""
        if (host_value(hostvars, host, "ansible_connection") or C.DEFAULT_TRANSPORT) not in run_guard.SSH_CONNECTIONS:
            return None
        ssh_args = host_value(hostvars, host, "ansible_ssh_args") or configured_ssh_args
        try:
            poll = int(default_poll if poll is None else poll)
        except (TypeError, ValueError):
            return None
        return (host, ssh_args, poll) if isinstance(ssh_args, str) else None

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        # Said first, refused or not: a run works without them, but an operator running from another directory (not
        # the one whose ansible.cfg has them) should know.
        for warning in run_guard.controller_config_warnings(C.CALLBACKS_ENABLED, context.CLIARGS.get("forks"),
                                                            len(args["hosts"])):
            self._display.warning(warning)
        hostvars = task_vars.get("hostvars") or {}
        connection_loader.get("ssh", class_only=True)  # loads the ssh plugin's option definitions
        configured_ssh_args = C.config.get_config_value("ssh_args", plugin_type="connection", plugin_name="ssh")
        default_poll = run_guard.role_spec()["gpufleet_poll_interval_s"]["default"]
        ssh_nodes = []
        known = run_guard.known_names() | set(args["extra_known"])
        by_problem = {}  # the same problem on many hosts (an -e typo, a group_vars value) is listed once
        for host in args["hosts"]:
            values = read_host(hostvars, host)
            values.pop("ansible_facts", None)
            ssh_nodes.append(self._ssh_node(hostvars, host, values.get("gpufleet_poll_interval_s"), configured_ssh_args,
                                            default_poll))
            site = values.get("gpufleet_site_vars") or []
            site = set(site) if isinstance(site, list) else set()
            for message in run_guard.unknown_variables(host, values, known | site) + run_guard.type_errors(host, values):
                by_problem.setdefault(message.split(": ", 1)[1], []).append(host)
        # Also said before a refusal: the next run would have it too.
        for warning in run_guard.ssh_persist_warnings([node for node in ssh_nodes if node]):
            self._display.warning(warning)
        errors = ["host%s %s: %s" % ("s" if len(hosts) > 1 else "", run_guard.hosts_text(hosts), problem)
                  for problem, hosts in by_problem.items()]
        report_dir = os.path.expanduser(args["report_dir"])
        problem = run_guard.check_report_dir(report_dir)
        if problem:
            errors.append(problem + "; fix it or set gpufleet_report_dir, before the run (the report is written last)")
        if errors:
            shown = errors[:MAX_ERRORS_SHOWN]
            more = len(errors) - len(shown)
            raise AnsibleActionFail("refusing to start: %d problem(s) found before touching any node:\n  - %s%s" % (
                len(errors), "\n  - ".join(shown), "\n  (%d more)" % more if more else ""))
        note = run_guard.new_reports_note(report_dir)
        if note:
            self._display.display(note)
        run_id = run_guard.new_run_id()
        lock = None
        if not self._task.check_mode:
            # Workers are forked by ansible-playbook: the parent is the run's process, which the lock records.
            lock, held = run_guard.take_lock(report_dir, run_id, os.getppid(), args["playbook"] or "?")
            if held:
                raise AnsibleActionFail(held)
        result.update(changed=False, run_id=run_id, lock=lock, report_dir=report_dir,
                      started=datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
                      msg="run %s: %d host(s) checked" % (run_id, len(args["hosts"])))
        return result
