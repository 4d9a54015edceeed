# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The options of the long checks that stop by themselves when the controller stops waiting for them (the run's
lease, plugins/module_utils/lease.py). The matching argument_spec is check_result.LEASE_OPTIONS."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  state_dir:
    description:
      - The node's gpufleet state directory, where the run's lease and the process groups it started are recorded
        (C(runs/<run id>/)). Needed with O(run_id).
    type: path
  run_id:
    description:
      - The run this check belongs to. With it, the tool's process group is recorded (so M(kentino.gpufleet.run_cleanup)
        can stop what an interrupted run left) and the check stops its tool by itself when the run's lease is not
        refreshed for O(lease_timeout) seconds (M(kentino.gpufleet.job_wait) refreshes it on every poll).
      - Without it the module runs on its own, as it always did.
    type: str
  lease_timeout:
    description: Seconds without a refreshed lease after which the tool is stopped and the result says why.
    type: int
    default: 180
"""
