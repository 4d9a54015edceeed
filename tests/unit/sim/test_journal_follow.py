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
    _node(sim_package, sim)
    proc = _popen(sim, "-f", "-o", "json")
    try:
        assert len(_read_json_lines(proc, 20, timeout=1.5)) == 10
    finally:
        proc.terminate()
        proc.wait(10)


def test_follow_after_a_reset_prints_only_new_entries(sim, sim_package):
    node = _node(sim_package, sim)
    proc = _popen(sim, "-f", "-o", "json", "--lines=0")
    try:
        from gpufleet_sim.state import reset
        # The follower is following once it prints a line appended after it started: append one until it does (a
        # wait on that, not on a guessed start-up time).
        deadline = time.monotonic() + 30
        while not _read_json_lines(proc, 1, timeout=0.5):
            assert time.monotonic() < deadline, "journalctl -f printed nothing appended within 30 s"
            node.append_kernel(["NVRM: before the reboot"])
        assert {r["MESSAGE"] for r in _read_json_lines(proc, 100, timeout=1.0)} <= {"NVRM: before the reboot"}
        reset(str(sim.state()))
        node = _node(sim_package, sim)  # the simulated reboot writes a fresh log with its history
        node.append_kernel(["NVRM: after the reboot"])
        got = _read_json_lines(proc, 1)
        assert [r["MESSAGE"] for r in got] == ["NVRM: after the reboot"]
        assert _read_json_lines(proc, 1, timeout=0.5) == []
    finally:
        proc.terminate()
        proc.wait(10)
