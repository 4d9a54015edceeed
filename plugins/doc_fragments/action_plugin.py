# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What the controller-side actions (fleet_report, job_postmortem, job_wait, run_guard) share in their documentation:
their attributes, and (RETURN) the return values of the two that write a report's files. A module adds its own
check_mode details over these."""

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

    # The files of a report run (fleet_report: report.*, job_postmortem: postmortem.*).
    REPORT_FILES = r"""
run_id:
  description: This run's id (the name of its directory).
  returned: always
  type: str
run_dir:
  description: Directory the files were written to (not in check mode).
  returned: when written
  type: str
json_path:
  description: Path of the JSON document (C(report.json), C(postmortem.json)), the source of truth the other files are
    rendered from.
  returned: when written
  type: str
md_path:
  description: Path of the Markdown rendering (C(report.md), C(postmortem.md)).
  returned: when written
  type: str
html_path:
  description: Path of the HTML rendering (C(report.html), C(postmortem.html)).
  returned: when written
  type: str
"""
