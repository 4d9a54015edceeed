#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: run_cleanup
short_description: Stop the node-side work that earlier (interrupted) gpufleet runs left behind
description:
  - Every tool a run starts through the collection (gpu_burn, dcgmi diag, all_reduce_perf) is recorded under
    O(state_dir)C(/runs/<run id>/), and so is every async job of the run (the check module's process group and
    Ansible's C(async_wrapper) that watches it). This module stops the process groups recorded by runs other than
    O(run_id) and removes their directories, so that a run interrupted by Ctrl-C or a dead controller never makes the
    next run refuse the node as busy with its own leftovers. Tools are stopped first, then the modules, then the
    wrappers of the modules it stopped (given a few seconds to end by themselves and remove their temporary files).
  - Only process groups recorded by the collection are touched, never other processes on the GPUs.
  - With O(finished_run_id) it stops what is left of that one run and removes its directory, at the end of an audit
    (nothing of it runs any more) and when a run is interrupted (the C(kentino.gpufleet.run_record) callback runs
    C(playbooks/abort.yml) for that run before it writes the interrupted report).
  - The burn-in and preflight do the same as their first step, in the identity snapshot's round trip
    (M(kentino.gpufleet.health_snapshot)'s O(kentino.gpufleet.health_snapshot#module:stop_leftovers)), which also
    removes what a finished run left; C(playbooks/abort.yml) (C(gpufleet abort)) runs it with no O(run_id) to stop
    everything.
version_added: "0.2.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.node_module
options:
  state_dir:
    description: The node's gpufleet state directory.
    type: path
    required: true
  run_id:
    description: The current run, whose work is kept; omit to stop every recorded run.
    type: str
  finished_run_id:
    description: A run that has finished or was interrupted on this node; what is left of it is stopped and its
      directory removed.
    type: str
attributes:
  check_mode:
    support: full
    details: In check mode nothing is stopped; the result lists what would be."""

EXAMPLES = r"""
- name: Stop what an interrupted run left behind
  kentino.gpufleet.run_cleanup:
    state_dir: /var/lib/gpufleet
"""

RETURN = r"""
stopped:
  description:
    - The recorded process groups of other runs (or of O(finished_run_id)), with their kind (C(tool), C(module),
      C(async_wrapper)) and whether they were still running and were stopped (C(killed)).
  returned: always
  type: list
  elements: dict
  sample: [{run_id: "20261130T101500Z-3fa2c1", pgid: 41230, argv: ["/opt/gpufleet/bin/gpu_burn", "600"], kind: tool,
            killed: true}]
msg:
  description: What was stopped, in one line (each group's kind, command and number), or that nothing was running.
  returned: always
  type: str
  sample: "3 process group(s) stopped: tool gpu_burn [41230], module gpu_burn [41200], async wrapper gpu_burn [41190]"
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils.lease import (
    RUN_ID_RE,
    describe_stopped,
    run_dir,
    stop_leftovers,
    stop_other_runs,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", required=True),
            run_id=dict(type="str"),
            finished_run_id=dict(type="str"),
        ),
        mutually_exclusive=[("run_id", "finished_run_id")],
        supports_check_mode=True,
    )
    p = module.params
    for key in ("run_id", "finished_run_id"):
        if p[key] is not None and not RUN_ID_RE.match(p[key]):
            module.fail_json(msg="%s %r is not a run id (letters, digits, . _ -)" % (key, p[key]))
    if p["finished_run_id"]:
        existed = os.path.isdir(run_dir(p["state_dir"], p["finished_run_id"]))
        stopped = stop_leftovers(p["state_dir"], keep=lambda rid: rid != p["finished_run_id"],
                                 dry_run=module.check_mode)
        module.exit_json(changed=existed, stopped=stopped, msg=describe_stopped(stopped))
    if module.check_mode:  # what would be stopped, in the same shape as a real run's answer
        stopped = stop_other_runs(p["state_dir"], p["run_id"], dry_run=True)
        module.exit_json(changed=False, stopped=stopped, msg="check mode, would stop: " + describe_stopped(stopped))
    stopped = stop_other_runs(p["state_dir"], p["run_id"])
    module.exit_json(changed=bool(stopped), stopped=stopped, msg=describe_stopped(stopped))


if __name__ == "__main__":
    main()
