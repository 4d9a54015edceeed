"""The preflight on the simulated fleet: quick, non-disruptive, and it still finds what can be found without load."""

import pytest
from helpers.playbook_runner import codes, nodes_by_host


@pytest.fixture(scope="module")
def report(preflight_run):
    rc, output, report = preflight_run
    assert report is not None, output[-4000:]
    return report


def test_preflight_runs_no_invasive_check(report):
    for node in report["nodes"]:
        assert "gpu_burn" not in node["checks"] and "dcgm_diag" not in node["checks"], node["host"]
        assert node["stage"] == "done"


def test_dry_run_and_short_nccl_ran_on_every_free_node(report):
    for host, node in nodes_by_host(report).items():
        if host == "sim-node07":  # busy: refused
            assert node["checks"]["train_dryrun"]["verdict"] == "skipped"
            continue
        assert node["checks"]["train_dryrun"]["verdict"] == "pass", (host, node["checks"]["train_dryrun"])
        assert node["checks"]["nccl_test"]["verdict"] in ("pass", "fail"), host


@pytest.mark.parametrize("host,expected", [
    ("sim-node05", {"ECC_LEAK", "XID_RMA"}),       # XID 92/63 history since boot
    ("sim-node06", {"NCCL_BUSBW_LOW"}),             # the short NCCL sweep is enough to see the slow link
    ("sim-node07", {"GPU_BUSY", "CHECKS_REFUSED"}),  # a neighbour process
    ("sim-node08", {"STORAGE_FAIL"}),               # read-only checkpoint mount
    ("sim-node09", {"NVLINK_LINK_DOWN"}),           # the link is down at idle too
])
def test_faults_visible_without_load_are_found(report, host, expected):
    assert expected <= codes(nodes_by_host(report)[host])


def test_each_simulated_node_has_its_own_training_environment(report):
    # Each simulated training user has the profile kentino.gpufleet.training_env would write (not this machine's).
    for host, node in nodes_by_host(report).items():
        assert node["checks"]["training_env_facts"]["verdict"] == "pass", (host, node["checks"]["training_env_facts"])


def test_healthy_nodes_pass(report):
    for host in ("sim-node01", "sim-node02", "sim-node03", "sim-node04"):
        node = nodes_by_host(report)[host]
        assert node["verdict"] == "pass" and node["findings"] == [], node["findings"]
