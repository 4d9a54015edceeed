"""HGX H100 scenarios on a small simulated fleet (sim/make_inventory.py): the fabric manager stopped, NVLink error
counters growing during the burn, and a healthy HGX, through the burn-in and the preflight as a user runs them."""

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.playbook_runner import REPO, codes, nodes_by_host, run_playbook

SCENARIOS = ("hgx_fabric_manager_stopped", "hgx_nvlink_crc", "healthy_h100")
STOPPED, CRC, HEALTHY = ("hgx-node%02d" % i for i in (1, 2, 3))


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    out = tmp_path_factory.mktemp("hgx-inventory")
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(out), "--nodes", "3",
                    "--scenario", ",".join(SCENARIOS), "--prefix", "hgx-node"], check=True)
    return out


@pytest.fixture(scope="module")
def burn_in(inventory, tmp_path_factory):
    rc, output, report = run_playbook("burn_in", tmp_path_factory.mktemp("hgx-burn"), inventory=str(inventory))
    assert report is not None, output[-4000:]
    return nodes_by_host(report)


@pytest.fixture(scope="module")
def preflight(inventory, tmp_path_factory):
    rc, output, report = run_playbook("preflight", tmp_path_factory.mktemp("hgx-pre"), inventory=str(inventory))
    assert report is not None, output[-4000:]
    return nodes_by_host(report)


def test_the_inventory_is_the_three_scenarios(inventory):
    hosts = (Path(inventory) / "hosts.yml").read_text()
    assert all(s in hosts for s in SCENARIOS)


def test_fabric_manager_stopped_is_the_burn_ins_action(burn_in):
    node = burn_in[STOPPED]
    assert node["verdict"] == "fail" and node["worst"]["code"] == "FABRIC_MANAGER_STOPPED"
    assert "systemctl enable --now nvidia-fabricmanager" in node["action"]
    assert {"FABRIC_STATE_INCOMPLETE"} <= codes(node)
    assert len([f for f in node["findings"] if f["code"] == "FABRIC_STATE_INCOMPLETE"]) == 8
    assert node["checks"]["nvlink"]["figures"]["fabric_complete"] == "0/8"
    # CUDA cannot start: the burn and NCCL fail too, but their findings are not the node's action.
    assert node["checks"]["gpu_burn"]["verdict"] in ("fail", "error")
    assert node["checks"]["nccl_test"]["verdict"] in ("fail", "error")


def test_counters_growing_during_the_burn(burn_in):
    node = burn_in[CRC]
    found = [(f["code"], f["gpu"]) for f in node["findings"]]
    assert found[:2] == [("NVLINK_ERRORS_HIGH", 6), ("NVLINK_ERRORS_RISING", 2)], found
    assert "link 3: CRC +" in node["worst"]["message"] and "replay +" in node["worst"]["message"]
    assert node["gpus"][6]["metrics"]["nvlink_errors_rise"] > 0 and node["gpus"][2]["metrics"]["nvlink_errors_rise"] > 0


def test_a_healthy_hgx_passes(burn_in, preflight):
    for nodes in (burn_in, preflight):
        node = nodes[HEALTHY]
        assert node["verdict"] == "pass" and node["findings"] == [], node["findings"]
        assert node["checks"]["nvlink"]["verdict"] == "pass"
        assert node["checks"]["nvlink"]["figures"]["interconnect"] == "nvswitch"


def test_the_dry_run_fails_with_802_and_points_at_the_fabric_manager(preflight):
    node = preflight[STOPPED]
    assert {"DRYRUN_FABRIC_NOT_READY", "FABRIC_MANAGER_STOPPED"} <= codes(node)
    dry = [f for f in node["findings"] if f["code"] == "DRYRUN_FABRIC_NOT_READY"][0]
    assert any("Error 802: system not yet initialized" in line for line in dry["evidence"]), dry["evidence"]
    assert node["worst"]["code"] == "FABRIC_MANAGER_STOPPED"
