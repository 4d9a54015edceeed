# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Tests kentino.gpufleet.clean_path, kentino.gpufleet.system_directory and kentino.gpufleet.plain_text: the roles'
preflight checks of values that reach a unit, a script or a path (plugins/plugin_utils/unit_values.py)."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.unit_values import (
    clean_path,
    plain_text,
    system_directory,
)


class TestModule:
    def tests(self):
        return {"clean_path": clean_path, "system_directory": system_directory, "plain_text": plain_text}
