"""The live view of a run: one line per node (stage, time in it, the node's own verdict so far), the fleet's counts and
a progress bar while a node burns, drawn with rich from ansible-runner's events instead of scrolling task output.

The view only reads events; what the report finally says comes from report.json (the fleet report judges again with
the inventory's thresholds). "So far" is the node-side verdict of each check as its result arrives.
"""

import time
from collections import deque
from pathlib import Path

from rich.console import Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gpufleet_cli.commands import verdict_rank

VERDICT_RANK = verdict_rank()
STYLE = {"pass": "green", "warn": "yellow", "error": "magenta", "fail": "bold red", "unreachable": "bold magenta",
         "running": "cyan", "waiting": "dim"}
BURN_STAGES = ("burn",)
# The burn's progress bar: 20 cells when there is room, none below 6 (the time burnt is shown either way).
MAX_BAR, MIN_BAR = 20, 6


def _clock(seconds):
    seconds = int(max(0, seconds))
    return "%d:%02d" % (seconds // 60, seconds % 60) if seconds < 3600 else "%d:%02d:%02d" % (
        seconds // 3600, seconds % 3600 // 60, seconds % 60)


class HostState:
    def __init__(self, name, now):
        self.name = name
        self.stage = "start"
        self.stage_since = now
        self.verdict = None  # worst node-side verdict so far
        self.state = "waiting"  # waiting, running, done, failed, unreachable
        self.last_task = ""

    def enter(self, stage, now):
        if stage and str(stage) != self.stage:
            self.stage, self.stage_since = str(stage), now
            if self.state == "waiting":
                self.state = "running"

    def worse(self, verdict):
        if verdict in VERDICT_RANK and (self.verdict is None or VERDICT_RANK[verdict] > VERDICT_RANK[self.verdict]):
            self.verdict = verdict


class RunProblems:
    """Why a run left no report, from its events: the failed tasks' messages (run_guard's refusals are assert
    messages), else the last lines Ansible printed (an error before any task, such as a module it cannot resolve)."""

    MAX_MESSAGE = 1500

    def __init__(self, tail_lines=15):
        self.failures = []
        self.tail = deque(maxlen=tail_lines)

    def handle(self, event):
        text = event.get("stdout")
        if text:
            self.tail.extend(line for line in text.replace("\r", "").splitlines() if line.strip())
        data = event.get("event_data") or {}
        kind = event.get("event")
        if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            res = data.get("res") if isinstance(data.get("res"), dict) else {}
            message = str(res.get("msg") or "").strip() or "(no message)"
            if len(message) > self.MAX_MESSAGE:
                message = message[:self.MAX_MESSAGE] + " ..."
            self.failures.append("%s: %s: %s" % (data.get("host") or "?", data.get("task") or "?", message))

    def lines(self):
        return self.failures or list(self.tail)


def explain_no_report(stream, playbook, result, problems, runner_dir):
    """Say on `stream` that the run wrote no report, why (problems.lines()), and where its whole output is kept."""
    ident_dir = getattr(getattr(result, "config", None), "artifact_dir", None)
    stream.write("gpufleet: %s wrote no report (%s, rc %s):\n" % (playbook, result.status, result.rc))
    for line in problems.lines():
        stream.write("  %s\n" % line)
    stream.write("Ansible's whole output: %s\n" % (Path(ident_dir) / "stdout" if ident_dir else runner_dir))


class RunView:
    """Consumes ansible-runner events (event_handler) and renders the live view (__rich_console__)."""

    def __init__(self, playbook, burn_planned_s=None, clock=time.monotonic):
        self.playbook = playbook
        self.clock = clock
        self.started = clock()
        self.hosts = {}
        self.run_id = None
        self.finished = False
        self.burn_planned_s = burn_planned_s
        self.report_line = None
        self.events = 0
        self.problems = RunProblems()

    def host(self, name):
        if name not in self.hosts:
            self.hosts[name] = HostState(name, self.clock())
        return self.hosts[name]

    # ---- events ----------------------------------------------------------------------------------------------
    def handle(self, event):
        """ansible-runner event_handler: update the state; True keeps the event in the artifacts."""
        self.events += 1
        self.problems.handle(event)
        kind = event.get("event")
        data = event.get("event_data") or {}
        name = data.get("host")
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        if kind == "playbook_on_stats":
            self.finished = True
            for state in self.hosts.values():
                if state.state in ("running", "waiting"):
                    state.state = "done"
            return True
        if not name or name == "localhost":
            if res.get("run_id") and not self.run_id:
                self.run_id = res["run_id"]
            if res.get("summary_md"):
                self.report_line = res.get("msg")
            return True
        state = self.host(name)
        if kind == "runner_on_start":
            if state.state == "waiting":
                state.state = "running"
            state.last_task = data.get("task") or ""
        elif kind == "runner_on_ok":
            facts = res.get("ansible_facts") if isinstance(res.get("ansible_facts"), dict) else {}
            # A stage's first task reports the stage of every node at once ({node: stage}, from the first node).
            stages = facts.get("gpufleet_stages") if isinstance(facts.get("gpufleet_stages"), dict) else {}
            for other, stage in stages.items():
                if other != "localhost":
                    self.host(other).enter(stage, self.clock())
            state.enter(facts.get("gpufleet_stage"), self.clock())
            if facts.get("gpufleet_completed") is True:
                state.state = "done"
            if isinstance(res.get("verdict"), str):
                state.worse(res["verdict"])
            for part in ("gpu_sample", "storage", "env"):  # the snapshot's parts carry their own verdicts
                if isinstance(res.get(part), dict) and isinstance(res[part].get("verdict"), str):
                    state.worse(res[part]["verdict"])
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            state.worse("error")
        elif kind == "runner_on_unreachable":
            state.state = "unreachable"
            state.worse("unreachable")
        return True

    # ---- rendering -------------------------------------------------------------------------------------------
    def counts(self):
        states, verdicts = {}, {}
        for state in self.hosts.values():
            states[state.state] = states.get(state.state, 0) + 1
            if state.verdict:
                verdicts[state.verdict] = verdicts.get(state.verdict, 0) + 1
        return states, verdicts

    def _progress(self, state, now, bar_width):
        if state.stage not in BURN_STAGES or state.state != "running":
            return Text("")
        planned = self.burn_planned_s or 600
        done = min(now - state.stage_since, planned)
        clock = Text("%s / %s" % (_clock(done), _clock(planned)), style="dim")
        if bar_width < MIN_BAR:
            return clock
        cell = Table.grid(padding=(0, 1))
        cell.add_row(ProgressBar(total=planned, completed=done, width=bar_width), clock)
        return cell

    def __rich_console__(self, console, options):
        """The table at the console's width: node names are never cut; the burn's bar shrinks first, then the
        other columns are cut (with an ellipsis)."""
        now = self.clock()
        title = "gpufleet %s%s · %d node(s) · %s" % (self.playbook, " · run %s" % self.run_id if self.run_id else "",
                                                    len(self.hosts), _clock(now - self.started))
        if self.burn_planned_s is None and any(s.stage in BURN_STAGES for s in self.hosts.values()):
            title += " · burn 10:00 (default)"
        names = sorted(self.hosts)
        rows = []
        for name in names:
            state = self.hosts[name]
            verdict = state.verdict or "-"
            rows.append((name, Text(state.state, style=STYLE.get(state.state, "")), state.stage,
                         _clock(now - state.stage_since), Text(verdict.upper(), style=STYLE.get(verdict, ""))))
        headers = ("node", "state", "stage", "in stage", "so far")
        widths = [max([len(headers[i])] + [len(str(row[i])) for row in rows]) for i in range(len(headers))]
        # Columns are separated by " │ " (3 cells); the burn cell is the bar, a space and "m:ss / m:ss".
        clock_width = len("%s / %s" % (_clock(self.burn_planned_s or 600), _clock(self.burn_planned_s or 600)))
        bar_width = min(MAX_BAR, options.max_width - sum(widths) - 3 * len(widths) - clock_width - 1)
        table = Table(title=title, title_justify="left", expand=False, show_edge=False, pad_edge=False)
        table.add_column("node", no_wrap=True, width=widths[0])
        for header in headers[1:]:
            table.add_column(header, no_wrap=True, overflow="ellipsis")
        table.add_column("burn", no_wrap=True, overflow="ellipsis")
        for row in rows:
            table.add_row(*row, self._progress(self.hosts[row[0]], now, bar_width))
        states, verdicts = self.counts()
        line = Text("fleet: ")
        line.append(" · ".join("%d %s" % (n, s) for s, n in sorted(states.items())) or "starting")
        if verdicts:
            line.append("  |  so far: ")
            line.append(" · ".join("%d %s" % (verdicts[v], v) for v in sorted(verdicts, key=VERDICT_RANK.get)))
        yield Group(table, line)


def run_live(run_fn, view, console, refresh_per_second=4):
    """Run run_fn(event_handler) under a live display of `view` (plain, once at the end, when not a terminal)."""
    with Live(view, console=console, refresh_per_second=refresh_per_second, transient=False,
              auto_refresh=console.is_terminal) as live:
        result = run_fn(view.handle)
        live.update(view, refresh=True)
    console.line()
    return result
