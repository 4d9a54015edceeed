#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ib_write_bw
short_description: Run perftest's ib_write_bw on every InfiniBand rail of a pair, server or client side
description:
  - One side of a fabric pair's per-rail test (playbooks/tasks/fabric_round.yml runs the server on one node, then
    the client on the other). Rail I(i) is the I(i)-th HCA of O(hcas), the same list on both sides, on port
    O(base_port) + I(i); every rail runs at once.
  - O(role=server) starts C(ib_write_bw -d <hca> -p <port> --report_gbits) per rail and waits for each to end (a
    perftest server ends after one client run); one still running after O(timeout) is killed with its process group.
  - O(role=client) runs C(ib_write_bw -d <hca> -p <port> --report_gbits <server>) per rail. While the server is not
    listening yet (C(Couldn't connect to <server>:<port>)) it retries, once a second, for at most
    O(connect_timeout) seconds; a client still running after O(timeout) is killed. Each rail's figure is the average
    Gb/s at the largest message size (perftest's result table).
  - A missing C(ib_write_bw) is an error on every rail naming the node and the fix (install perftest), not a module
    failure. Every HCA name and the server name are checked whole before anything runs.
version_added: "0.2.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.check_common
  - kentino.gpufleet.node_module
attributes:
  check_mode:
    details: In check mode the options are checked and nothing runs (RV(rails) is empty).
notes:
  - O(executable) defaults to C(ib_write_bw) (Debian and Ubuntu package C(perftest)) on E(PATH) or in
    C(/opt/gpufleet/bin).
  - O(timeout) (each rail's C(ib_write_bw), server and client alike) defaults to 120 seconds.
options:
  role:
    description: Which side of the test this node runs.
    type: str
    choices: [server, client]
    required: true
  hcas:
    description:
      - The InfiniBand devices (C(mlx5_0)...), one a rail, in the same order on both sides (a letter, then letters,
        digits and C(_)).
    type: list
    elements: str
    required: true
  server:
    description: The server node's name or address as this node reaches it (O(role=client) only).
    type: str
  base_port:
    description: The first rail's TCP port (perftest's default, 18515); rail I(i) uses O(base_port) + I(i).
    type: int
    default: 18515
  connect_timeout:
    description: Seconds the client retries a server that is not listening yet.
    type: int
    default: 30
  node:
    description: How this node is named in the errors (the inventory name); default its host name.
    type: str
"""

EXAMPLES = r"""
- name: Rail servers on the second node
  kentino.gpufleet.ib_write_bw:
    role: server
    hcas: [mlx5_0, mlx5_1]
  delegate_to: node02
  async: 200
  poll: 0
  register: servers

- name: Rail clients on the first node
  kentino.gpufleet.ib_write_bw:
    role: client
    hcas: [mlx5_0, mlx5_1]
    server: node02
  delegate_to: node01
  register: clients
"""

RETURN = r"""
rails:
  description:
    - One entry a rail C({hca, gbps, error, evidence, argv}) (the client's figure in Gb/s or null; the error in the
      tool's own words; the evidence begins with the command line run on this node).
  returned: success
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import ib_rail_test
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import check_argument_spec, resolve_timeout
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import TOOL_DIRS, node_name
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool

DEFAULT_TIMEOUT_S = 120


def main():
    module = AnsibleModule(
        argument_spec=check_argument_spec(role=dict(type="str", choices=["server", "client"], required=True),
                                          hcas=dict(type="list", elements="str", required=True),
                                          server=dict(type="str"),
                                          base_port=dict(type="int", default=ib_rail_test.DEFAULT_PORT),
                                          connect_timeout=dict(type="int", default=30), node=dict(type="str")),
        required_if=[("role", "client", ("server",))],
        supports_check_mode=True,
    )
    p = module.params
    resolve_timeout(module, DEFAULT_TIMEOUT_S)
    errors = ib_rail_test.option_errors(p["hcas"], p["server"], p["base_port"], p["timeout"], p["connect_timeout"])
    if errors:
        module.fail_json(msg="; ".join(errors))
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, rails=[], msg="check mode: ib_write_bw not run")
    exe = find_tool(module, "ib_write_bw", p["executable"], TOOL_DIRS)
    node = p["node"] or node_name()
    if p["role"] == "server":
        rails = ib_rail_test.run_server(exe, p["hcas"], p["base_port"], p["timeout"], node)
    else:
        rails = ib_rail_test.run_client(exe, p["hcas"], p["server"], p["base_port"], p["timeout"],
                                        p["connect_timeout"], node)
    module.exit_json(changed=False, rails=rails)


if __name__ == "__main__":
    main()
