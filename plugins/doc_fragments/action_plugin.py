# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What the controller-side actions (fleet_report, job_postmortem, job_wait, run_guard) share in their documentation:
their attributes. A module adds its own check_mode details over these."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
attributes:
  action:
    support: full
    details: An action plugin on the controller; the module file only documents it.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""
