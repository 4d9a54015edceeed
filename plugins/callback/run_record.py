# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
name: run_record
type: aggregate
short_description: Keep what a gpufleet run has found, and write its report when the run is interrupted
description:
  - Records, as they arrive, the results the collection's playbooks register (C(gpufleet_result_*),
    C(gpufleet_xid_before) of older runs), the C(gpufleet_*) facts and the run's id from M(kentino.gpufleet.run_guard).
  - When C(ansible-playbook) ends without finishing the run (Ctrl-C, an error that stops the playbook), it first stops
    the run's work on the nodes that had not finished (C(playbooks/abort.yml) for this run only, which stops the tools, the
    check modules and Ansible's async wrappers), then judges what it has with the same rules as
    M(kentino.gpufleet.fleet_report) and writes the report marked C(interrupted), and releases the reports lock.
    Nodes that had not finished show as C(RUN_INTERRUPTED) with the stage they were in and what was stopped on them;
    a node the stop could not reach stops its work by itself when the run's lease expires, and the finding says so.
  - A run that finishes normally is reported by M(kentino.gpufleet.fleet_report) as always; this callback then does
    nothing.
version_added: "0.2.0"
author: kentino.gpufleet contributors
requirements:
  - enable it with C(callbacks_enabled = kentino.gpufleet.run_record) in ansible.cfg (the repository's ansible.cfg
    and the C(gpufleet) command do)
