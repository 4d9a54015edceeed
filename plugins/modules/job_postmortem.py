#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

# The work happens in the action plugin of the same name (plugins/action/job_postmortem.py) on the controller; this
# file carries the documentation and the argument_spec the action validates against, as collections do for actions.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: job_postmortem
short_description: Name the rank, node, GPU and reason of a training job that hung on NCCL
description:
  - Runs on the controller (an action plugin) after kentino.gpufleet.job_evidence collected every node of the job.
    Reads each host's registered O(evidence_var) from hostvars and writes C(postmortem.json) (versioned schema,
    validated), C(postmortem.md) and C(postmortem.html) under O(report_dir)/O(run_id)/, then points
    O(report_dir)/latest at it.
  - "The window: O(since)/O(until) when given; else the last timeout in the logs - T is when the watchdog fired,
    the window runs from T minus the timeout (when the stuck collective started) minus O(pre_s) to the last timeout
    plus O(post_s); without timed log lines, from the stuck collective of the flight-recorder dumps."
  - From the dumps (read with a restricted unpickler - dicts, lists, strings and numbers only, size, time and memory
    limited, a forged memo index refused before loading - never executed; the private controller files the
    job_evidence action kept them in are deleted once read), per process group the last enqueued/started/completed collective of every rank, the
    ranks that never joined the stuck collective, mismatched collectives (op, sizes, dtypes) with the code location,
    and ranks without a dump. From the watchdog lines of all nodes, the rank behind the others, the op and sequence
    that timed out, heartbeat-monitor kills.
  - "The join: culprit rank -> node (dump files, torchrun's log prefixes, the elastic summary, live workers) -> local
    rank -> GPU (CUDA_VISIBLE_DEVICES, nvidia-smi's PCI order, lost GPUs included) -> that GPU's XIDs and lost events
    in the window -> the action: XID 79 reseat the riser and recable power before any RMA; several GPUs of one PSU
    rail lost together the PSU; XID 48/63/64 RMA; no hardware evidence and a mismatched collective - the code
    location."
  - One verdict with its confidence (high, medium, low, none) and every piece of evidence; equally suspect ranks are
    named together. A node without evidence (unreachable, collection failed) leaves its ranks as "no evidence" and
    the rest is analysed.
  - Does not fail on a verdict; fails only when the post-mortem cannot be written.
version_added: "0.1.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - kentino.gpufleet.action_plugin
attributes:
  check_mode:
    support: full
    details: Read-only; check mode runs the same reads.
options:
  hosts:
    description: The job's nodes. Default C(ansible_play_hosts_all) of the play the task runs in.
    type: list
    elements: str
  evidence_var:
    description: Name of the variable each host registered the kentino.gpufleet.job_evidence result in.
    type: str
    default: gpufleet_job_evidence
  since:
    description: Start of the window (ISO 8601, C(@epoch), or relative to now such as C(-2h)). Default the last timeout.
    type: str
  until:
    description: End of the window (same forms as O(since)).
    type: str
  world_size:
    description: Ranks in the job; default from the dumps' process-group config or a live worker's WORLD_SIZE.
    type: int
  pre_s:
    description: Seconds before the stuck collective started that belong to the window (an XID just before it).
    type: float
    default: 300
  post_s:
    description: Seconds after the last timeout that belong to the window (heartbeat kills, the elastic summary).
    type: float
    default: 600
  report_dir:
    description: Directory holding one sub-directory per post-mortem and the C(latest) link.
    type: path
    default: reports/postmortem
  run_id:
    description: Name of this post-mortem's directory. Default C(postmortem-YYYYmmddTHHMMSSZ).
    type: str
  latest_link:
    description: Point O(report_dir)/latest at this post-mortem once every file is written.
    type: bool
    default: true
  max_dump_bytes:
    description: Largest dump read (bytes).
    type: int
    default: 67108864
  max_dump_seconds:
    description: Time limit for reading one dump, in CPU seconds of the reading (a busy controller does not make it
      refuse a dump).
    type: float
    default: 20
  max_dump_memory_mb:
    description: Worst-case memory one dump may need when unpickled; a dump that could need more is refused.
    type: int
    default: 1024
notes:
  - Per host, the XID thresholds of the fleet report (C(gpufleet_psu_rails), C(gpufleet_psu_loss_window_s), the XID
    lists and C(gpufleet_xid_severity_overrides)); the XIDs of the window are judged by the same judge with the same
    numbers, so the findings and actions match the fleet report's. And C(gpufleet_cuda_visible_devices) (the job's
    CUDA_VISIBLE_DEVICES when no worker is alive to read it from).
  - Needs Jinja2 and jsonschema on the controller (dependencies of the project). Check mode analyses without writing.
seealso:
  - module: kentino.gpufleet.job_evidence
  - name: docs/postmortem.md
    description: How it reads the evidence, decides, and what the confidence levels mean.
    link: https://example.invalid/kentino/gpufleet/blob/main/docs/postmortem.md
"""

EXAMPLES = r"""
- name: Post-mortem of the last timeout, on the controller
  kentino.gpufleet.job_postmortem:
    hosts: "{{ groups['trainers'] }}"
  run_once: true
  delegate_to: localhost
  register: job_postmortem

- name: A given window and world size
  kentino.gpufleet.job_postmortem:
    hosts: [node01, node02, node03, node04]
    since: "2024-12-06T18:20:00Z"
    until: "2024-12-06T18:50:00Z"
    world_size: 32
    report_dir: /srv/gpufleet/postmortems
  register: job_postmortem
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
verdict:
  description: kind (hardware, software, rank, tie, undetermined, no_hang_found), confidence, rank(s), host, gpu, pci,
    message, action, evidence.
  returned: always
  type: dict
summary_md:
  description: The verdict and findings as Markdown (what the playbook prints).
  returned: always
  type: str
findings:
  description: Findings by severity.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    hosts=dict(type="list", elements="str"),
    evidence_var=dict(type="str", default="gpufleet_job_evidence"),
    since=dict(type="str"),
    until=dict(type="str"),
    world_size=dict(type="int"),
    pre_s=dict(type="float", default=300),
    post_s=dict(type="float", default=600),
    report_dir=dict(type="path", default="reports/postmortem"),
    run_id=dict(type="str"),
    latest_link=dict(type="bool", default=True),
    max_dump_bytes=dict(type="int", default=64 * 1024 * 1024),
    max_dump_seconds=dict(type="float", default=20),
    max_dump_memory_mb=dict(type="int", default=1024),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="kentino.gpufleet.job_postmortem runs as an action plugin on the controller; this module "
                         "file only documents it. Call it as a task (not with ansible -m on a node).")


if __name__ == "__main__":
    main()
