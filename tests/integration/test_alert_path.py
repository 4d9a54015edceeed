"""The XID watcher's alert through Alertmanager to ansible-rulebook, with the real parts (tests/helpers/alert_path.py):
an XID 79 in a simulated node's kernel log -> the watcher's textfile -> node_exporter -> Prometheus and the shipped
alert rules -> Alertmanager with docs/lifecycle.md's route -> the shipped rulebook -> the lifecycle playbook's
quarantine: the node is drained in the simulated Slurm with gpufleet's reason naming the GPU (index 0, which the
event's JSON makes a number), and its neighbour is not. A second GPU's
XID on the same node (a second alert, a second POST, a second playbook run) quarantines nothing more."""

import json
import time
import urllib.request

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, default_path
from helpers.alert_path import SIM, AlertPath, Missing, scontrol_node
from helpers.sim_processes import node_processes

pytestmark = pytest.mark.slow


@pytest.fixture
def path(tmp_path):
    try:
        stack = AlertPath(tmp_path, ["eda01", "eda02"]).start()
    except Missing as exc:
        pytest.fail(str(exc))
    try:
        yield stack
    finally:
        stack.close()
    # Torn down: no watcher, exporter, daemon or playbook run of this test is left.
    assert all(proc.returncode is not None for proc in stack.started), stack.started
    assert node_processes(stack.state_root) == []


def wait(what, predicate, stack, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError("%s not reached in %ss\n%s" % (what, timeout_s, stack.logs()))


def slurm(stack, name):
    """The node as the simulated controller's scontrol shows it."""
    return scontrol_node(name, str(SIM / "bin" / "scontrol"),
                         env={"GPUFLEET_SIM_SLURM": str(stack.state_root / "slurm"), "PATH": "/usr/bin:/bin"})


def test_an_xid_79_drains_its_node_once_through_alertmanager_and_the_rulebook(path):
    path.nodes["eda01"].xid(0, 79, "GPU has fallen off the bus.")
    node = wait("eda01 drained", lambda: (lambda n: n and "DRAIN" in n["State"] and n)(slurm(path, "eda01")), path)
    assert node["Reason"].startswith("gpufleet: XID_79 0 ["), node
    # The real Prometheus filled the rule's last_event_epoch with the watcher's time of that XID (a query in a template)
    with urllib.request.urlopen("http://127.0.0.1:%d/api/v2/alerts" % path.ports["alertmanager"], timeout=10) as resp:
        [alert] = [a for a in json.load(resp) if a["labels"]["alertname"] == "GpuXidCritical"]
    assert abs(float(alert["annotations"]["last_event_epoch"]) - time.time()) < 600, alert["annotations"]

    # A second critical XID on another GPU of the drained node: Alertmanager posts the node's group again, and the
    # rulebook runs the quarantine again once its first run has ended.
    path.nodes["eda01"].xid(5, 48, "An uncorrectable double bit error (DBE) has been detected on GPU")
    wait("the second playbook run's end", lambda: path.playbook_runs() >= 2, path)
    with History(default_path(path.reports / "history"), readonly=True) as history:
        rows = history.lifecycle_of("eda01")
    assert [(r["to_state"], r["actor"], r["code"], r["gpu"]) for r in rows] == [("quarantined", "alert", "XID_79",
                                                                                "0")], rows
    assert slurm(path, "eda01")["Reason"].startswith("gpufleet: XID_79 0 [")
    assert "DRAIN" not in slurm(path, "eda02")["State"]
    assert "failed=0" in path.rulebook_log.read_text() and "failed=1" not in path.rulebook_log.read_text(), path.logs()
