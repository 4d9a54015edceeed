# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The fleet report's history step, in two halves around the report: before it is built, judge trends, drift and
baselines from the history (read only); after the report files are written, record the run. Neither half ever
raises: a history that cannot be read or written is said in the report and the task's result, and the report is
never lost for it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from statistics import median

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
        """Add the history's findings to the report's nodes; keep this run's records for record(). A damaged file
        is neither read nor written; a healthy one this process cannot write (read-only mount, permissions) is
        still read for the judges, and record() says why the run is not in it."""
        if not self.enabled or not self.path:
            return
        history = None
        try:
            if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
                try:
                    history = History(self.path, readonly=False)
                except HistoryError as exc:
                    if exc.kind != "access":
                        raise
                    self.info["error"] = not_recorded(exc)
                    history = History(self.path, readonly=True)
                self.info["previous_runs"] = history.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
            self.records = history_rules.annotate(nodes, data, history, now or time.time(), playbook,
                                                  reset_baselines=self.reset_baselines)
        except HistoryError as exc:
            self.info["error"] = not_recorded(exc)
        except Exception as exc:  # a bug in the history's rules must not lose the report
            self.info["error"] = "history rules failed (%s: %s): report this as a kentino.gpufleet bug" % (
                type(exc).__name__, exc)
        finally:
            if history is not None:
                history.close()

    def link_history(self, search, now=None):
        """{"a|b": {"median_gbps", "runs"}}: each link of a fabric search (a < b) with its figures in earlier runs,
        for judge_fabric's FABRIC_LINK_DEGRADED. {} without a history; one that cannot be read is said by judge()."""
        if not self.enabled or not self.path or not os.path.exists(self.path):
            return {}
        links = sorted(set(tuple(sorted(p["nodes"])) for p in search.get("pairs") or []
                           if isinstance(p, dict) and isinstance(p.get("nodes"), list) and len(p["nodes"]) == 2))
        out = {}
        try:
            with History(self.path, readonly=False) as history:
                for a, b in links:
                    figures = history.link_figures(a, b, before_ts=now or time.time())
                    if figures:
                        out["%s|%s" % (a, b)] = {"median_gbps": median(figures), "runs": len(figures)}
        except (HistoryError, sqlite3.Error):
            return {}  # the judge step says what is wrong with the history; the report never waits on it
        return out

    def record(self, doc):
        """Write this run into the history (one transaction), then drop runs older than the retention. Never into a
        file the judge step found damaged."""
        if not self.enabled or not self.path or self.records is None:
            return self.info
        try:
            with History(self.path) as history:
                history.record(run_record(doc), self.records)
                self.info["recorded"] = True
                self.info["error"] = None
                try:
                    self.info["pruned_runs"] = history.prune(self.days)
                except HistoryError as exc:  # the run is in: only the retention waits for the next run
                    self.info["error"] = "the run is recorded, but old runs could not be removed: %s" % exc
        except HistoryError as exc:
            self.info["error"] = not_recorded(exc)
        except Exception as exc:  # noqa: BLE001 the report is already written: say what failed, never lose it
            self.info["error"] = "this run is NOT recorded in %s: %s: %s" % (self.path, type(exc).__name__, exc)
        return self.info

    @property
    def failed(self):
        """Whether the history failed this run (it is not recorded, or old runs could not be removed): the report,
        the console, the CLI's exit code and the playbook's end all say so."""
        return bool(self.enabled and self.path and self.info["error"])


def not_recorded(exc):
    """The report's history.error for a HistoryError: what is wrong and that this run is not in the history."""
    text = str(exc)
    return text if "not recorded" in text else "this run is NOT recorded: " + text
