# Copyright: kentino.gpufleet contributors; Apache-2.0
"""bench/fleet_burnin.py's callback: each task's wall time, from its start to the next task's start (the time the
whole play spent on it, every host included), written as JSON to $TASK_WALLS_OUT at the end of the run."""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: task_walls
type: aggregate
short_description: each task's wall time, for bench/fleet_burnin.py
description: Writes [[play, task, occurrence, seconds], ...] as JSON to the file TASK_WALLS_OUT names.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_walls"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.play = ""
        self.current = None  # (play, task, occurrence, started)
        self.seen = {}
        self.rows = []

    def _close(self):
        if self.current is not None:
            play, task, occurrence, started = self.current
            self.rows.append([play, task, occurrence, round(time.monotonic() - started, 3)])
            self.current = None

    def v2_playbook_on_play_start(self, play):
        self._close()
        self.play = play.get_name()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close()
        key = (self.play, task.get_name())
        self.seen[key] = self.seen.get(key, 0) + 1  # a task name can recur (an included file used twice)
        self.current = (self.play, task.get_name(), self.seen[key], time.monotonic())

    def v2_playbook_on_stats(self, stats):
        self._close()
        out = os.environ.get("TASK_WALLS_OUT")
        if out:
            with open(out, "w") as fh:
                json.dump(self.rows, fh)
