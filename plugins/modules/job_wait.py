#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

# The work happens in the action plugin of the same name (plugins/action/job_wait.py) on the controller; this file
# carries the documentation and the argument_spec the action validates against.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: job_wait
short_description: Wait for a long node-side check (started with async) and keep its lease alive
description:
  - The one wait pattern of the collection's long checks (gpu_burn, the nvidia-smi sampler, dcgmi diag, NCCL). Start
    the check with C(async) and C(poll 0), then wait with this action.
  - Each poll is one round trip that waits on the node for up to O(poll) seconds (M(kentino.gpufleet.job_status)), so a
    600 s burn costs about 20 round trips instead of one every few seconds, and no C(FAILED - RETRYING) line is
    printed. Progress shows as one line per node every O(progress_every) seconds. Every node prints at the same
    multiples of O(progress_every) with its name padded to the longest of the play, so each round reads as one
    aligned block (elapsed of planned time and percent, or how far past the plan).
  - A node that dies during the wait is C(UNREACHABLE) at once (the SSH keepalive notices within about 45 s), never
    after the async timeout.
  - Every poll refreshes the run's lease on the node. When the controller stops polling (Ctrl-C, a dead controller),
    the check notices the stale lease and stops its tool by itself (module_utils/lease.py).
  - Returns the job's own result, as C(async_status) would once finished, and removes its status file.
version_added: "0.2.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - kentino.gpufleet.action_plugin
options:
  job:
    description:
      - The registered result of the task that started the job with C(async) and C(poll 0).
      - When it has no C(ansible_job_id) (the task ran synchronously, as in check mode, or was skipped) it is returned
        as it is, so one wait task serves every mode.
      - Exactly one of O(job) and O(start).
    type: dict
  start:
    description:
      - Start the job here instead of in a task of its own, as C(async) with C(poll 0) would (its async timeout is
        O(timeout)), and wait for it at once. One task per long check instead of two, and no gap between the start
        and the first poll in which the run's lease could go stale while the controller starts the job on the other
        nodes of a large fleet.
      - In check mode the module runs synchronously (it plans, runs nothing) and its result is returned.
      - Options whose value is C(omit) are left out, as in a task of their own.
    type: dict
    suboptions:
      module:
        description: The module to run, by its fully qualified name (e.g. C(kentino.gpufleet.gpu_burn)).
        type: str
        required: true
      args:
        description: Its options.
        type: dict
        default: {}
  label:
    description: What runs, for the progress line (e.g. C(gpu_burn)).
    type: str
    default: job
  planned:
    description: Seconds the job is planned to take, for the progress line; 0 shows elapsed time only.
    type: int
    default: 0
  timeout:
    description: Seconds after which the wait gives up (the job keeps its own, shorter, timeout).
    type: int
    default: 3600
  poll:
    description: Seconds each round trip waits on the node before answering "still running".
    type: int
    default: 30
  progress_every:
    description: Seconds between two progress lines for one node; 0 prints none.
    type: int
    default: 60
  state_dir:
    description: The node's gpufleet state directory (where the run's lease lives).
    type: path
  run_id:
    description: The run whose lease to refresh.
    type: str
  skip:
    description:
      - A reason not to start the job (a check switched off, GPUs refused as busy); empty or omitted starts it. The
        task is then skipped, as a C(when) would skip it, with this reason as C(skip_reason) (what the fleet report
        shows), and nothing runs on the node. One task per check, whether it runs or not.
    type: str
    version_added: "0.3.0"
notes:
  - Runs as an action plugin on the controller and calls M(kentino.gpufleet.job_status) on the node.
"""

EXAMPLES = r"""
- name: Start gpu_burn
  kentino.gpufleet.gpu_burn:
    duration: 600
  async: 1500
  poll: 0
  register: __burn

- name: Wait for it
  kentino.gpufleet.job_wait:
    job: "{{ __burn }}"
    label: gpu_burn
    planned: 600
  register: gpufleet_result_gpu_burn

- name: Start dcgmi diag and wait for it, in one task
  kentino.gpufleet.job_wait:
    start:
      module: kentino.gpufleet.dcgm_diag
      args:
        level: 3
    label: dcgmi diag
    timeout: 14400
  register: gpufleet_result_dcgm_diag
"""

RETURN = r"""
finished:
  description: Always true when the action returns normally (the job's result follows, merged in).
  returned: always
  type: bool
waited_s:
  description: Seconds the controller waited.
  returned: always
  type: float
polls:
  description: Round trips made.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    job=dict(type="dict"),
    start=dict(type="dict", options=dict(module=dict(type="str", required=True),
                                         args=dict(type="dict", default={}))),
    label=dict(type="str", default="job"),
    planned=dict(type="int", default=0),
    timeout=dict(type="int", default=3600),
    poll=dict(type="int", default=30),
    progress_every=dict(type="int", default=60),
    state_dir=dict(type="path"),
    run_id=dict(type="str"),
    skip=dict(type="str"),
)

ONE_OF = dict(mutually_exclusive=[("job", "start")], required_one_of=[("job", "start")])


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True, **ONE_OF)
    module.fail_json(msg="kentino.gpufleet.job_wait runs as an action plugin on the controller; this module file only "
                         "documents it.")


if __name__ == "__main__":
    main()
