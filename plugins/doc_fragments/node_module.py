# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The attributes of the modules that run on a GPU node (checks and facts): no diff, any POSIX node, check mode
supported (a module whose check mode skips its tool says so with its own check_mode support and details over these).
FACTS: the modules that set gpufleet_* facts; READ_ONLY: the modules that only read."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    # The attributes' descriptions are here (not in ansible.builtin.action_common_attributes) so that a module's
    # documentation header is one fragment line per kind.
    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Can run in check mode and say what it would do; what a module skips there is in its details.
    support: full
  diff_mode:
    description: Would show what changed in diff mode.
    support: none
  platform:
    description: The target operating systems.
    support: full
    platforms: posix
"""

    FACTS = r"""
attributes:
  facts:
    description: Returns C(ansible_facts) that update the host's facts.
    support: full
"""

    # A module that only reads: check mode is a normal run.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    details: Read-only; check mode runs the same reads.
"""

    # A check that runs one tool, which check mode does not run (a module adds what else it skips or still does).
    TOOL_CHECK = r"""
attributes:
  check_mode:
    description: Can run in check mode and say what it would do; what a module skips there is in its details.
    support: partial
    details: In check mode the tool is not run; the result is RV(verdict=skipped) with the planned command line.
  diff_mode:
    description: Would show what changed in diff mode.
    support: none
  platform:
    description: The target operating systems.
    support: full
    platforms: posix
"""
