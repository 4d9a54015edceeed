#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: job_status
short_description: Wait a while on the node for an async job, and keep the run's lease alive
description:
  - The node half of M(kentino.gpufleet.job_wait); use that action, not this module, in playbooks.
  - Waits up to O(wait) seconds for the async job O(jid) to finish (one round trip instead of one per poll), refreshing
    the run's lease file every second so that the job knows the controller is still waiting.
  - Stops waiting, and refreshing the lease, as soon as the process that started it is gone (the controller died or
    its SSH session dropped), since nobody waits for the answer any more and the lease must lapse.
  - Returns the job's own result once it has finished, and removes the job's status file (O(cleanup)).
version_added: "0.2.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.node_module
options:
  jid:
    description: The async job id (C(ansible_job_id) of the task started with C(poll 0)).
    type: str
    required: true
  _async_dir:
    description: Where async jobs keep their status files (passed by the action).
    type: path
    required: true
  wait:
    description: Seconds to wait on the node before answering that the job still runs.
    type: int
    default: 30
  cleanup:
    description: Remove the job's status file once its result has been read.
    type: bool
    default: true
  state_dir:
    description: The node's gpufleet state directory (where the run's lease lives).
    type: path
  run_id:
    description: The run whose lease to refresh.
    type: str"""

EXAMPLES = r"""
# Playbooks use the kentino.gpufleet.job_wait action, which calls this module on every poll:
- name: Wait for the burn
  kentino.gpufleet.job_wait:
    job: "{{ __burn }}"

# Called directly it waits once, here up to 30 s:
- name: Wait up to 30 s on the node for the burn
  kentino.gpufleet.job_status:
    jid: "{{ __burn.ansible_job_id }}"
    _async_dir: ~/.ansible_async
    wait: 30
  register: __burn_status
"""

RETURN = r"""
finished:
  description: Whether the job has finished.
  returned: always
  type: bool
job:
  description: The job's own result, once finished.
  returned: when finished
  type: dict
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils.lease import Lease, async_job_starting


def _ppid(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (IOError, OSError, IndexError, ValueError):
        return None


def _ancestry():
    """(parent, grandparent): the shell the connection runs the module in and what started that shell (sshd's session,
    or the controller's worker on a local connection). Either one changing means the controller is gone."""
    parent = os.getppid()
    return parent, _ppid(parent)


def read_job(path):
    """(finished, data). A status file not written yet (or half written) means still running."""
    try:
        with open(path) as fh:
            data = json.loads(fh.read())
    except (IOError, OSError, ValueError):
        return False, None
    if not isinstance(data, dict):
        return False, None
    if "started" in data and not data.get("finished"):
        return False, data
    return True, data


def main():
    module = AnsibleModule(
        argument_spec=dict(
            jid=dict(type="str", required=True),
            _async_dir=dict(type="path", required=True),
            wait=dict(type="int", default=30),
            cleanup=dict(type="bool", default=True),
            state_dir=dict(type="path"),
            run_id=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path = os.path.join(p["_async_dir"], p["jid"])
    lease = None
    if p["run_id"] and p["state_dir"]:
        try:
            lease = Lease(p["state_dir"], p["run_id"], 0)
        except ValueError as exc:
            module.fail_json(msg=str(exc))
    deadline = time.monotonic() + max(0, p["wait"])
    line = _ancestry()
    while True:
        if _ancestry() != line or 1 in line:  # orphaned: the controller (or its connection) is gone
            module.exit_json(changed=False, finished=False, msg="the controller stopped waiting")
        if lease is not None:
            try:
                lease.touch()
            except OSError as exc:
                module.fail_json(msg="cannot refresh the run's lease %s: %s" % (lease.path, exc))
        if not os.path.exists(path):
            # Not written yet while its wrapper runs; looked for again after the scan (the wrapper may just have ended).
            if not async_job_starting(p["jid"]) and not os.path.exists(path):
                module.fail_json(msg="async job %s not found in %s (the node rebooted, or its status file was removed)"
                                 % (p["jid"], p["_async_dir"]), finished=True)
            finished, data = False, None
        else:
            finished, data = read_job(path)
        if finished:
            if p["cleanup"]:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            module.exit_json(changed=False, finished=True, job=data)
        if time.monotonic() >= deadline:
            module.exit_json(changed=False, finished=False)
        time.sleep(1.0)


if __name__ == "__main__":
    main()
