"""tool_runner: timeouts kill the whole process group, output is decoded, nothing reaches a shell."""

import os
import subprocess
import sys
import time
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import MAX_OUTPUT_BYTES, run_tool
from helpers.probes import PEAK_MB

REPO = Path(__file__).resolve().parents[3]


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


FLOOD = ("import sys\n"
         "chunk = b'x' * 1048576\n"
         "sys.stdout.buffer.write(b'first line\\n')\n"
         "for _ in range(%d): sys.stdout.buffer.write(chunk)\n"
         "sys.stdout.buffer.write(b'\\nlast line\\n')\n")


def test_output_is_cut_while_it_is_read_memory_stays_bounded():
    # 256 MiB of output: run_tool keeps its 4 MiB head and tail as it reads, so the reading process never holds the
    # rest (before: all of it, then a decoded copy). Measured in a fresh process: its peak RSS is its own.
    probe = PEAK_MB + ("import sys\n"
             "from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool\n"
             "r = run_tool([sys.executable, '-c', %r], timeout_s=120)\n"
             "print(peak_mb(), len(r.stdout), r.output_cut,"
             " r.as_dict()['output_cut_bytes'], r.stdout.startswith('first line'), r.stdout.endswith('last line\\n'),"
             " r.rc)" % (FLOOD % 256))
    env = dict(os.environ, PYTHONPATH=str(REPO / "collections"))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr
    peak_mb, kept, cut, cut_bytes, head, tail, rc = out.stdout.split()
    assert int(peak_mb) < 120, "peak RSS %s MB for 256 MiB of output" % peak_mb
    assert cut == "True" and head == "True" and tail == "True" and rc == "0"
    total = 256 * 1048576 + len("first line\n\nlast line\n")
    assert int(cut_bytes) == total - MAX_OUTPUT_BYTES
    assert MAX_OUTPUT_BYTES <= int(kept) < MAX_OUTPUT_BYTES + 200  # the head, the tail and the note between them


def test_both_streams_are_drained_while_the_tool_writes_stdin_is_fed():
    # stderr fills its pipe while stdout is busy, and the tool reads its stdin while it writes: nothing may block.
    script = ("import sys\n"
              "data = sys.stdin.buffer.read()\n"
              "for _ in range(40): sys.stderr.buffer.write(b'e' * 1048576); sys.stdout.buffer.write(b'o' * 1048576)\n"
              "sys.stdout.write(str(len(data)))\n")
    result = run_tool([sys.executable, "-c", script], timeout_s=60, stdin_data=b"i" * (3 * 1048576))
    assert result.rc == 0 and not result.timed_out
    assert result.stdout.endswith("3145728") and result.output_cut
    assert result.as_dict()["output_cut_bytes"] == 2 * (40 * 1048576 - MAX_OUTPUT_BYTES) + len("3145728")


def test_short_output_is_not_cut():
    result = run_tool(["echo", "hello"], timeout_s=10)
    assert result.stdout == "hello\n" and not result.output_cut and result.as_dict()["output_cut_bytes"] == 0
