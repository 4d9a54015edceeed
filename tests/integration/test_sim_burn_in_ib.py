"""The burn-in on the simulated fleet with a fabric (inventories/sim-fabric): the InfiniBand ports read before and
after the load, each finding on the right node and port: fab-node06's slow NIC trained at 2X, fab-node03's marginal
cable whose symbol errors rise during the burn; a healthy node's ports pass."""

import pytest
from helpers.playbook_runner import nodes_by_host, run_playbook

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    rc, output, report = run_playbook("burn_in", tmp_path_factory.mktemp("burn_in_ib"), inventory="inventories/sim-fabric",
                                      # a 300 s burn (3 s real: several 1 s samples inside it) and only the
                                      # checks around the load; DCGM, NCCL and storage are not this file's subject
                                      extra={"gpufleet_burn_duration_s": 300, "gpufleet_dcgm_enabled": False,
                                             "gpufleet_nccl_enabled": False, "gpufleet_checkpoint_path": ""},
                                      args=("-l", "fab-node01,fab-node03,fab-node06,localhost"))
    assert report is not None, output[-4000:]
    return nodes_by_host(report)


def test_the_slow_nic_is_a_port_trained_down_on_its_rail(report):
    node = report["fab-node06"]
    found = [(f["code"], f["message"]) for f in node["findings"] if f["check"] == "ib_ports"]
    assert found == [("IB_RATE_LOW", "fab-node06: mlx5_3 port 1 runs at 200 Gb/s, below the expected 400 Gb/s"),
                     ("IB_WIDTH_LOW", "fab-node06: mlx5_3 port 1 trained at 2X, below the expected 4X")]
    assert node["checks"]["ib_ports"]["figures"] == {"ports": 8, "ports_active": 8}


def test_the_marginal_cable_s_errors_rise_during_the_burn(report):
    node = report["fab-node03"]
    found = [f for f in node["findings"] if f["check"] == "ib_ports"]
    assert [f["code"] for f in found] == ["IB_ERRORS_RISING"], node["findings"]
    finding = found[0]
    assert finding["message"].startswith("fab-node03: mlx5_5 port 1 error counters rose under load: port_rcv_errors +")
    assert any(line.startswith("mlx5_5 port 1 symbol_error: 2 -> ") for line in finding["evidence"])


def test_a_healthy_node_s_ports_pass(report):
    node = report["fab-node01"]
    assert node["checks"]["ib_ports"]["verdict"] == "pass"
    assert node["verdict"] == "pass" and node["findings"] == [], node["findings"]
