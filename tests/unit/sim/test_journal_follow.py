"""The stand-in journalctl follows the kernel log (-f) like journald's: what is appended comes out at once, once."""

import json
import os
import select
import time

from simlib import SIM


def _node(sim_package, sim, scenario="healthy_rtx5090"):
    from gpufleet_sim.state import Node
    return Node(env=sim.env(scenario))


def _read_json_lines(proc, want, timeout=10.0):
    """Up to `want` JSON lines from a following journalctl within timeout."""
    out = []
    buf = b""
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    while len(out) < want and time.monotonic() < deadline:
        ready, _w, _x = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        data = os.read(fd, 65536)
        if not data:
            break
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            out.append(json.loads(line))
    return out


def _popen(sim, *args):
    import subprocess
    return subprocess.Popen([str(SIM / "bin" / "journalctl")] + list(args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=sim.env("healthy_rtx5090"))


def _following(proc, node, timeout=30.0):
    """Wait until the follower prints what is appended (with --lines=0 a line written before it started is never
    printed): append numbered markers until one comes back, then read up to the last one."""
    deadline = time.monotonic() + timeout
    sent, seen = 0, None
    while seen is None and time.monotonic() < deadline:
        sent += 1
        node.append_kernel(["NVRM: marker %d" % sent])
        got = _read_json_lines(proc, 1, timeout=0.5)
        seen = int(got[0]["MESSAGE"].split()[-1]) if got else None
    assert seen is not None, "the follower printed none of %d markers" % sent
    while seen < sent:
        seen = int(_read_json_lines(proc, 1)[0]["MESSAGE"].split()[-1])


def test_lines_all_and_follow_default_of_ten(sim):
    everything = sim.run("healthy_rtx5090", "journalctl", "-o", "json", "-b", "0").stdout.splitlines()
    assert len(everything) > 10
    all_lines = sim.run("healthy_rtx5090", "journalctl", "-o", "json", "-b", "0", "--lines=all").stdout.splitlines()
    assert all_lines == everything
    assert len(sim.run("healthy_rtx5090", "journalctl", "-o", "json", "-n", "3").stdout.splitlines()) == 3


def test_follow_prints_appended_entries_once_after_the_cursor(sim, sim_package):
    node = _node(sim_package, sim)
    last = json.loads(sim.run("healthy_rtx5090", "journalctl", "-o", "json", "-n", "1").stdout)
    proc = _popen(sim, "--follow", "--output=json", "--after-cursor=" + last["__CURSOR"], "--lines=all",
                  "--grep=NVRM", "_TRANSPORT=kernel")
    try:
        assert _read_json_lines(proc, 1, timeout=1.0) == []  # nothing after the cursor yet
        node.append_kernel(["usb 1-4: noise that --grep drops",
                            "NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."])
        got = _read_json_lines(proc, 1)
        assert [r["MESSAGE"] for r in got] == [
            "NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."]
        node.append_kernel(["NVRM: Xid (PCI:0000:02:00): 13, pid=1, name=x, Graphics Exception"])
        again = _read_json_lines(proc, 2, timeout=2.0)
        assert [r["MESSAGE"][:27] for r in again] == ["NVRM: Xid (PCI:0000:02:00):"]
        assert int(again[0]["__SEQNUM"]) > int(got[0]["__SEQNUM"])
    finally:
        proc.terminate()
        proc.wait(10)


def test_follow_without_position_starts_with_the_last_ten(sim, sim_package):
    node = _node(sim_package, sim)
    proc = _popen(sim, "-f", "-o", "json")
    try:
        first = _read_json_lines(proc, 10, timeout=30)
        assert len(first) == 10
        node.append_kernel(["NVRM: after the start"])  # the next line printed: nothing beyond the ten came first
        assert [r["MESSAGE"] for r in _read_json_lines(proc, 1, timeout=30)] == ["NVRM: after the start"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_follow_after_a_reset_prints_only_new_entries(sim, sim_package):
    node = _node(sim_package, sim)
    proc = _popen(sim, "-f", "-o", "json", "--lines=0")
    try:
        from gpufleet_sim.state import reset
        _following(proc, node)
        reset(str(sim.state()))
        node = _node(sim_package, sim)  # the simulated reboot writes a fresh log with its history
        node.append_kernel(["NVRM: after the reboot"])
        got = _read_json_lines(proc, 1)
        assert [r["MESSAGE"] for r in got] == ["NVRM: after the reboot"]
        assert _read_json_lines(proc, 1, timeout=0.5) == []
    finally:
        proc.terminate()
        proc.wait(10)
