#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slurm_node
short_description: Drain, wait for, and resume a Slurm node with a reason gpufleet owns
description:
  - Slurm's side of the node lifecycle (docs/lifecycle.md). Runs on a host with the Slurm client (C(scontrol),
    C(sinfo), C(scancel)) and the right to update nodes; each command is an argv list with a timeout.
  - "O(state=drained) drains the node with the reason C(gpufleet: <code> <gpu> <detail>), unless it is drained already
    (by gpufleet, or by someone else, whose reason is left as it is)."
  - O(state=ready) waits until the node is DRAINED (no job left on it, as scontrol's state and sinfo's agree), up to
    O(wait) seconds; then RV(action=repair), or RV(action=give_up) with why (a job still runs; the node stays drained).
    Jobs are cancelled only with O(cancel_jobs=true).
  - O(state=resumed) resumes the node only when its drain reason starts with C(gpufleet:); a node drained by someone
    else fails with RV(slurm_state=foreign_drain) and stays drained.
  - Every failure of Slurm is a named RV(slurm_state) with a message (controller_down, auth_failed, unknown_node,
    permission_denied, timeout, missing_tool, unparsed, not_drained, foreign_drain, bad_input); nothing is resumed
    on a guess.
version_added: "0.3.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.node_module
attributes:
  check_mode:
    support: full
    details: A dry run. The node's state is read; every command that would change Slurm is returned in RV(steps) with
      C(run=false) and not run.
options:
  name:
    description: The node's name in Slurm (C(NodeName=) in slurm.conf).
    type: str
    required: true
  state:
    description: What to make of the node (see the description).
    type: str
    choices: [query, drained, ready, resumed]
    default: query
  code:
    description: The finding code the drain reason starts with (UPPER_SNAKE, such as C(XID_CRITICAL)).
    type: str
  gpu:
    description: The GPU the finding is about (index or PCI address), written into the reason.
    type: str
  detail:
    description: A few words more for the reason (printable ASCII; the whole reason is at most 200 characters).
    type: str
  wait:
    description: Seconds O(state=ready) waits for the node's jobs to end.
    type: int
    default: 3600
  poll:
    description: Seconds between two reads of the node's state while waiting.
    type: int
    default: 30
  cancel_jobs:
    description: Cancel the node's jobs (C(scancel --nodelist)) when they outlive O(wait). Never done unless asked.
    type: bool
    default: false
  bin_dir:
    description: Directory of scontrol, sinfo and scancel (default the PATH).
    type: path
  timeout:
    description: Seconds each Slurm command may take.
    type: int
    default: 30
"""

EXAMPLES = r"""
- name: Quarantine the node in Slurm
  kentino.gpufleet.slurm_node:
    name: gpu01
    state: drained
    code: XID_CRITICAL
    gpu: "0000:3b:00"
    detail: XID 79
  delegate_to: "{{ gpufleet_slurm_controller }}"

- name: Wait until no job runs on it (at most an hour)
  kentino.gpufleet.slurm_node:
    name: gpu01
    state: ready
    wait: 3600
  register: __drained
  delegate_to: "{{ gpufleet_slurm_controller }}"

- name: Return it to Slurm after its validation passed
  kentino.gpufleet.slurm_node:
    name: gpu01
    state: resumed
  delegate_to: "{{ gpufleet_slurm_controller }}"
"""

RETURN = r"""
action:
  description: What was done or decided (none, drain, keep, resume, repair, give_up).
  returned: success
  type: str
why:
  description: Why, in the operator's words.
  returned: success
  type: str
node:
  description: The node as scontrol showed it (name, state, base, flags, reason, reason_user, drained, draining,
    owned).
  returned: when Slurm answered
  type: dict
waited_s:
  description: Seconds O(state=ready) waited.
  returned: when state is ready
  type: float
slurm_state:
  description: The named failure (controller_down, auth_failed, unknown_node, ...), or null.
  returned: always
  type: str
steps:
  description: Every command, as argv, and whether it ran (false in check mode for those that change Slurm).
  returned: always
  type: list
  elements: dict
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import slurm
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool


def _runner(argv, timeout_s):
    result = run_tool(argv, timeout_s)
    return result.rc, result.stdout, result.stderr, result.timed_out, result.error


def main():
    module = AnsibleModule(argument_spec=dict(
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["query", "drained", "ready", "resumed"], default="query"),
        code=dict(type="str"), gpu=dict(type="str"), detail=dict(type="str"),
        wait=dict(type="int", default=3600), poll=dict(type="int", default=30),
        cancel_jobs=dict(type="bool", default=False), bin_dir=dict(type="path"),
        timeout=dict(type="int", default=30),
    ), required_if=[("state", "drained", ("code",))], supports_check_mode=True)
    p = module.params
    tools = dict((t, os.path.join(p["bin_dir"], t) if p["bin_dir"] else t) for t in ("scontrol", "sinfo", "scancel"))
    client = slurm.SlurmClient(_runner, timeout_s=max(1, p["timeout"]), dry_run=module.check_mode, **tools)
    try:
        if p["wait"] < 0 or p["poll"] < 1:
            raise slurm.SlurmError("bad_input", "wait must be at least 0 and poll at least 1 second")
        if p["state"] == "query":
            node = client.show(p["name"])
            done = {"action": "none", "why": "state %s" % node["state"], "node": node}
        elif p["state"] == "drained":
            done = slurm.quarantine(client, p["name"], slurm.drain_reason(p["code"], p["gpu"], p["detail"]))
        elif p["state"] == "resumed":
            done = slurm.release(client, p["name"])
        else:
            done = slurm.wait_drained(client, p["name"], p["wait"], time.monotonic, time.sleep, p["poll"],
                                      p["cancel_jobs"])
    except slurm.SlurmError as exc:
        module.fail_json(msg=str(exc), slurm_state=exc.state, steps=client.steps)
    changed = any(s["run"] for s in client.steps if s["argv"][1:2] == ["update"] or s["argv"][0].endswith("scancel"))
    module.exit_json(changed=changed, slurm_state=None, steps=client.steps, **done)


if __name__ == "__main__":
    main()
