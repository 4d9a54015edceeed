"""The quarantine's alert path ending on a real node: an XID 79 in a test-fleet node's journal -> the gpu_monitoring
role's watcher under the node's systemd -> Debian's node_exporter on the node -> Prometheus here, scraping the node's
address -> Alertmanager (docs/lifecycle.md's route) -> ansible-rulebook with the shipped rulebook -> the lifecycle
playbook over SSH: the RMA bundle made on the node and fetched, the drain (the simulator's Slurm, here) with the GPU's
index from the watcher's own nvidia-smi inventory. The same path as tests/integration/test_alert_path.py, whose
nodes are simulated in this process; bench/quarantine.py --nodes fleet times it.

Its own 1-node fleet (prefix gpqt), so no other fleet test meets a watcher or node_exporter it did not install. Run:
`flock /tmp/gpufleet-fleet.lock pytest -q -m fleet tests/fleet/test_alert_quarantine.py` as root."""

import json
import os
import time
from pathlib import Path

import alert_nodes
import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, default_path
from helpers.alert_path import SIM, AlertPath, FleetNode, Missing, scontrol_node

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(900)]

FLEET_DIR = Path(os.environ.get("GPUFLEET_ALERT_FLEET_DIR", "/var/tmp/gpufleet-alert-fleet"))


@pytest.fixture
def alert_fleet(tmp_path):
    fleet = alert_nodes.up(FLEET_DIR, 1, "gpqt", "10.213.18", tmp_path, FleetNode.IDENT)
    yield fleet
    problems = fleet.down()
    assert not problems and not fleet.leftovers(), problems + fleet.leftovers()


def test_an_xid_79_on_a_node_drains_it_through_the_alert_path_with_its_bundle(alert_fleet, tmp_path, monkeypatch):
    node = alert_fleet.nodes[0].name
    slurm_state = tmp_path / "slurm"
    # The playbook's scontrol runs here (delegated to localhost): the simulator's, with its state in this test.
    monkeypatch.setenv("GPUFLEET_SIM_SLURM", str(slurm_state))
    inventory_vars = dict(alert_nodes.inventory_vars(), gpufleet_slurm_bin_dir=str(SIM / "bin"))
    try:
        stack = AlertPath(tmp_path / "path", [node], inventory_vars=inventory_vars, fleet=alert_fleet).start()
    except Missing as exc:
        pytest.fail(str(exc))
    try:
        started = time.monotonic()
        stack.nodes[node].xid(0, 79, "GPU has fallen off the bus.")
        env = {"GPUFLEET_SIM_SLURM": str(slurm_state), "PATH": "/usr/bin:/bin"}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            drained = scontrol_node(node, str(SIM / "bin" / "scontrol"), env)
            if drained and "DRAIN" in drained["State"]:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("%s not drained in 120 s\n%s" % (node, stack.logs()))
        print("XID 79 on %s -> Slurm DRAIN in %.1f s" % (node, time.monotonic() - started))
        # The GPU's index came from the watcher's nvidia-smi on the node, through the alert's gpu label.
        assert drained["Reason"].startswith("gpufleet: XID_79 0 ["), drained
        deadline = time.monotonic() + 60
        while stack.playbook_runs() < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        log = stack.rulebook_log.read_text(errors="replace")
        assert "failed=0" in log and "unreachable=0" in log, stack.logs()
    finally:
        stack.close()
    with History(default_path(stack.reports / "history"), readonly=True) as history:
        rows = history.lifecycle_of(node)
    assert [(r["to_state"], r["actor"], r["code"], r["gpu"]) for r in rows] == [("quarantined", "alert", "XID_79", "0")]
    # The bundle was made on the node (its tools' paths there) and fetched, before any repair.
    [bundle] = (stack.reports / "rma" / node).iterdir()
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["host"] == node
    sources = {f["name"]: f["source"] for f in manifest["files"]}
    assert sources["nvidia-smi-q.xml"][0] == alert_nodes.NODE_SIM_ROOT + "/bin/nvidia-smi", sources
    assert "nvidia-bug-report.log.gz" in sources, sources
