#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

# The work happens in the action plugin of the same name (plugins/action/node_lifecycle.py) on the controller; this
# file carries the documentation and the argument_spec the action validates against, as collections do for actions.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: node_lifecycle
short_description: Record a node's lifecycle transition (quarantine, repair, validation, return, lemon, RMA) in the history
description:
  - Runs on the controller (an action plugin). Moves node O(host) to O(state) in the history's lifecycle with a
    reason, the finding (O(code), O(gpu)), its evidence and who made it (O(actor)), as the one transition table of
    docs/lifecycle.md allows; a transition the table does not allow fails with what is allowed instead.
  - Idempotent. A request for the state the node is in records nothing; a finder's trigger (audit, burn_in,
    preflight, watcher, alert) for a node already out of service records nothing, also when two arrive at once (one
    write transaction reads and adds), so one fault makes one quarantine.
  - A quarantine for a new fault that makes the lemon rule true (C(gpufleet_lemon_quarantines) in
    C(gpufleet_lemon_window_days), the node's inventory values) records quarantined, lemon and rma.
  - O(state=healthy) from quarantined or rma goes through validating; with O(require_validation=true) it is refused
    unless a preflight or burn-in passed (in the history) after the node was last quarantined.
  - O(state=query) records nothing and returns the node's lifecycle as the lifecycle playbook reads it.
  - In check mode nothing is written, and RV(added) is what would be recorded.
version_added: "0.3.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - kentino.gpufleet.action_plugin
attributes:
  check_mode:
    support: full
    details: The dry run; RV(added) lists the transitions that would be recorded.
  platform:
    details: Runs on the controller; it reads and writes the history store there.
options:
  host:
    description: The node, as the inventory names it.
    type: str
    required: true
  state:
    description: The state to move the node to, or C(query).
    type: str
    choices: [query, healthy, suspect, quarantined, repairing, validating, lemon, rma]
    default: query
  reason:
    description: Why, one line (at most 300 characters, no control characters). Required unless O(state=query).
    type: str
  actor:
    description:
      - Who makes the transition - audit, burn_in, preflight, watcher, alert, repair, lemon_rule, or
        C(operator:<name>) (default C(operator:) and the controller's user).
    type: str
  code:
    description: The finding code (UPPER_SNAKE, such as C(ROW_REMAP_PENDING)); the repair ladder starts from it.
    type: str
  gpu:
    description: The GPU the finding is about (nvidia-smi index or PCI address C(dddd:bb:dd)).
    type: str
  evidence:
    description: Evidence lines (kernel log lines, readings); an XID line decides where the ladder starts.
    type: list
    elements: str
    default: []
  rung:
    description: The repair rung a transition to repairing starts (recorded as its first evidence line).
    type: str
  nvswitch:
    description: The node has NVSwitches (the ladder's fabric manager rung applies).
    type: bool
    default: false
  require_validation:
    description: Refuse O(state=healthy) unless a preflight or burn-in passed since the node was last quarantined.
    type: bool
    default: true
  fault_started:
    description:
      - When the finding's fault started, in epoch seconds (an alert's C(startsAt)). A finder's trigger (O(actor)
        audit, burn_in, preflight, watcher, alert) for a fault that started before the node's last return to service
        (validating to healthy) records nothing and RV(handled) names that return - the fault already handled (an
        alert repeated while it still fires). With O(state=query) it only sets RV(handled).
    type: float
  bundle:
    description: The node's RMA evidence bundle on the controller; its history (XIDs, ECC, lifecycle) is added to it.
    type: path
  report_dir:
    description:
      - The reports directory (default C(gpufleet_report_dir), else C(reports)); the history is
        O(report_dir)/history unless O(history_dir) says otherwise.
    type: path
  history_dir:
    description: Directory of the history store (default C(gpufleet_history_dir)).
    type: path
seealso:
  - module: kentino.gpufleet.slurm_node
  - module: kentino.gpufleet.rma_bundle
"""

EXAMPLES = r"""
- name: Quarantine a node for a critical XID (one quarantine however many triggers)
  kentino.gpufleet.node_lifecycle:
    host: gpu01
    state: quarantined
    reason: XID 79 on GPU 3
    actor: alert
    code: XID_CRITICAL
    gpu: "0000:c1:00"

- name: Read the node's lifecycle, its fault and the ladder's next rung
  kentino.gpufleet.node_lifecycle:
    host: gpu01
  register: lifecycle
"""

RETURN = r"""
state:
  description: The node's state after the request.
  returned: always
  type: str
previous:
  description: The node's state before it.
  returned: always
  type: str
added:
  description: The transitions recorded (from_state, to_state, reason, code, gpu, evidence, actor, ts); in check mode
    those that would be.
  returned: always
  type: list
  elements: dict
out_of_service:
  description: The node is out of service (quarantined, repairing, validating, lemon, rma).
  returned: always
  type: bool
fault:
  description: The fault the node was last quarantined for (ts, code, gpu, reason, evidence, xid), or null.
  returned: always
  type: dict
tried:
  description: The repair rungs tried since that fault.
  returned: always
  type: list
  elements: str
next:
  description: The ladder's next rung for the fault (rung, does, fixes, source, why, validate with the playbook and
    the burn-in's stage switches), or null without a fault.
  returned: always
  type: dict
validation_passed:
  description: The newest preflight or burn-in that passed after the node was last quarantined (run_id, playbook,
    ts, verdict), or null.
  returned: always
  type: dict
handled:
  description: The node's last return to service (ts, at in UTC, reason, actor) when O(fault_started) is before it
    (the fault already handled, nothing recorded), else null.
  returned: always
  type: dict
history_path:
  description: The history file.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    host=dict(type="str", required=True),
    state=dict(type="str", default="query",
               choices=["query", "healthy", "suspect", "quarantined", "repairing", "validating", "lemon", "rma"]),
    reason=dict(type="str"),
    actor=dict(type="str"),
    code=dict(type="str"),
    gpu=dict(type="str"),
    evidence=dict(type="list", elements="str", default=[]),
    rung=dict(type="str"),
    fault_started=dict(type="float"),
    nvswitch=dict(type="bool", default=False),
    require_validation=dict(type="bool", default=True),
    bundle=dict(type="path"),
    report_dir=dict(type="path"),
    history_dir=dict(type="path"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="kentino.gpufleet.node_lifecycle runs as an action plugin on the controller; this module "
                         "file only documents it. Call it as a task (not with ansible -m on a node).")


if __name__ == "__main__":
    main()
