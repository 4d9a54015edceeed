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

import os
import signal
import subprocess
import time

# A misbehaving tool must not exhaust the node's memory through Ansible's result: keep head and tail.
MAX_OUTPUT_CHARS = 4 * 1024 * 1024


class ToolResult:
    """What a tool did: exit status, decoded output, whether it timed out, how long it ran."""

    def __init__(self, argv, rc, stdout, stderr, timed_out, duration_s, error=None):
        self.argv = list(argv)
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out
        self.duration_s = duration_s
        self.error = error  # could not start at all (ENOENT, EACCES): a message naming the tool

    @property
    def ok(self):
        return self.error is None and not self.timed_out and self.rc == 0

    def as_dict(self):
        """The tool section of a module result: enough to reproduce the run by hand."""
        return {
            "argv": self.argv,
            "rc": self.rc,
            "timed_out": self.timed_out,
            "duration_s": round(self.duration_s, 3),
            "error": self.error,
        }


def _decode(data):
    if data is None:
        return ""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    if len(text) > MAX_OUTPUT_CHARS:
        half = MAX_OUTPUT_CHARS // 2
        text = text[:half] + "\n[... %d characters cut by gpufleet ...]\n" % (len(text) - MAX_OUTPUT_CHARS) + text[-half:]
    return text


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


def run_tool(argv, timeout_s, env=None, cwd=None, stdin_data=None, grace_s=5.0, lease=None):
    """Run argv with a hard timeout; never raises for tool failures, returns a ToolResult.

    env: extra variables merged over the module's environment (LC_ALL=C is always set so output is parseable).
    lease: a lease.Lease: the tool's process group is recorded under the run, and killed as soon as the controller
    stops refreshing the lease (the result then has `error` saying so).
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
    timed_out = False
    abandoned = None
    try:
        if lease is None:
            out, err = proc.communicate(input=stdin_data, timeout=timeout_s)
        else:
            out, err, abandoned = _communicate_leased(proc, stdin_data, timeout_s, lease, started)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc, grace_s)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            # A process that left the group (its own session) still holds the pipes: stop reading, keep the verdict.
            for pipe in (proc.stdout, proc.stderr):
                if pipe:
                    pipe.close()
            proc.wait()
            out, err = b"", b"[gpufleet: output lost: a process outside the tool's group kept its pipes open]"
    else:
        # The leader exited; children it left in its group (daemonised workers) must not outlive the check.
        if _group_alive(proc.pid):
            _kill_group(proc, grace_s)
    return ToolResult(argv, proc.returncode, _decode(out), _decode(err), timed_out, time.monotonic() - started,
                      error=abandoned)


def _communicate_leased(proc, stdin_data, timeout_s, lease, started):
    """communicate() in one-second slices, checking the lease between them. (out, err, abandoned reason or None)."""
    lease.record(proc.pid, proc.args)
    first = True
    while True:
        left = timeout_s - (time.monotonic() - started)
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        try:
            out, err = proc.communicate(input=stdin_data if first else None, timeout=min(1.0, left))
            return out, err, None
        except subprocess.TimeoutExpired:
            first = False
        if lease.expired():
            _kill_group(proc, 5.0)
            out, err = proc.communicate(timeout=10)
            return out, err, lease.reason()


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
