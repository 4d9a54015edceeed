# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Action kentino.gpufleet.job_wait: wait for an async job with long polls on the node; show progress; keep the lease.

Documentation and the argument_spec live in plugins/modules/job_wait.py.
"""

from __future__ import annotations

import math
import posixpath
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.kentino.gpufleet.plugins.modules.job_wait import ARGUMENT_SPEC, ONE_OF

display = Display()
# The envelope the wait adds; the job's own keys (its module result) are returned as they are.
_WAIT_KEYS = ("waited_s", "polls")


def span_text(seconds):
    """'45 s', '2 min', '2 min 30 s', '1 h 5 min' for a progress line."""
    seconds = int(seconds)
    if seconds < 60:
        return "%d s" % seconds
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return "%d min %d s" % (minutes, sec) if sec else "%d min" % minutes
    hours, minutes = divmod(minutes, 60)
    return "%d h %d min" % (hours, minutes) if minutes else "%d h" % hours


def progress_line(host, width, label, elapsed_s, planned_s):
    """One node's progress line. Every node's wait prints at the same whole multiples of progress_every with its
    name padded to the longest name of the play: the lines of one round read as one aligned block."""
    if planned_s:
        if elapsed_s <= planned_s:
            where = "%s of %s planned (%d%%)" % (span_text(elapsed_s), span_text(planned_s),
                                                 int(100 * elapsed_s / planned_s))
        else:
            where = "%s, %s past the %s planned" % (span_text(elapsed_s), span_text(elapsed_s - planned_s),
                                                     span_text(planned_s))
    else:
        where = span_text(elapsed_s)
    return "  %-*s  %s running: %s" % (width, host, label, where)


def _without_omitted(value, omit):
    """The module's options as a task of their own would pass them: `omit` removes the option, at any depth."""
    if isinstance(value, dict):
        return {k: _without_omitted(v, omit) for k, v in value.items() if v != omit}
    if isinstance(value, list):
        return [_without_omitted(v, omit) for v in value if v != omit]
    return value


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def _start(self, args, task_vars):
        """Start the module as `async: <timeout>` with `poll: 0` would; synchronously in check mode."""
        module_args = _without_omitted(args["start"]["args"], task_vars.get("omit"))
        if self._task.check_mode:
            return self._execute_module(module_name=args["start"]["module"], module_args=module_args,
                                        task_vars=task_vars)
        self._task.async_val = args["timeout"]
        try:
            return self._execute_module(module_name=args["start"]["module"], module_args=module_args,
                                        task_vars=task_vars, wrap_async=True)
        finally:
            self._task.async_val = 0

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC, **ONE_OF)
        if args["poll"] < 1 or args["timeout"] < 1:
            raise AnsibleActionFail("poll and timeout must be at least 1 second")
        if args["skip"]:
            # The stage's reason not to run, recorded as a skipped task's: no task of its own for it on every node.
            result.update(skipped=True, skip_reason=args["skip"], changed=False)
            return result
        job = args["job"] if args["start"] is None else self._start(args, task_vars)
        jid = job.get("ansible_job_id")
        if not jid:
            # Started synchronously (check mode), skipped, or failed to start: that result is the job's result.
            result.update(job)
            return result
        # Where the wrapper says it writes the job's status (it expands ~ with the module's environment, which need
        # not be the home `~` expands to for the connection); an older answer without it: the configured directory.
        if job.get("results_file"):
            async_dir = posixpath.dirname(job["results_file"])
        else:
            async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        host = task_vars.get("inventory_hostname", "?")
        width = max([len(str(h)) for h in task_vars.get("ansible_play_batch") or []] + [len(host)])
        every = args["progress_every"]
        started = time.monotonic()
        shown = 0  # rounds of progress_every already printed
        polls = 0
        module_args = {"jid": jid, "_async_dir": async_dir, "wait": args["poll"], "cleanup": True}
        if args["run_id"] and args["state_dir"]:
            module_args.update(run_id=args["run_id"], state_dir=args["state_dir"])
        while True:
            waited = time.monotonic() - started
            wait = min(args["poll"], args["timeout"] - waited)
            if every:
                wait = min(wait, (shown + 1) * every - waited)  # back in time for the next progress line
            module_args["wait"] = int(math.ceil(max(1, wait)))
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
            if every and int(waited // every) > shown:
                shown = int(waited // every)
                display.display(progress_line(host, width, args["label"], shown * every, args["planned"]))
