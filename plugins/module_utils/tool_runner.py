# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Run one external tool safely (stdlib only: runs on the node).

Why not AnsibleModule.run_command: it has no timeout on older ansible-core, and on timeout it would not kill the
tool's children (gpu_burn forks one worker per GPU, mpirun/torchrun spawn ranks). Here every tool runs in its own
session (process group); on timeout the whole group gets SIGTERM, then SIGKILL after a grace period, so no orphan
keeps a GPU busy. Arguments are always an argv list: nothing from user input ever reaches a shell.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import collections
import os
import selectors
import signal
import subprocess
import time

# A misbehaving tool must not exhaust the node's memory through Ansible's result: each stream keeps its first and its
# last half of this many bytes, cut WHILE it is read (the rest is counted, never held), and the pipe is drained to
# the end so the tool never blocks on a full pipe.
MAX_OUTPUT_BYTES = 4 * 1024 * 1024
_READ_BYTES = 65536
_DRAIN_AFTER_KILL_S = 10.0


class ToolResult:
    """What a tool did: exit status, decoded output, whether it timed out, how long it ran."""

    def __init__(self, argv, rc, stdout, stderr, timed_out, duration_s, error=None, cut_bytes=0):
        self.argv = list(argv)
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out
        self.duration_s = duration_s
        self.error = error  # could not start at all (ENOENT, EACCES): a message naming the tool
        self.cut_bytes = cut_bytes  # bytes of output (both streams) dropped from the middle: see MAX_OUTPUT_BYTES

    @property
    def ok(self):
        return self.error is None and not self.timed_out and self.rc == 0

    @property
    def output_cut(self):
        return self.cut_bytes > 0

    def as_dict(self):
        """The tool section of a module result: enough to reproduce the run by hand."""
        return {
            "argv": self.argv,
            "rc": self.rc,
            "timed_out": self.timed_out,
            "duration_s": round(self.duration_s, 3),
            "error": self.error,
            "output_cut_bytes": self.cut_bytes,
        }


class _Capture:
    """One output stream as it is read: its first `limit / 2` bytes and its last `limit / 2`; the middle only counted."""

    def __init__(self, limit=MAX_OUTPUT_BYTES):
        self.half = limit // 2
        self.head = bytearray()
        self.tail = collections.deque()
        self.tail_bytes = 0
        self.total = 0

    def add(self, data):
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail.append(data)
            self.tail_bytes += len(data)
            while self.tail_bytes - len(self.tail[0]) >= self.half:
                self.tail_bytes -= len(self.tail.popleft())

    @property
    def cut(self):
        return max(0, self.total - len(self.head) - min(self.tail_bytes, self.half))

    def text(self):
        tail = b"".join(self.tail)[-self.half:] if self.tail else b""
        head = self.head.decode("utf-8", "replace")
        if not self.cut:
            return (bytes(self.head) + tail).decode("utf-8", "replace")
        return "%s\n[... %d bytes cut by gpufleet ...]\n%s" % (head, self.cut, tail.decode("utf-8", "replace"))


