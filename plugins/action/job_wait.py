# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Action kentino.gpufleet.job_wait: wait for an async job with long polls on the node; show progress; keep the lease.

Documentation and the argument_spec live in plugins/modules/job_wait.py.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.kentino.gpufleet.plugins.modules.job_wait import ARGUMENT_SPEC

display = Display()
# The envelope the wait adds; the job's own keys (its module result) are returned as they are.
_WAIT_KEYS = ("waited_s", "polls")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if args["poll"] < 1 or args["timeout"] < 1:
            raise AnsibleActionFail("poll and timeout must be at least 1 second")
        jid = args["job"].get("ansible_job_id")
        if not jid:
            # Started synchronously (check mode) or skipped: that result is the job's result.
            result.update(args["job"])
            return result
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        host = task_vars.get("inventory_hostname", "?")
        started = time.monotonic()
        last_progress = started
        polls = 0
        module_args = {"jid": jid, "_async_dir": async_dir, "wait": args["poll"], "cleanup": True}
        if args["run_id"] and args["state_dir"]:
            module_args.update(run_id=args["run_id"], state_dir=args["state_dir"])
        while True:
            waited = time.monotonic() - started
            module_args["wait"] = int(max(1, min(args["poll"], args["timeout"] - waited)))
            answer = self._execute_module(module_name="kentino.gpufleet.job_status", module_args=module_args,
                                          task_vars=task_vars)
            polls += 1
            waited = round(time.monotonic() - started, 1)
            if answer.get("failed"):
                result.update(failed=True, msg="waiting for %s: %s" % (args["label"], answer.get("msg")),
                              waited_s=waited, polls=polls)
                return result
            if answer.get("finished"):
                job = dict(answer.get("job") or {})
                job.pop("started", None)
                job.update(finished=True, waited_s=waited, polls=polls)
                if job.get("failed") and not job.get("msg"):
                    job["msg"] = "%s failed on the node without a message" % args["label"]
                result.update(job)
                return result
            if waited >= args["timeout"]:
                result.update(failed=True, waited_s=waited, polls=polls,
                              msg="%s did not finish within %s s (its own timeout should have ended it: the node "
                                  "may be overloaded)" % (args["label"], args["timeout"]))
                return result
            now = time.monotonic()
            if args["progress_every"] and now - last_progress >= args["progress_every"]:
                last_progress = now
                planned = " / %d s planned" % args["planned"] if args["planned"] else ""
                display.display("  %s: %s running, %d s%s" % (host, args["label"], int(waited), planned))
