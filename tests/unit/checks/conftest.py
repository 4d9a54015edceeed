"""Stand-in tools for the check-module tests: tiny shell scripts in tmp_path that replay a fixture file.

A stand-in records how it was called (argv one element a line, environment, working directory) so tests can assert
what reached the tool, then prints the fixture byte for byte (\\r frames included) and exits with the given code.
"""

import os
import stat
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def read_fixture(area, name):
    # newline="" keeps the \r of rewritten progress frames exactly as the tool wrote them.
    with open(FIXTURES / area / name, encoding="utf-8", errors="replace", newline="") as fh:
        return fh.read()


def _write_script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


class StandIn:
    def __init__(self, directory, name):
        self.dir = directory
        self.path = directory / name
        self.record = directory / ("record-" + name)

    @property
    def ran(self):
        return (self.record / "argv").exists()

    @property
    def argv(self):
        return (self.record / "argv").read_text().splitlines()

    @property
    def env(self):
        out = {}
        for line in (self.record / "env").read_text().splitlines():
            key, _, value = line.partition("=")
            out[key] = value
        return out

    @property
    def cwd(self):
        return (self.record / "cwd").read_text().strip()


@pytest.fixture
def standin(tmp_path):
    """standin(name, area, fixture, rc=0, stderr_fixture=None) -> StandIn installed as tmp_path/bin/<name>."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)

    def make(name, area=None, fixture=None, rc=0, stderr_text=None):
        tool = StandIn(bindir, name)
        tool.record.mkdir(exist_ok=True)
        body = 'printf "%%s\\n" "$@" > "%s/argv"\nenv > "%s/env"\npwd > "%s/cwd"\n' % ((tool.record,) * 3)
        if fixture:
            body += 'cat "%s"\n' % (FIXTURES / area / fixture)
        if stderr_text:
            stderr_file = tool.record / "stderr.txt"
            stderr_file.write_text(stderr_text)
            body += 'cat "%s" >&2\n' % stderr_file
        body += "exit %d\n" % rc
        _write_script(tool.path, body)
        return tool

    return make


@pytest.fixture
def hanging_tool(tmp_path):
    """A tool that prints a line, forks a child, and never ends."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)

    def make(name, first_line="starting", child_ignores_sigterm=False):
        # A child that ignores SIGTERM (as gpu_burn's workers do) proves the SIGKILL escalation; it costs the
        # runner's 5 s grace period, so only one test uses it.
        trap = 'trap "" TERM; ' if child_ignores_sigterm else ""
        path = bindir / name
        _write_script(path, (
            'echo $$ > "%(d)s/leader.pid"\n'
            'sh -c \'%(trap)secho $$ > "%(d)s/child.pid"; while :; do sleep 1; done\' &\n'
            'echo "%(line)s"\n'
            'while :; do sleep 1; done\n'
        ) % {"d": tmp_path, "line": first_line, "trap": trap})
        return path

    return make


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie is dead, only not yet reaped (no init reaps here)


def processes_mentioning(text):
    """PIDs of live processes whose command line contains text (e.g. the tmp_path of a stand-in)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if text in cmdline and _alive(int(entry)):
            found.append(int(entry))
    return found


@pytest.fixture
def no_leftovers(tmp_path):
    """Call after a timed-out run: asserts neither the stand-in nor its forked child is still alive."""

    def check():
        pids = []
        for name in ("leader.pid", "child.pid"):
            pid_file = tmp_path / name
            assert pid_file.exists(), "the hanging stand-in never started (%s missing)" % name
            pids.append(int(pid_file.read_text().strip()))
        alive = [p for p in pids if _alive(p)]
        assert not alive, "processes left running after timeout: %s" % alive
        assert not processes_mentioning(str(tmp_path) + "/"), "a process of the stand-in is still alive"

    return check


@pytest.fixture
def fixture_text():
    """fixture_text(area, name) -> the fixture file's exact text."""
    return read_fixture
