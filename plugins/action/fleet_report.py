# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Action kentino.gpufleet.fleet_report: hostvars of every node -> rules -> report files -> summary and the gate.

Runs entirely on the controller. Documentation and the argument_spec live in plugins/modules/fleet_report.py.
"""

from __future__ import annotations

import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.kentino.gpufleet.plugins.modules.fleet_report import ARGUMENT_SPEC
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import (
    cadence,
    render_md,
    repair_ladder,
    report,
    run_guard,
)
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.step import HistoryStep
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.hostvars import read_host

display = Display()


def _fallback(doc):
    """Write report.json where it can go (the temp directory); say where, or that only the console has it."""
    path = os.path.join(tempfile.gettempdir(), "gpufleet-report-%s.json" % doc["run_id"])
    try:
        report.write_atomic(path, report.to_json(doc))
        return "report.json was written to %s instead; the summary follows." % path
    except OSError as exc:
        return "no fallback file either (%s); the summary follows." % exc


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)

        fail_on = args.get("fail_on") or task_vars.get("gpufleet_fail_on") or "fail"
        if fail_on not in report.FAIL_ON:
            raise AnsibleActionFail("gpufleet_fail_on must be one of %s, got %r" % (", ".join(report.FAIL_ON),
                                                                                   fail_on))
        if args.get("hosts") is not None:
            hosts, play_hosts = [str(h) for h in args["hosts"]], None
        else:
            hosts = [str(h) for h in task_vars.get("ansible_play_hosts_all") or []]
            play_hosts = {str(h) for h in task_vars.get("ansible_play_hosts") or []}
        if not hosts:
            # An empty fleet must not pass the gate: it is almost always a wrong host pattern or inventory.
            raise AnsibleActionFail("no nodes to judge: the host pattern matched no host in the inventory (the "
                                    "playbooks target group gpufleet_nodes; pass -e gpufleet_hosts=<pattern>)")
        run_id = args.get("run_id") or report.default_run_id()
        hostvars = task_vars.get("hostvars") or {}

        data = {host: read_host(hostvars, host) for host in dict.fromkeys(hosts)}
        report_dir = os.path.expanduser(args["report_dir"])
        # Trends, drift and baselines from the history (read only here; the run is recorded after the report).
        history = HistoryStep(args.get("history_dir") or os.path.join(report_dir, "history"), args["history_days"],
                              args["baseline_reset"], enabled=args["history"] and not self._task.check_mode)
        fabric = args.get("fabric")
        if fabric is not None:
            # Each link's own past (FABRIC_LINK_DEGRADED), then judged like any result, on the row of each node of
            # the search (rules/fabric.py).
            fabric = dict(fabric, link_history=history.link_history(fabric))
            for host in (fabric.get("leaves") or {}) if isinstance(fabric.get("leaves"), dict) else ():
                if host in data:
                    data[host]["gpufleet_result_fabric"] = fabric
        nodes = report.evaluate_fleet(list(data), data, play_hosts)
        history.judge(nodes, data, args.get("playbook"))
        started = args.get("started") or task_vars.get("gpufleet_run_started")
        try:
            doc = report.build_report(nodes, run_id, playbook=args.get("playbook"),
                                      started=str(started) if started else None, fail_on=fail_on)
            if fabric is not None:
                report.add_fabric(doc, fabric)
            if history.enabled:
                # Whether the run lands in the history is known only after the report is written: see the result.
                doc["history"] = {k: v for k, v in history.info.items() if k != "recorded"}
            try:  # the checkpoint plan (docs/training.md): an extra section that must never cost the report
                doc["cadence"] = cadence.report_section(
                    doc, data, history_dir=os.path.dirname(history.path) if history.enabled and history.path else None)
            except Exception as exc:  # noqa: BLE001
                doc["cadence"] = cadence.error_section(exc)
            report.validate_report(doc)
        except report.ReportError as exc:
            raise AnsibleActionFail(str(exc)) from exc

        summary = doc["summary"]
        result.update({
            "changed": False,
            "run_id": doc["run_id"],
            "summary": summary,
            "summary_md": render_md.summary_table(doc),
            "nodes": {n["host"]: n["verdict"] for n in doc["nodes"]},
            "failing_nodes": summary["gate"]["nodes"],
            "gate_failed": summary["gate"]["failed"],
            "config_errors": [f["message"] for n in doc["nodes"] for f in n["findings"] if f["code"] == "CONFIG_INVALID"],
            # What gpufleet_quarantine=critical quarantines: the report's fail verdicts the repair ladder can act on.
            "quarantine": repair_ladder.quarantine_candidates(doc),
        })
        if self._task.check_mode:
            result["msg"] = "check mode: report judged, no files written"
        else:
            try:
                written = report.write_report(doc, report_dir, latest=args["latest_link"], inputs=data,
                                              validate=False)  # validated above
            except (OSError, report.ReportError) as exc:
                run_guard.release_lock(report_dir, doc["run_id"])
                fallback = _fallback(doc)
                raise AnsibleActionFail(
                    "could not write the fleet report under %s: %s. The verdicts are not lost: %s\n%s" % (
                        report_dir, exc, fallback, render_md.summary_table(doc))) from exc
            history.record(doc)
            if history.enabled and doc["history"]["error"] != history.info["error"]:
                # Known only now: the report says it too (written again), not only this run's console.
                doc["history"] = dict(history.info)
                try:
                    written = report.write_report(doc, report_dir, latest=args["latest_link"], inputs=data)
                except (OSError, report.ReportError) as exc:
                    self._display.warning("gpufleet history: the report could not be written again with the "
                                          "history's error (%s)" % exc)
                result["summary_md"] = render_md.summary_table(doc)
            run_guard.release_lock(report_dir, doc["run_id"])
            if history.failed:
                self._display.warning("gpufleet history: %s (the report is written)" % history.info["error"])
            files = written["files"]
            result.update({
                "changed": True,
                "run_dir": written["run_dir"],
                "html_path": files["report.html"],
                "md_path": files["report.md"],
                "json_path": files["report.json"],
                "junit_path": files["junit.xml"],
                "latest": written["latest"],
            })
        result["history"] = history.info
        result["history_failed"] = history.failed
        if args["show_summary"]:
            display.display("%s\nHTML report: %s" % (result["summary_md"], result.get("html_path") or
                                                     "not written (check mode)"))
        if summary["gate"]["failed"] or history.failed:
            # Short: the summary table (node, verdict, worst finding, action) is printed by show_summary.
            reasons = ["gate fail_on=%s: %d of %d node(s) failed it: %s" % (
                fail_on, len(summary["gate"]["nodes"]), len(doc["nodes"]), ", ".join(summary["gate"]["nodes"]))
                + ("; and the fabric (a leaf switch: see the report's fabric section)"
                   if summary["gate"].get("fabric") else "")] if summary["gate"]["failed"] else []
            reasons += ["history: %s" % history.info["error"]] if history.failed else []
            result["msg"] = ("check mode, no files written; " if self._task.check_mode else "") + "; ".join(reasons)
            # With fail_task false the playbook fails in a task of its own: a failed result is printed whole, and
            # summary_md with it, beside the summary already printed.
            result["failed"] = bool(args["fail_task"])
        else:
            result.setdefault("msg", "%d node(s) judged: %s" % (len(doc["nodes"]), render_md.counts_line(doc)))
        return result
