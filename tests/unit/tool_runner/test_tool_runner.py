"""tool_runner: timeouts kill the whole process group, output is decoded, nothing reaches a shell."""

import os
import sys
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    with open("/proc/%d/stat" % pid) as fh:
        return fh.read().split()[2] != "Z"


def test_timeout_kills_children_that_ignore_sigterm(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = (
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        "open(%r, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n" % str(pidfile)
    )
    started = time.monotonic()
    result = run_tool([sys.executable, "-c", script], timeout_s=2, grace_s=0.5)
    assert result.timed_out and not result.ok
    assert "started" in result.stdout
    assert time.monotonic() - started < 20
    assert not _alive(int(pidfile.read_text()))


def test_argv_is_never_a_shell(tmp_path):
    marker = tmp_path / "pwned"
    result = run_tool(["echo", "; touch %s" % marker], timeout_s=10)
    assert result.ok and result.stdout.strip() == "; touch %s" % marker
    assert not marker.exists()


def test_missing_binary_is_an_error_not_an_exception():
    result = run_tool(["/nonexistent/tool", "x"], timeout_s=5)
    assert result.error and "/nonexistent/tool" in result.error and result.rc is None


def test_invalid_utf8_is_replaced():
    result = run_tool([sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'a\\xffb')"], timeout_s=10)
    assert result.stdout == "a\ufffdb"


def test_pipe_held_outside_the_group_does_not_hang(tmp_path):
    # A grandchild in its own session keeps stdout open after the tool is killed (torchrun workers do this).
    pidfile = tmp_path / "escapee.pid"
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        "open(%r, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n" % str(pidfile)
    )
    started = time.monotonic()
    result = run_tool([sys.executable, "-c", script], timeout_s=1, grace_s=0.5)
    try:
        assert result.timed_out
        assert time.monotonic() - started < 30
    finally:
        os.kill(int(pidfile.read_text()), 9)