"""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

from ansible import context
from ansible.plugins.callback import CallbackBase
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import render_md, report, run_guard
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.hostvars import plain
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import reach

_KEEP_REGISTERED = ("gpufleet_xid_before",)
ABORT_PLAYBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "playbooks", "abort.yml")
# ansible-playbook's options that reach the nodes, forwarded to the abort run (prompted passwords cannot be).
_FORWARDED = (("remote_user", "-u"), ("private_key_file", "--private-key"), ("connection", "-c"), ("timeout", "-T"),
              ("ssh_common_args", "--ssh-common-args"), ("ssh_extra_args", "--ssh-extra-args"),
              ("become_method", "--become-method"), ("become_user", "--become-user"))
ABORT_TIMEOUT_S = 180
_ENVELOPE_SKIP = ("invocation", "_ansible_no_log", "_ansible_verbose_always", "stdout_lines", "stderr_lines")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "kentino.gpufleet.run_record"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hosts = {}
        self.play_facts = {}
        self.run = None
        self.report_dir = None
        self.playbook = None
        self._manager = None
        self.finished = False
        self.reported = False
        atexit.register(self._at_exit)

    # --- what the run produces --------------------------------------------------------------------------------
    def v2_playbook_on_start(self, playbook):
        self.playbook = os.path.splitext(os.path.basename(playbook._file_name))[0]

    def v2_playbook_on_play_start(self, play):
        self._manager = play.get_variable_manager()

    def _host(self, result):
        return self.hosts.setdefault(result._host.get_name(), {})

    def _record(self, result):
        task = result._task
        data = result._result
        hv = self._host(result)
        # ansible-core >= 2.19 keeps `register` as {name: projection}; older ones as the name.
        name = next(iter(task.register), None) if isinstance(task.register, dict) else task.register
        if name and (name.startswith("gpufleet_result_") or name in _KEEP_REGISTERED):
            hv[name] = {k: v for k, v in data.items() if k not in _ENVELOPE_SKIP}
        if name == "gpufleet_run" and data.get("run_id"):
            self.run = {"run_id": data["run_id"], "started": data.get("started")}
            self.report_dir = data.get("report_dir") or self.report_dir
        if task.action in ("kentino.gpufleet.fleet_report", "fleet_report"):
            self.reported = True
        facts = data.get("ansible_facts") or {}
        for key, value in facts.items():
            if not str(key).startswith("gpufleet_"):
                continue
            if task.action in ("ansible.builtin.set_fact", "set_fact", "ansible.legacy.set_fact"):
                # A run_once task's facts go to every host of the play (the stage entered: gpufleet_stages), its
                # result to the callback once, under the host that ran it.
                (self.play_facts if task.run_once else hv)[key] = value
            else:
                hv.setdefault("ansible_facts", {})[key] = value

    def v2_runner_on_ok(self, result):
        self._record(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result)

    def v2_runner_on_unreachable(self, result):
        self._record(result)

    def v2_runner_on_skipped(self, result):
        self._record(result)

    def v2_playbook_on_stats(self, stats):
        self.finished = True

    # --- an interrupted run -------------------------------------------------------------------------------------
    def _inventory_values(self, host):
        """The host's gpufleet_* inventory values (thresholds), as the report action would read them."""
        manager = self._manager
        if manager is None:
            return {}
        try:
            inventory_host = manager._inventory.get_host(host)
            values = manager.get_vars(host=inventory_host, include_hostvars=False)
            return {k: plain(v) for k, v in values.items() if str(k).startswith("gpufleet_")
                    and not str(k).startswith("gpufleet_result_") and "{{" not in str(v)}
        except Exception:  # best effort: the defaults are used for what cannot be read
            return {}

    def _at_exit(self):
        if self.finished or self.reported or self.run is None or not self.hosts:
            return
        try:
            self._write_interrupted()
        except Exception as exc:  # never turn an interrupted run into a traceback
            self._display.warning("gpufleet: the interrupted run's report could not be written: %s" % exc)

    def _write_interrupted(self):
        data = {}
        shared = plain(self.play_facts)  # every host's, read as the run left them (never changed below)
        for host, recorded in self.hosts.items():
            if host == "localhost":
                continue
            hv = self._inventory_values(host)
            hv.update(shared)
            hv.update(plain(recorded))
            if not reach.completed(host, hv):
                hv["gpufleet_interrupted"] = True
            data[host] = hv
        if not data:
            return
        unfinished = sorted(h for h, hv in data.items() if hv.get("gpufleet_interrupted"))
        for host, cleanup in self._stop_node_work(unfinished).items():
            data[host]["gpufleet_interrupt_cleanup"] = cleanup
        nodes = report.evaluate_fleet(list(data), data, None)
        fail_on = self._inventory_values("localhost").get("gpufleet_fail_on")  # the run's own gate, never "never"
        doc = report.build_report(nodes, self.run["run_id"], playbook=self.playbook, started=self.run.get("started"),
                                  fail_on=fail_on if fail_on in report.FAIL_ON else "fail", interrupted=True)
        report_dir = os.path.expanduser(self.report_dir or "reports")
        written = report.write_report(doc, report_dir, latest=True, inputs=data)
        run_guard.release_lock(report_dir, doc["run_id"])
        self._display.display("gpufleet: the run was interrupted; what it had is in %s\n%s" % (
            written["files"]["report.html"], render_md.summary_table(doc)))

    def _stop_node_work(self, hosts):
        """{host: {"stopped": [...], "msg"} or {"error"}}: this run's work stopped on `hosts` by playbooks/abort.yml
        (run_cleanup with the run's id), with the inventory, extra vars and connection options of this run."""
        args = context.CLIARGS
        if not hosts or args.get("check"):
            return {}
        self._display.display("gpufleet: the run was interrupted; stopping its work on %d node(s) (abort.yml for run "
                              "%s)..." % (len(hosts), self.run["run_id"]))
        work = tempfile.mkdtemp(prefix="gpufleet-abort.")
        record = os.path.join(work, "stopped.json")
        argv = _ansible_playbook() + [ABORT_PLAYBOOK, "-l", ",".join(hosts + ["localhost"])]
        for source in args.get("inventory") or ():
            argv += ["-i", source]
        for extra in args.get("extra_vars") or ():
            argv += ["-e", extra]
        argv += ["-e", json.dumps({"gpufleet_abort_run_id": self.run["run_id"], "gpufleet_abort_record": record})]
        for key, flag in _FORWARDED:
            if args.get(key):
                argv += [flag, str(args[key])]
        if args.get("become"):
            argv.append("--become")
        for vault_file in args.get("vault_password_files") or ():
            argv += ["--vault-password-file", vault_file]
        proc = None
        try:
            # stdin explicitly: ansible-core makes this process's stdio non-inheritable, and an abort.yml started
            # without an fd 0 opens its next file there, which its workers then clobber now and then ("Could not
            # detach from stdio", "A worker was found in a dead state": the stop fails, the work runs on).
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=ABORT_TIMEOUT_S, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
            with open(record) as fh:
                answers = json.load(fh)
        except (OSError, ValueError, subprocess.SubprocessError, KeyboardInterrupt) as exc:
            why = "interrupted again" if isinstance(exc, KeyboardInterrupt) else str(exc)
            if proc is not None:
                why += ": " + " ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
            return {h: {"error": "abort.yml did not run to the end (%s)" % why} for h in hosts}
        finally:
            shutil.rmtree(work, ignore_errors=True)
        out = {}
        for host in hosts:
            answer = answers.get(host) or {}
            if answer.get("failed") or answer.get("unreachable") or "stopped" not in answer:
                out[host] = {"error": str(answer.get("msg") or "no answer from the node")}
            else:
                out[host] = {"stopped": answer["stopped"], "msg": answer.get("msg")}
        return out


def _ansible_playbook():
    """The ansible-playbook of this run (its own Python and script), else the one on PATH."""
    script = sys.argv[0] if sys.argv and os.path.basename(sys.argv[0]) == "ansible-playbook" else None
    if script and os.path.isfile(script):
        return [sys.executable, script]
    return [shutil.which("ansible-playbook") or "ansible-playbook"]
