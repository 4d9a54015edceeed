"""A node that dies or drops off the network mid-run is UNREACHABLE within the ssh keepalive bound; the others finish.

The bound comes from the repo's ansible.cfg ssh_args, read here so the test follows any change there: ssh sends a
keepalive after ServerAliveInterval s of silence and gives up when ServerAliveCountMax of them went unanswered, i.e. at
the next interval: Interval x (CountMax + 1) after the last packet (15 x 4 = 60 s with 15/3). Measured: 58.8 s.
"""

import configparser
import re
import time

import pytest
from fleet_ansible import REPO

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(300)]


def _ssh_option(name, default):
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(REPO / "ansible.cfg")
    m = re.search(r"%s=(\d+)" % name, cfg.get("ssh_connection", "ssh_args", fallback=""))
    return int(m.group(1)) if m else default


KEEPALIVE_BOUND_S = _ssh_option("ServerAliveInterval", 0) * (_ssh_option("ServerAliveCountMax", 3) + 1)
SLEEP_S = 12

PLAY = """
- name: Everyone works for a while
  hosts: all
  gather_facts: false
  tasks:
    - name: Long task
      ansible.builtin.command: sleep %d
      changed_when: false
""" % SLEEP_S


def _wait_for_task_on(fleet, name, timeout=60):
    """Block until the play's `sleep` runs on the node, so the failure lands mid-task, not between tasks."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fleet.ssh(name, "pgrep -x sleep", check=False, timeout=10).returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError("the play's task never started on %s" % name)


def _assert_only_victim_unreachable(run, fleet, victim):
    recap = run.recap
    assert set(recap) == {n.name for n in fleet.nodes}, run.output[-3000:]
    assert recap[victim]["unreachable"] == 1, recap
    for node in fleet.nodes:
        if node.name != victim:
            assert recap[node.name] == dict(recap[node.name], ok=1, unreachable=0, failed=0), recap
    assert run.proc.returncode == 4, "ansible-playbook returns 4 when a host is unreachable (got %s)" % run.proc.returncode


def test_killed_node_is_unreachable_and_the_others_finish(fleet, playbook, restore_nodes):
    victim = fleet.nodes[2].name
    restore_nodes.append(victim)
    run = playbook.start(PLAY)
    _wait_for_task_on(fleet, victim)
    killed_at = time.monotonic() - run.started
    fleet.kill_node(victim)
    run.wait(timeout=SLEEP_S + KEEPALIVE_BOUND_S + 60)
    _assert_only_victim_unreachable(run, fleet, victim)
    seen = run.first(r"%s.*UNREACHABLE|UNREACHABLE.*%s" % (re.escape(victim), re.escape(victim)))
    assert seen is not None, run.output[-3000:]
    # A dead kernel resets its TCP connections: no need to wait for the keepalive.
    print("killed %s: UNREACHABLE reported %.1f s after the kill" % (victim, seen - killed_at))
    assert seen - killed_at < 15, "UNREACHABLE %.1f s after the kill" % (seen - killed_at)


def test_cut_link_is_unreachable_within_the_keepalive_bound(fleet, playbook, restore_nodes):
    victim = fleet.nodes[3].name
    restore_nodes.append(victim)
    run = playbook.start(PLAY)
    _wait_for_task_on(fleet, victim)
    cut_at = time.monotonic() - run.started
    fleet.cut_link(victim)
    run.wait(timeout=SLEEP_S + KEEPALIVE_BOUND_S + 90)
    _assert_only_victim_unreachable(run, fleet, victim)
    seen = run.first(r"%s.*UNREACHABLE|UNREACHABLE.*%s" % (re.escape(victim), re.escape(victim)))
    assert seen is not None, run.output[-3000:]
    # Silence (no RST) must still surface: within the keepalive bound (plus scheduling slack on a busy 2-core box).
    print("cut %s: UNREACHABLE reported %.1f s after the cut" % (victim, seen - cut_at))
    assert 0 < KEEPALIVE_BOUND_S <= 120, "ansible.cfg must bound dead-link detection with ServerAliveInterval"
    assert seen - cut_at <= KEEPALIVE_BOUND_S + 10, "UNREACHABLE %.1f s after the cut" % (seen - cut_at)
    fleet.restore_link(victim)
    assert fleet.ssh(victim, "true", timeout=20, check=False).returncode == 0, "node did not come back after restore"


def test_killed_node_boots_again(fleet, restore_nodes):
    victim = fleet.nodes[1].name
    fleet.ssh(victim, "echo before-the-kill > /root/marker && sync")
    restore_nodes.append(victim)
    old_pid1 = fleet.node(victim).pid1
    fleet.kill_node(victim)
    assert fleet.ssh(victim, "true", timeout=10, check=False).returncode != 0
    fleet.restart_node(victim)
    assert fleet.node(victim).pid1 not in (None, old_pid1)
    after = fleet.ssh(victim, "cat /proc/1/comm; systemctl is-system-running --wait").stdout.split()
    assert after[0] == "systemd" and after[1] in ("running", "degraded")
    # A power cycle, not a reimage: what was written to the node's disk before the kill is still there.
    assert fleet.ssh(victim, "hostname; cat /root/marker").stdout.split() == [victim, "before-the-kill"]
