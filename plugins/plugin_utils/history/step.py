# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The fleet report's history step, in two halves around the report: before it is built, judge trends, drift and
baselines from the history (read only); after the report files are written, record the run. Neither half ever
raises: a history that cannot be read or written is said in the report and the task's result, and the report is
never lost for it.
"""

from __future__ import annotations

import os
import time

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.records import run_record
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, HistoryError, default_path
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import history as history_rules

DEFAULT_DAYS = 400


class HistoryStep:
    def __init__(self, history_dir, days=DEFAULT_DAYS, reset_baselines=False, enabled=True):
        self.enabled = bool(enabled)
        self.path = default_path(history_dir) if history_dir else None
        self.days = days
        self.reset_baselines = bool(reset_baselines)
        self.records = None
        self.info = {"enabled": self.enabled, "path": self.path, "error": None, "recorded": False,
                     "previous_runs": 0, "pruned_runs": 0}

    def judge(self, nodes, data, playbook, now=None):
        """Add the history's findings to the report's nodes; keep this run's records for record()."""
        if not self.enabled or not self.path:
            return
        history = None
        try:
            if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
                history = History(self.path, readonly=False)
                self.info["previous_runs"] = history.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
            self.records = history_rules.annotate(nodes, data, history, now or time.time(), playbook,
                                                  reset_baselines=self.reset_baselines)
        except HistoryError as exc:
            self.info["error"] = str(exc)
        except Exception as exc:  # a bug in the history's rules must not lose the report
            self.info["error"] = "history rules failed (%s: %s): report this as a kentino.gpufleet bug" % (
                type(exc).__name__, exc)
        finally:
            if history is not None:
                history.close()

    def record(self, doc):
        """Write this run into the history (one transaction), then drop runs older than the retention."""
        if not self.enabled or not self.path or self.records is None:
            return self.info
        try:
            with History(self.path) as history:
                history.record(run_record(doc), self.records)
                self.info["recorded"] = True
                self.info["pruned_runs"] = history.prune(self.days)
        except HistoryError as exc:
            self.info["error"] = str(exc)
        except Exception as exc:  # sqlite3 errors (disk full, locked for too long): the report is already written
            self.info["error"] = "could not record the run in %s: %s: %s" % (self.path, type(exc).__name__, exc)
        return self.info
