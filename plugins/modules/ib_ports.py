#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ib_ports
short_description: Read a node's InfiniBand ports from sysfs and judge them, with the error counters' rise under load
description:
  - Reads every port of every HCA under O(root) (C(/sys/class/infiniband/<hca>/ports/<n>/)) - C(state),
    C(phys_state), C(rate) (rate and width) and the error counters in C(counters/) (C(symbol_error),
    C(link_error_recovery), C(link_downed), C(port_rcv_errors), C(port_rcv_remote_physical_errors),
    C(port_xmit_discards), C(local_link_integrity_errors), C(excessive_buffer_overrun_errors)). One call reads them
    all.
  - Called once before a load and once after it with O(baseline) (the first call's RV(ports)), it judges the
    counters' rise during the load, port by port, joined by HCA name and port number.
  - A node without InfiniBand (no O(root), or no HCA in it) is RV(not_run) with the reason (the check is skipped,
    never a pass).
version_added: "0.1.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.node_module
  - kentino.gpufleet.thresholds
options:
  root:
    description: The kernel's InfiniBand class directory.
    type: path
    default: /sys/class/infiniband
  baseline:
    description:
      - The ports of an earlier read (its RV(ports)), whose counters this read is compared with. Without it the ports'
        state, rate and width are judged, not the counters.
    type: list
    elements: dict
"""

EXAMPLES = r"""
- name: InfiniBand ports before the load
  kentino.gpufleet.ib_ports:
  register: ib_before

- name: InfiniBand ports after the load
  kentino.gpufleet.ib_ports:
    baseline: "{{ ib_before.ports }}"
    thresholds: {gpufleet_ib_expected_rate_gbps: 400, gpufleet_ib_expected_width: 4}
  register: gpufleet_result_ib_ports
"""

RETURN = r"""
verdict:
  description: The node's own verdict (V(pass), V(warn), V(fail), V(error), V(skipped)) from judge_ib.
  returned: always
  type: str
reasons:
  description: One line per finding, naming the HCA and port.
  returned: always
  type: list
  elements: str
evidence:
  description: The sysfs lines and counter values behind the findings.
  returned: always
  type: list
  elements: str
not_run:
  description: Why nothing was read (no InfiniBand on this node), else null.
  returned: always
  type: str
root:
  description: The directory read.
  returned: always
  type: str
ports:
  description: Per port hca, port, state, state_name, phys_state, rate_gbps, width, speed, counters, lines.
  returned: always
  type: list
  elements: dict
baseline:
  description: The counters of O(baseline) by C(<hca>/<port>); null without one.
  returned: always
  type: dict
problems:
  description: Files that could not be read or parsed (kind, message, line).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import ib_check, judge_ib
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import (
    THRESHOLD_OPTIONS,
    exit_check,
    given_thresholds,
    node_name,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(root=dict(type="path", default=ib_check.ROOT),
                           baseline=dict(type="list", elements="dict"), **THRESHOLD_OPTIONS),
        supports_check_mode=True,
    )
    problem = ib_check.root_error(module.params["root"])
    if problem:
        module.fail_json(msg=problem)
    t = given_thresholds(module)
    try:
        obs = ib_check.read(module.params["root"], module.params["baseline"])
    except ValueError as exc:
        module.fail_json(msg="baseline: %s (pass the ports of an earlier ib_ports read)" % exc)
    exit_check(module, obs, judge_ib.judge(obs, t, node_name()))


if __name__ == "__main__":
    main()
