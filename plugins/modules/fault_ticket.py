#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

# The work happens in the action plugin of the same name (plugins/action/fault_ticket.py) on the controller; this
# file carries the documentation and the argument_spec the action validates against, as collections do for actions.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: fault_ticket
short_description: Open or update the ticket of a node's fault through a webhook (one JSON POST)
description:
  - Runs on the controller (an action plugin). Renders the request from a tracker's template (V(generic), V(jira),
    V(github), or a site's own template file) and POSTs it as JSON to O(url).
  - One ticket per fault. A repeat of the same fault (node, finding code, GPU) within O(window_hours) of the ticket's
    last update updates that ticket (the history keeps its id or key) instead of opening another.
  - Never fails the play. A webhook that refuses, cannot be reached or times out is a warning with a named
    RV(ticket_state); the quarantine it reports has happened and stays.
version_added: "0.3.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - kentino.gpufleet.action_plugin
attributes:
  check_mode:
    support: full
    details: The request is rendered and returned in RV(request); nothing is sent or kept.
  platform:
    details: Runs on the controller; it reads and writes the history store there.
options:
  host:
    description: The node, as the inventory names it.
    type: str
    required: true
  url:
    description: The webhook (C(gpufleet_ticket_webhook_url)); empty means no tickets.
    type: str
    default: ""
  template:
    description: V(generic), V(jira), V(github), or the absolute path of a template (C(gpufleet_ticket_template)).
    type: str
    default: generic
  headers:
    description: Extra request headers such as C(Authorization) (C(gpufleet_ticket_headers); keep tokens in a vault).
    type: dict
    default: {}
  project:
    description: The tracker's project key, for the jira template (C(gpufleet_ticket_project)).
    type: str
  timeout:
    description: Seconds the webhook may take (C(gpufleet_ticket_timeout_s)).
    type: int
    default: 10
  window_hours:
    description: A repeat of the fault within this many hours updates its ticket (C(gpufleet_ticket_update_hours)).
    type: float
    default: 24
  state:
    description: The node's state the ticket reports (quarantined, rma).
    type: str
    default: quarantined
  code:
    description: The finding code of the fault.
    type: str
    required: true
  gpu:
    description: The GPU of the fault.
    type: str
  reason:
    description: Why the node was taken out of service.
    type: str
  evidence:
    description: The fault's evidence lines.
    type: list
    elements: str
    default: []
  bundle:
    description: The RMA evidence bundle on the controller.
    type: str
  actor:
    description: Who quarantined the node.
    type: str
  report_dir:
    description: The reports directory (default C(gpufleet_report_dir), else C(reports)); the history is below it.
    type: path
  history_dir:
    description: Directory of the history store (default C(gpufleet_history_dir)).
    type: path
seealso:
  - module: kentino.gpufleet.node_lifecycle
"""

EXAMPLES = r"""
- name: Open the fault's ticket
  kentino.gpufleet.fault_ticket:
    host: "{{ inventory_hostname }}"
    url: "{{ gpufleet_ticket_webhook_url }}"
    template: jira
    project: OPS
    headers:
      Authorization: "Bearer {{ vault_jira_token }}"
    code: XID_79
    gpu: "3"
  delegate_to: localhost
"""

RETURN = r"""
ticket_state:
  description:
    - V(created), V(updated), V(not_configured), or why no ticket was sent - V(bad_input), V(timeout), V(refused),
      V(unreachable), V(no_ticket_id); V(planned) in check mode.
  returned: always
  type: str
ticket:
  description: The ticket's id or key (the tracker's answer for a new one).
  returned: always
  type: str
action:
  description: V(create) or V(update).
  returned: when the settings are valid
  type: str
request:
  description: The rendered request (path, id_field, body), in check mode.
  returned: check mode
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    host=dict(type="str", required=True),
    url=dict(type="str", default=""),
    template=dict(type="str", default="generic"),
    headers=dict(type="dict", default={}, no_log=True),
    project=dict(type="str"),
    timeout=dict(type="int", default=10),
    window_hours=dict(type="float", default=24),
    state=dict(type="str", default="quarantined"),
    code=dict(type="str", required=True),
    gpu=dict(type="str"),
    reason=dict(type="str"),
    evidence=dict(type="list", elements="str", default=[]),
    bundle=dict(type="str"),
    actor=dict(type="str"),
    report_dir=dict(type="path"),
    history_dir=dict(type="path"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="kentino.gpufleet.fault_ticket runs as an action plugin on the controller; this module "
                         "file only documents it. Call it as a task (not with ansible -m on a node).")


if __name__ == "__main__":
    main()
