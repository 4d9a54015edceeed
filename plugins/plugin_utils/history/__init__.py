# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The fleet's history: the SQLite store (store.py), the report's step around it (step.py), the rows a run records
(records.py) and the handover sheet (handover.py)."""

from __future__ import annotations

import os


def failure_observations(history_dir, days):
    """The checkpoint plan's side of the history (plugin_utils/cadence.py): the fleet's failures
    and GPU-hours over the last `days`, or None when there is no history yet. Read-only."""
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, default_path

    path = default_path(history_dir)
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    with History(path, readonly=True) as history:
        return history.failure_observations(days)
