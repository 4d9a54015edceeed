#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

# The work happens in the action plugin of the same name (plugins/action/fleet_report.py) on the controller; this
# file carries the documentation and the argument_spec the action validates against, as collections do for actions.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: fleet_report
short_description: Judge every node's health results and write the fleet report (JSON, Markdown, HTML, JUnit)
description:
  - Runs on the controller (an action plugin) once per play, after the checks. For every host it reads the
    registered C(gpufleet_result_*) results, the facts C(gpufleet_gpus), C(gpufleet_gpu_problems), C(gpufleet_xid) and
    the stage each node reached (C(gpufleet_stages)) from hostvars, applies the rules (verdict per node and per GPU, evidence, the operator's action)
    and writes C(report.json) (versioned schema, validated), C(report.md), C(report.html) (one self-contained file)
    and C(junit.xml) under O(report_dir)/O(run_id)/, then points O(report_dir)/C(latest) at it.
  - Every file is written atomically (temp file, fsync, rename) and the C(latest) link is swapped last, so an
    interrupted run leaves the previous report intact.
  - Thresholds are inventory variables of each host (per group or host), documented in docs/rules.md; a value of the
    wrong type makes that node V(error) with a message naming the host, the variable and the expected type.
  - Fails (after writing the report) when any node's verdict is at or above O(fail_on), unless O(fail_task=false);
    the message lists the nodes.
  - Fails the same way when the history is enabled and this run could not be recorded in it (a damaged file, a
    read-only mount, no permission, a full disk); the report, RV(summary_md) and RV(history) say why.
    Nodes that could not be checked (V(error), V(unreachable)) count as V(fail) for the gate.
version_added: "0.1.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - kentino.gpufleet.action_plugin
attributes:
  check_mode:
    support: full
    details: Check mode judges and returns the summary without writing files.
  platform:
    details: Runs on the controller; it reads the nodes' results from hostvars.
options:
  hosts:
    description:
      - Hosts to report on. Default C(ansible_play_hosts_all) of the play the task runs in; hosts that dropped out
        of that play (not in C(ansible_play_hosts)) are reported as V(unreachable) with the stage they reached.
      - When the report runs in a separate play (for example on localhost), pass the node list; a node that did not
        finish (its stage in C(gpufleet_stages) is not V(done)) or has an unreachable result is reported as V(unreachable).
    type: list
    elements: str
  report_dir:
    description: Directory holding one sub-directory per run and the C(latest) link; relative to the current directory.
    type: path
    default: reports
  run_id:
    description: Name of this run's directory (letters, digits, C(.), C(_), C(-)). Default a UTC timestamp C(YYYYmmddTHHMMSSZ).
    type: str
  playbook:
    description: Name of the playbook, recorded in the report (burn_in, preflight, audit).
    type: str
  fail_on:
    description:
      - Verdict at or above which the task fails. V(fail) also fails on V(error) and V(unreachable) nodes.
      - Default the inventory variable C(gpufleet_fail_on), else V(fail).
    type: str
    choices: [fail, warn, never]
  started:
    description: When the run started (ISO 8601). Default the variable C(gpufleet_run_started), else now.
    type: str
  latest_link:
    description: Point O(report_dir)/latest at this run once every file is written.
    type: bool
    default: true
  history:
    description:
      - Judge trends, version drift and baselines from the history store and record this run in it (docs/audit.md).
        Before the report is built the history is read; after the report files are written the run is recorded. A
        history that cannot be read or written is said in C(report.json) and the result's RV(history), never a lost
        report. The file is checked when it is opened (SQLite's C(PRAGMA quick_check)); a damaged file is neither read
        nor written.
    type: bool
    default: true
  history_dir:
    description:
      - Directory of the history file (C(gpufleet-history.sqlite3)). Default O(report_dir)/history.
    type: path
  history_days:
    description: Runs older than this many days are removed from the history after each run (0 keeps everything).
    type: int
    default: 400
  baseline_reset:
    description:
      - Record this burn-in's figures as the nodes' new baselines (after a repair), instead of comparing with the
        old ones.
    type: bool
    default: false
  fail_task:
    description:
      - Fail this task (after writing the report) when the gate fails.
      - The collection's playbooks set it to V(false) and fail in a task of their own with a short message, so the
        end of a failing run shows the summary table once (a failed task's whole result is printed, and with it
        RV(summary_md)). RV(gate_failed) says whether the gate failed either way.
    type: bool
    default: true
    version_added: "0.2.0"
  show_summary:
    description:
      - Print the summary (RV(summary_md) and where the HTML report is) as plain text while the task runs, one line
        per node, whatever the callback's result format (as a result value it would be one long JSON string).
    type: bool
    default: false
    version_added: "0.2.0"
  fabric:
    description:
      - A fabric search (RV(kentino.gpufleet.fabric_search#module:search)) to judge with the nodes. The report gains a
        C(fabric) section (the pairs, their figures, the culprit with its evidence and action) and each node of the
        search its C(fabric) check, with the findings that name it (docs/fabric.md).
    type: dict
    version_added: "0.2.0"
notes:
  - Run it once, on the controller (C(run_once) or a play on localhost).
  - Needs Jinja2 and jsonschema on the controller (both are dependencies of the project).
seealso:
  - name: docs/rules.md
    description: Every rule, threshold variable and default.
    link: https://example.invalid/kentino/gpufleet/blob/main/docs/rules.md
"""

EXAMPLES = r"""
- name: Judge every node and write the report at the end of a burn-in play
  kentino.gpufleet.fleet_report:
    playbook: burn_in
  run_once: true
  delegate_to: localhost
  register: gpufleet_report

- name: Report from a separate play on localhost, gating on warnings too
  kentino.gpufleet.fleet_report:
    hosts: "{{ query('inventory_hostnames', 'gpufleet_nodes') }}"
    playbook: preflight
    report_dir: /srv/gpufleet/reports
    run_id: "preflight-{{ lookup('ansible.builtin.pipe', 'date -u +%Y%m%dT%H%M%SZ') }}"
    fail_on: warn
  register: gpufleet_report

- name: Show the summary table
  ansible.builtin.debug:
    msg: "{{ gpufleet_report.summary_md }}"
"""

RETURN = r"""
run_id:
  description: This run's id (the name of its directory).
  returned: always
  type: str
run_dir:
  description: Directory the files were written to (not in check mode).
  returned: when written
  type: str
json_path:
  description: Path of the JSON document (C(report.json), C(postmortem.json)), the source of truth the other files are
    rendered from.
  returned: when written
  type: str
md_path:
  description: Path of the Markdown rendering (C(report.md), C(postmortem.md)).
  returned: when written
  type: str
html_path:
  description: Path of the HTML rendering (C(report.html), C(postmortem.html)).
  returned: when written
  type: str
summary:
  description: Fleet counts (nodes, gpus, verdicts, gpu_verdicts, findings by severity, codes, gate).
  returned: always
  type: dict
  sample: {nodes: 3, gpus: 24, verdict: fail, verdicts: {pass: 2, warn: 0, error: 0, fail: 1, unreachable: 0}}
summary_md:
  description: The Markdown summary table (node, verdict, stage, worst finding, action) and the gate line.
  returned: always
  type: str
nodes:
  description: Verdict per host.
  returned: always
  type: dict
  sample: {gpu-01: pass, gpu-02: fail}
failing_nodes:
  description: Hosts at or above O(fail_on).
  returned: always
  type: list
  elements: str
gate_failed:
  description: Whether the gate failed (a node at or above O(fail_on)), also when O(fail_task=false).
  returned: always
  type: bool
  version_added: "0.2.0"
config_errors:
  description: Inventory threshold variables of the wrong type, one message each naming host, variable and type.
  returned: always
  type: list
  elements: str
quarantine:
  description:
    - The nodes whose verdict is V(fail) with a failing finding the repair ladder knows, each with the finding's code,
      GPU, evidence and message; with C(gpufleet_quarantine=critical) the playbooks quarantine them
      (kentino.gpufleet.lifecycle, docs/lifecycle.md).
  returned: always
  type: dict
junit_path:
  description: Path of junit.xml.
  returned: when written
  type: str
latest:
  description: Path of the latest link, when O(latest_link=true).
  returned: when written
  type: str
history:
  description: The history step (enabled, path, error, recorded, previous_runs, pruned_runs).
  returned: always
  type: dict
  sample: {enabled: true, path: reports/history/gpufleet-history.sqlite3, error: null, recorded: true}
history_failed:
  description: Whether the history is enabled and this run is not recorded in it (or old runs could not be
    removed); RV(history) has the error.
  returned: always
  type: bool
  version_added: "0.2.0"
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    hosts=dict(type="list", elements="str"),
    report_dir=dict(type="path", default="reports"),
    run_id=dict(type="str"),
    playbook=dict(type="str"),
    fail_on=dict(type="str", choices=["fail", "warn", "never"]),
    started=dict(type="str"),
    latest_link=dict(type="bool", default=True),
    history=dict(type="bool", default=True),
    history_dir=dict(type="path"),
    history_days=dict(type="int", default=400),
    baseline_reset=dict(type="bool", default=False),
    fail_task=dict(type="bool", default=True),
    show_summary=dict(type="bool", default=False),
    fabric=dict(type="dict"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="kentino.gpufleet.fleet_report runs as an action plugin on the controller; this module file "
                         "only documents it. Call it as a task (not with ansible -m on a node).")


if __name__ == "__main__":
    main()
