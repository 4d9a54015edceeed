# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The option that gives a check module the inventory's thresholds, so its own verdict is the fleet report's. The
matching argument_spec is check_result.THRESHOLD_OPTIONS."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  thresholds:
    description:
      - The inventory's thresholds this check's judge reads, by their inventory names (docs/rules.md), so that the
        module's own verdict is the one the fleet report gives for the same result. The collection's stages pass
        all of them with the P(kentino.gpufleet.check_thresholds#filter) filter; a name not given takes its default.
      - A name given here wins over the module's option of the same threshold. A name that is not a threshold, or a
        value of the wrong type, fails the task.
    type: dict
    default: {}
"""
