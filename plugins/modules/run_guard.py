#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

# The work happens in the action plugin of the same name (plugins/action/run_guard.py) on the controller; this file
# carries the documentation and the argument_spec the action validates against.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: run_guard
short_description: Check a run before it touches any node, and give it a unique id and the reports lock
description:
  - Runs on the controller as the first task of the collection's playbooks, before any node is touched.
  - Refuses the run (the task fails, nothing else runs) when a target host has a C(gpufleet_*) variable the
    collection does not know (a typo, with the closest known names), a role variable of the wrong type or choice
    (roles/gpufleet/meta/argument_specs.yml), or a threshold of the wrong kind (docs/rules.md); when the reports
    directory cannot be written; or when another run holds the reports directory's lock (its process still runs).
  - Returns a run id unique even for runs started in the same second, the start time, and takes the lock
    (O(report_dir)/.gpufleet-run.lock, released by M(kentino.gpufleet.fleet_report)).
version_added: "0.2.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - kentino.gpufleet.action_plugin
options:
  hosts:
    description: The hosts the run will target (their variables are checked).
    type: list
    elements: str
    required: true
  report_dir:
    description: Where the run's report will be written.
    type: path
    default: reports
  playbook:
    description: The playbook's name, recorded in the lock.
    type: str
  extra_known:
    description: More C(gpufleet_*) variable names to accept (a site's own).
    type: list
    elements: str
    default: []"""

EXAMPLES = r"""
- name: Check the run
  kentino.gpufleet.run_guard:
    hosts: "{{ query('inventory_hostnames', 'gpufleet_nodes') }}"
    playbook: burn_in
  register: gpufleet_run
"""

RETURN = r"""
run_id:
  description: The run's id (UTC time plus a random suffix).
  returned: always
  type: str
  sample: 20261130T101500Z-3fa2c1
started:
  description: When the run started (ISO 8601, UTC).
  returned: always
  type: str
lock:
  description: The lock file this run holds (null in check mode).
  returned: always
  type: str
report_dir:
  description: Where the run's report goes (O(report_dir), user-expanded).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    hosts=dict(type="list", elements="str", required=True),
    report_dir=dict(type="path", default="reports"),
    playbook=dict(type="str"),
    extra_known=dict(type="list", elements="str", default=[]),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="kentino.gpufleet.run_guard runs as an action plugin on the controller; this module file only "
                         "documents it.")


if __name__ == "__main__":
    main()