def _kill_group(proc, grace_s):
    """SIGTERM the tool's process group, then SIGKILL whatever is left after grace_s."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(proc.pid):
                return
            time.sleep(0.05)


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


class _Pump:
    """Feed the tool's stdin and read its stdout and stderr as they come (selectors), into two _Captures."""

    def __init__(self, proc, stdin_data):
        self.proc = proc
        self.out, self.err = _Capture(), _Capture()
        self.sel = selectors.DefaultSelector()
        self.sel.register(proc.stdout, selectors.EVENT_READ, self.out)
        self.sel.register(proc.stderr, selectors.EVENT_READ, self.err)
        self.stdin = memoryview(stdin_data) if stdin_data is not None else None
        if self.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            if len(self.stdin):
                self.sel.register(proc.stdin, selectors.EVENT_WRITE, None)
            else:
                proc.stdin.close()

    def run(self, until, tick=None):
        """Pump until both output pipes are at their end (True) or the clock passes `until` (False); tick() is called
        at least once a second and stops the pumping when it returns True."""
        while self.sel.get_map():
            left = until - time.monotonic()
            if left <= 0:
                return False
            for key, _mask in self.sel.select(min(1.0, left)):
                if key.data is None:
                    self._write(key.fileobj)
                    continue
                data = os.read(key.fileobj.fileno(), _READ_BYTES)
                if data:
                    key.data.add(data)
                else:
                    self.sel.unregister(key.fileobj)
                    key.fileobj.close()
            if tick is not None and tick():
                return False
        return True

    def _write(self, pipe):
        try:
            sent = os.write(pipe.fileno(), self.stdin[:_READ_BYTES])
        except BlockingIOError:
            return
        except (BrokenPipeError, OSError):
            sent = len(self.stdin)  # the tool closed its stdin: the rest is not wanted
        self.stdin = self.stdin[sent:]
        if not len(self.stdin):
            self.sel.unregister(pipe)
            pipe.close()

    def close(self):
        for key in list(self.sel.get_map().values()):
            self.sel.unregister(key.fileobj)
            key.fileobj.close()
        self.sel.close()


def run_tool(argv, timeout_s, env=None, cwd=None, stdin_data=None, grace_s=5.0, lease=None):
    """Run argv with a hard timeout; never raises for tool failures, returns a ToolResult.

    env: extra variables merged over the module's environment (LC_ALL=C is always set so output is parseable).
    lease: a lease.Lease: the tool's process group is recorded under the run, and killed as soon as the controller
    stops refreshing the lease (the result then has `error` saying so).
    Output beyond MAX_OUTPUT_BYTES per stream is cut from its middle while it is read (cut_bytes, output_cut).
    """
    full_env = dict(os.environ)
    full_env["LC_ALL"] = "C"
    full_env["LANG"] = "C"
    if env:
        full_env.update({str(k): str(v) for k, v in env.items()})
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=full_env,
            start_new_session=True,
        )
    except OSError as exc:
        return ToolResult(argv, None, "", "", False, time.monotonic() - started,
                          error="cannot execute %s: %s" % (argv[0], exc.strerror or exc))
    pump = _Pump(proc, stdin_data)
    deadline = started + timeout_s
    abandoned = []
    tick = None
    if lease is not None:
        lease.record(proc.pid, proc.args)

        def tick():
            if lease.expired():
                abandoned.append(lease.reason())
                return True
            return False

    timed_out = False
    try:
        finished = pump.run(deadline, tick) and _wait(proc, deadline)
        if not finished:
            timed_out = not abandoned
            _kill_group(proc, grace_s)
            if not pump.run(time.monotonic() + _DRAIN_AFTER_KILL_S):
                # A process that left the group (its own session) still holds the pipes: stop reading, keep the verdict.
                pump.err.add(b"\n[gpufleet: output after the kill lost: a process outside the tool's group kept its "
                             b"pipes open]")
        elif _group_alive(proc.pid):
            # The leader exited; children it left in its group (daemonised workers) must not outlive the check.
            _kill_group(proc, grace_s)
    finally:
        pump.close()
        proc.wait()
    return ToolResult(argv, proc.returncode, pump.out.text(), pump.err.text(), timed_out,
                      time.monotonic() - started, error=abandoned[0] if abandoned else None,
                      cut_bytes=pump.out.cut + pump.err.cut)


def _wait(proc, deadline):
    """The pipes are closed: wait for the tool to exit, until the deadline. True when it did."""
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        return False


def find_tool(module, name, executable=None, extra_dirs=None):
    """Path of a tool: the `executable` option when given, else PATH (plus extra_dirs). None when absent.

    Callers turn None into verdict `error` with a message naming what to install; they do not fail_json,
    so that the other checks on the node still run.
    """
    if executable:
        if os.path.isfile(executable) and os.access(executable, os.X_OK):
            return executable
        if os.sep not in executable:
            return module.get_bin_path(executable, required=False, opt_dirs=extra_dirs or [])
        return None
    return module.get_bin_path(name, required=False, opt_dirs=extra_dirs or [])
