#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

# The work happens in the action plugin of the same name (plugins/action/bmc_power_cycle.py) on the controller; this
# file carries the documentation and the argument_spec the action validates against, as collections do for actions.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: bmc_power_cycle
short_description: Power-cycle a node through its BMC (Redfish) and wait until its system is on again
description:
  - Runs on the controller (an action plugin). Sends C(ComputerSystem.Reset) C(ForceOff) to the node's system, waits
    until the BMC reports C(PowerState) C(Off), sends C(On) and waits until it reports C(On), with
    C(community.general.redfish_command) and C(community.general.redfish_info) (shipped in the C(ansible) package).
  - The BMC's values are checked whole before anything is sent (an https URL of a host and port only; user name,
    password and system Id without control characters).
  - Every failure is a named RV(bmc_state) with the Redfish module's message and what to do; the task fails and
    nothing is retried. The repair ladder's C(bmc_power_cycle) rung (docs/lifecycle.md) records it and keeps the node
    quarantined.
version_added: "0.3.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - kentino.gpufleet.action_plugin
attributes:
  check_mode:
    support: full
    details: The values are checked, nothing is sent; RV(planned) lists the steps.
  platform:
    details: Runs the Redfish modules on the host the task runs on (delegate it to the controller).
requirements:
  - community.general >= 10.6.0 (the C(ansible) package ships it)
options:
  url:
    description: The BMC, C(https://HOST[:PORT]) (C(gpufleet_bmc_url)). Empty means not configured.
    type: str
    default: ""
  username:
    description: The BMC account (C(gpufleet_bmc_username)); keep it, with the password, in a vault.
    type: str
  password:
    description: Its password (C(gpufleet_bmc_password)).
    type: str
  system_id:
    description: The Redfish Id of the node's system, needed when the BMC has several (C(gpufleet_bmc_system_id)).
    type: str
  validate_certs:
    description: Verify the BMC's TLS certificate (C(gpufleet_bmc_validate_certs)).
    type: bool
    default: true
  ca_path:
    description: A CA bundle that signs the BMC's certificate (C(gpufleet_bmc_ca_path)).
    type: path
  timeout:
    description: Seconds each Redfish request may take (C(gpufleet_bmc_timeout_s)).
    type: int
    default: 10
  power_off_wait:
    description: Seconds to wait for C(PowerState) C(Off) after the C(ForceOff) (C(gpufleet_bmc_power_off_wait_s)).
    type: int
    default: 120
  power_on_wait:
    description: Seconds to wait for C(PowerState) C(On) after the C(On) (C(gpufleet_bmc_power_on_wait_s)).
    type: int
    default: 300
  poll:
    description: Seconds between two reads of the power state.
    type: int
    default: 5
  node:
    description: The node's inventory name in messages (default the task's host).
    type: str
seealso:
  - module: community.general.redfish_command
  - module: kentino.gpufleet.node_lifecycle
"""

EXAMPLES = r"""
- name: Power-cycle the node through its BMC
  kentino.gpufleet.bmc_power_cycle:
    url: "{{ gpufleet_bmc_url }}"
    username: "{{ gpufleet_bmc_username }}"
    password: "{{ gpufleet_bmc_password }}"
  delegate_to: localhost
  register: power_cycle
"""

RETURN = r"""
bmc_state:
  description:
    - C(power_cycled), or why not - C(not_configured), C(bad_input), C(missing_collection), C(auth_failed) (HTTP 401
      or 403), C(timeout), C(unreachable), C(refused) (another HTTP error), C(unknown_system), C(no_power_off),
      C(no_power_on), C(error); C(planned) in check mode.
  returned: always
  type: str
power_state:
  description: The system's last C(PowerState) read.
  returned: always
  type: str
steps:
  description: What was sent and read, with the time (C(PowerForceOff ...), C(PowerState Off), ...).
  returned: always
  type: list
  elements: str
planned:
  description: The steps it takes.
  returned: when the values are valid
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    url=dict(type="str", default=""),
    username=dict(type="str"),
    password=dict(type="str", no_log=True),
    system_id=dict(type="str"),
    validate_certs=dict(type="bool", default=True),
    ca_path=dict(type="path"),
    timeout=dict(type="int", default=10),
    power_off_wait=dict(type="int", default=120),
    power_on_wait=dict(type="int", default=300),
    poll=dict(type="int", default=5),
    node=dict(type="str"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="kentino.gpufleet.bmc_power_cycle runs as an action plugin on the controller; this module "
                         "file only documents it. Call it as a task (not with ansible -m on a node).")


if __name__ == "__main__":
    main()
