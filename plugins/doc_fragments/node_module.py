# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The attributes of the modules that run on a GPU node (checks and facts): no diff, any POSIX node, check mode
supported (a module whose check mode skips its tool says so with its own check_mode support and details over these).
FACTS: the modules that set gpufleet_* facts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

    FACTS = r"""
attributes:
  facts:
    support: full
"""
