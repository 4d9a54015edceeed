# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The options every module that runs one node tool shares: what to run and how long it may take.

The matching argument_spec comes from plugins/module_utils/check_options.py, so the documentation and the code cannot
drift apart (tests/sanity compares them).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  executable:
    description:
      - Path or name of the tool the module runs (the module's notes name the tool and where it is looked for by
        default).
      - A name without C(/) is looked up on E(PATH) of the user the module runs as (plus the directories the notes
        name); a path must be an executable file.
      - A tool that cannot be found is reported in the result with what to install, never as a healthy node and never
        as a task failure that stops the other checks.
    type: path
  timeout:
    description:
      - Seconds the tool may run. It runs in its own process group; when the time is up the whole group is killed and
        the result says so (never a pass).
      - When not set, the module's own default applies (the module's notes give it).
    type: int
"""
