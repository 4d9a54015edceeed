# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Action kentino.gpufleet.job_postmortem: every node's job_evidence -> analysis -> postmortem.json/md/html.

Runs entirely on the controller. Documentation and the argument_spec live in plugins/modules/job_postmortem.py.
"""

from __future__ import annotations

import os
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_xid
from ansible_collections.kentino.gpufleet.plugins.module_utils.job_sources import parse_when
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import resolve
from ansible_collections.kentino.gpufleet.plugins.modules.job_postmortem import ARGUMENT_SPEC
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.hostvars import host_value
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import analysis, document


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        hosts = [str(h) for h in (args.get("hosts") if args.get("hosts") is not None
                                  else task_vars.get("ansible_play_hosts_all") or [])]
        hosts = [h for h in dict.fromkeys(hosts) if h != "localhost"]
        if not hosts:
            raise AnsibleActionFail("no nodes to analyse: the host pattern matched no host (the playbook targets "
                                    "group gpufleet_nodes; pass -e job_postmortem_hosts=<pattern> or -l)")
        now = time.time()
        try:
            since, until = parse_when(args.get("since"), now), parse_when(args.get("until"), now)
        except ValueError as exc:
            raise AnsibleActionFail("since/until: %s" % exc) from exc
        if since is not None and until is not None and until < since:
            raise AnsibleActionFail("until (%s) is before since (%s)" % (args["until"], args["since"]))
        hostvars = task_vars.get("hostvars") or {}
        evidence, thresholds, visible, notes = {}, {}, {}, []
        for host in hosts:
            evidence[host] = host_value(hostvars, host, args["evidence_var"])
            # The XIDs are judged with the node's own thresholds (PSU rails, XID lists, overrides), as in the report.
            values = {name: host_value(hostvars, host, name) for name in judge_xid.THRESHOLDS}
            thresholds[host], _sources, errors = resolve(values, host)
            notes.extend(errors)
            cvd = host_value(hostvars, host, "gpufleet_cuda_visible_devices")
            if isinstance(cvd, (str, int)):
                visible[host] = str(cvd)
        outcome = analysis.analyse(evidence, since=since, until=until, world_size=args.get("world_size"),
                                   pre_s=args["pre_s"], post_s=args["post_s"], thresholds=thresholds, notes=notes,
                                   cuda_visible_devices=visible, max_dump_bytes=args["max_dump_bytes"],
                                   max_dump_seconds=args["max_dump_seconds"],
                                   max_memory_bytes=args["max_dump_memory_mb"] * 1024 * 1024, now=now,
                                   workers=min(4, os.cpu_count() or 1))
        _delete_stored(evidence)
        run_id = args.get("run_id") or time.strftime("postmortem-%Y%m%dT%H%M%SZ", time.gmtime(now))
        doc = document.build(outcome, run_id)
        try:
            document.validate(doc)
        except document.DocumentError as exc:
            raise AnsibleActionFail(str(exc)) from exc
        result.update({"changed": False, "run_id": run_id, "verdict": doc["verdict"],
                       "findings": doc["summary"]["findings"],
                       "summary_md": document.summary_line(doc) + "\nAction: " + doc["verdict"]["action"]})
        if self._task.check_mode:
            result["msg"] = "check mode: analysed, no files written"
            return result
        report_dir = os.path.expanduser(args["report_dir"])
        try:
            written = document.write(doc, report_dir, latest=args["latest_link"])
        except (OSError, document.DocumentError) as exc:
            raise AnsibleActionFail("could not write the post-mortem under %s: %s (check the directory is writable, "
                                    "or set report_dir)" % (report_dir, exc)) from exc
        files = written["files"]
        result.update({"changed": True, "run_dir": written["run_dir"], "json_path": files["postmortem.json"],
                       "md_path": files["postmortem.md"], "html_path": files["postmortem.html"],
                       "msg": document.summary_line(doc)})
        result["summary_md"] += "\nHTML: %s" % files["postmortem.html"]
        return result


def _delete_stored(evidence):
    """The dump files the job_evidence action kept on the controller have been read: remove them and their directories."""
    for path in analysis.stored_dump_files(evidence):
        try:
            os.unlink(path)
            os.rmdir(os.path.dirname(path))  # fails (kept) while other dumps of that node are still there
        except OSError:
            pass
