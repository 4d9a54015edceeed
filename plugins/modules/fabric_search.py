#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

# The work happens in the action plugin of the same name (plugins/action/fabric_search.py) on the controller; this
# file carries the documentation and the argument_spec the action validates against.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: fabric_search
short_description: Plan the rounds of a fabric search and record each round's pair tests
description:
  - Runs on the controller (an action plugin), one step per call; playbooks/fabric.yml calls it before round 1 and
    after every round.
  - Without O(search) it starts a search over O(hosts) - their leaf switches (C(gpufleet_fabric_leaf)), the names
    mpirun reaches them by (C(gpufleet_fabric_mpi_host), default the inventory name), their ranks
    (C(gpufleet_fabric_ranks_per_node), default 8), the pair tests' timeout (C(gpufleet_fabric_pair_timeout_s),
    default 300), the per-rail C(ib_write_bw) timeout (C(gpufleet_fabric_rail_timeout_s), default 120), its extra
    mpirun arguments, rank environment and message sizes (C(gpufleet_fabric_mpirun_args),
    C(gpufleet_fabric_env), C(gpufleet_fabric_min_bytes), C(gpufleet_fabric_max_bytes); each value checked whole,
    since they reach mpirun's command line and the shell that starts its daemon on the partner), and the settings
    that must be the same on every host of one search (the fabric thresholds
    in docs/rules.md, C(gpufleet_fabric_max_rounds), default 4, and C(gpufleet_fabric_seed), default 0) - and
    returns round 1's plan.
  - With O(search) it records the answers of the round just run (O(launched) and O(finished), the registered loop
    results of the launch and of its async_status) and returns the next round's plan; an empty RV(plan) ends the
    search. A pair whose test could not run (unreachable, a timeout, mpirun unable to reach the partner) is an error,
    never evidence against either node.
  - Once the pair rounds are done it plans the bisection's group rounds, at most C(gpufleet_fabric_max_rounds) more;
    every leaf's nodes as one group, then both halves of each slow group. Each group is an RV(plan) entry launched
    like a pair test from the group's first node (C(mpirun -H a:8,b:8,c:8,...), no rails); their answers are recorded
    in RV(search)'s C(groups), which the fleet report judges (C(FABRIC_GROUP_SLOW)).
  - Who is accused is judge_fabric's decision (the fleet report's fabric section); the plan follows the same rule.
version_added: "0.2.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - kentino.gpufleet.action_plugin
attributes:
  check_mode:
    support: full
    details: Planning runs nothing on the nodes.
  platform:
    details: Runs on the controller; it reads the nodes' variables from hostvars.
options:
  hosts:
    description: The nodes of the search (at least two).
    type: list
    elements: str
    required: true
  search:
    description: The search so far (RV(search) of the previous call); omit to start.
    type: dict
  launched:
    description: The launch task's registered loop results of the round just run.
    type: list
    elements: dict
    default: []
  finished:
    description: The async_status task's registered loop results of the round just run.
    type: list
    elements: dict
    default: []
  ib:
    description:
      - At the start, the registered loop results of M(kentino.gpufleet.ib_ports) over the nodes (item, the host),
        their HCAs. A pair whose nodes both have HCAs of the same names runs C(ib_write_bw) on each of those rails
        (RV(plan)'s C(rails)); a node without InfiniBand gets no rail test.
    type: list
    elements: dict
    default: []
  rail_servers:
    description:
      - The round's M(kentino.gpufleet.ib_write_bw) server results, the launch's loop results followed by its
        async_status's.
    type: list
    elements: dict
    default: []
  rail_clients:
    description: The same for the clients.
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Plan round 1
  kentino.gpufleet.fabric_search:
    hosts: "{{ groups['gpufleet_nodes'] }}"
  register: gpufleet_fabric
"""

RETURN = r"""
search:
  description:
    - The search so far (C(pairs), C(leaves), C(rounds), C(plan), C(thresholds), and after the pair rounds C(groups),
      C(group_rounds), C(group_plan)); the fleet report's input.
  returned: always
  type: dict
plan:
  description:
    - The next round's pair (or group) tests C({nodes, launch_from, mpi_hosts, np, timeout_s, launcher_args, env,
      min_bytes, max_bytes, rails}) (the launching node's settings, checked); empty when the search is done.
    - C(rails) is C({client, server, server_host, hcas, base_port, timeout_s, connect_timeout_s}) (the client on the
      pair's first node, the server on its second, rail I(i) on port C(base_port) + I(i)), or null when a node of
      the pair has no InfiniBand.
  returned: always
  type: list
  elements: dict
round:
  description: The number of the next round (pair rounds, then group rounds).
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    hosts=dict(type="list", elements="str", required=True),
    search=dict(type="dict"),
    launched=dict(type="list", elements="dict", default=[]),
    finished=dict(type="list", elements="dict", default=[]),
    ib=dict(type="list", elements="dict", default=[]),
    rail_servers=dict(type="list", elements="dict", default=[]),
    rail_clients=dict(type="list", elements="dict", default=[]),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="kentino.gpufleet.fabric_search runs as an action plugin on the controller; this module file "
                         "only documents it. Call it as a task (not with ansible -m on a node).")


if __name__ == "__main__":
    main()
