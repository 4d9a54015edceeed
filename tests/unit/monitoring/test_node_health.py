"""The health collector (gpufleet-node-health) against the simulator's nvidia-smi and nvme, with its mount table."""

import json
import os
import subprocess
import sys
from pathlib import Path

from watchlib import HEALTH, LIB, SIM_BIN, read_metrics, total, value

REPO = Path(__file__).resolve().parents[3]
if str(REPO / "sim") not in sys.path:
    sys.path.insert(0, str(REPO / "sim"))

from gpufleet_sim.state import Node  # noqa: E402


def run_health(tmp_path, scenario, **cfg):
    env = dict(os.environ, GPUFLEET_SIM_SCENARIO=scenario, GPUFLEET_SIM_STATE=str(tmp_path / "node"),
               GPUFLEET_SIM_NODE="node", GPUFLEET_LIB=str(LIB), PATH=str(SIM_BIN) + os.pathsep + os.environ["PATH"])
    node = Node(env=env)
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir(exist_ok=True)
    conf = {"metrics_directory": str(metrics_dir), "state_directory": str(tmp_path / "state"),
            "nvidia_smi": str(SIM_BIN / "nvidia-smi"), "nvme": str(SIM_BIN / "nvme"),
            "nvme_devices": [], "nvme_discover": False, "checkpoint_paths": [node.checkpoint_dir()], "mounts_file": node.path("mounts")}
    conf.update(cfg)
    (tmp_path / "monitoring.json").write_text(json.dumps(conf))
    res = subprocess.run([sys.executable, str(HEALTH), "--config", str(tmp_path / "monitoring.json")],
                         capture_output=True, text=True, env=env, timeout=120)
    prom = metrics_dir / "gpufleet_health.prom"
    return res, prom, node


def test_the_slow_leak_gpu_shows_its_remaps_histogram_and_ecc(tmp_path):
    res, prom, node = run_health(tmp_path, "ecc_leak")
    assert res.returncode == 0, res.stderr
    m = read_metrics(prom)
    pci2 = "0000:%s:00" % node.gpus[2]["bus"]
    assert value(m, "gpufleet_gpu_remapped_rows", pci=pci2, cause="correctable") == 508
    assert value(m, "gpufleet_gpu_remapped_rows_pending", pci=pci2) == 1
    assert value(m, "gpufleet_gpu_remap_banks", pci=pci2, availability="none") == 225
    assert value(m, "gpufleet_gpu_remap_banks", pci=pci2, availability="low") == 412
    assert value(m, "gpufleet_gpu_ecc_errors_total", pci=pci2, type="corrected", scope="aggregate") >= 48211
    # the R470 driver only knows clocks_throttle_reasons.*: the query falls back and still reads the reasons
    assert value(m, "gpufleet_gpu_throttle_reason_active", pci=pci2, reason="gpu_idle") in (0, 1)
    assert value(m, "gpufleet_health_collector_up", collector="gpu") == 1
    check = subprocess.run(["promtool", "check", "metrics"], input=prom.read_text(), capture_output=True, text=True)
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr


def test_a_worn_read_only_checkpoint_nvme(tmp_path):
    res, prom, node = run_health(tmp_path, "checkpoint_readonly", nvme_devices=["/dev/nvme0"])
    assert res.returncode == 0, res.stderr
    m = read_metrics(prom)
    path = node.checkpoint_dir()
    assert value(m, "gpufleet_checkpoint_read_only", path=path, device="/dev/nvme1n1p1") == 1
    assert value(m, "gpufleet_checkpoint_free_bytes", path=path) > 0
    assert value(m, "gpufleet_checkpoint_size_bytes", path=path) >= value(m, "gpufleet_checkpoint_free_bytes", path=path)
    # nvme1 comes from the checkpoint mount, nvme0 from the configuration
    assert value(m, "gpufleet_nvme_percent_used", device="/dev/nvme1") == 112
    assert value(m, "gpufleet_nvme_critical_warning", device="/dev/nvme1", flag="read_only") == 1
    assert value(m, "gpufleet_nvme_critical_warning", device="/dev/nvme1", flag="temperature") == 0
    assert value(m, "gpufleet_nvme_percent_used", device="/dev/nvme0") is not None
    assert total(m, "gpufleet_health_collector_up") == 4  # gpu, nvlink (an HGX node), checkpoint_storage, nvme


def test_nvlink_links_counters_fabric_and_the_fabric_manager(tmp_path):
    res, prom, node = run_health(tmp_path, "hgx_nvlink_down")
    assert res.returncode == 0, res.stderr
    m = read_metrics(prom)
    pci5 = "0000:%s:00" % node.gpus[5]["bus"]
    assert value(m, "gpufleet_nvlink_link_up", pci=pci5, gpu="5", link="11") == 0
    assert value(m, "gpufleet_nvlink_link_up", pci=pci5, gpu="5", link="10") == 1
    assert value(m, "gpufleet_nvlink_link_speed_gbps", pci=pci5, gpu="5", link="10") == 26.562
    assert value(m, "gpufleet_nvlink_link_speed_gbps", pci=pci5, gpu="5", link="11") is None
    assert total(m, "gpufleet_nvlink_link_up") == 8 * 18 - 1
    assert value(m, "gpufleet_nvlink_errors_total", pci=pci5, gpu="5", link="11", type="crc") == 0
    assert value(m, "gpufleet_gpu_fabric_complete", pci=pci5, gpu="5", state="completed") == 1
    assert value(m, "gpufleet_fabric_manager_active", service="nvidia-fabricmanager") == 1
    assert value(m, "gpufleet_health_collector_up", collector="nvlink") == 1
    check = subprocess.run(["promtool", "check", "metrics"], input=prom.read_text(), capture_output=True, text=True)
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr

    stopped, prom2, node2 = run_health(tmp_path / "stopped", "hgx_fabric_manager_stopped")
    m2 = read_metrics(prom2)
    assert value(m2, "gpufleet_fabric_manager_active", service="nvidia-fabricmanager") == 0
    assert total(m2, "gpufleet_gpu_fabric_complete") == 0 and len([k for k in m2 if k[0] == "gpufleet_gpu_fabric_complete"]) == 8
    assert total(m2, "gpufleet_nvlink_link_up") == 0

    pcie, prom3, _node3 = run_health(tmp_path / "pcie", "healthy_rtx5090")
    m3 = read_metrics(prom3)
    assert not [k for k in m3 if k[0].startswith(("gpufleet_nvlink_", "gpufleet_fabric_", "gpufleet_gpu_fabric"))]
    assert value(m3, "gpufleet_health_collector_up", collector="nvlink") == 1


def test_missing_tools_and_paths_are_reported_and_the_rest_is_written(tmp_path):
    res, prom, _node = run_health(tmp_path, "healthy_h100", nvidia_smi="no-such-nvidia-smi", nvme="no-such-nvme",
                                  nvme_devices=["/dev/nvme0"], checkpoint_paths=[str(tmp_path / "missing")])
    assert res.returncode == 0
    m = read_metrics(prom)
    assert value(m, "gpufleet_health_collector_up", collector="gpu") == 0
    assert value(m, "gpufleet_health_collector_up", collector="nvme") == 0
    assert value(m, "gpufleet_health_collector_up", collector="checkpoint_storage") == 0
    assert value(m, "gpufleet_checkpoint_path_ok", path=str(tmp_path / "missing")) == 0
    assert value(m, "gpufleet_health_last_run_timestamp_seconds") > 0
    assert "nvidia-smi not found" in res.stderr and "nvme-cli not found" in res.stderr
    assert "statvfs failed" in res.stderr


def test_an_unwritable_metrics_directory_fails_the_run(tmp_path):
    res, prom, _node = run_health(tmp_path, "healthy_h100", metrics_directory=str(tmp_path / "nope"))
    assert res.returncode == 1
    assert "cannot write" in res.stderr


IB_FIXTURES = REPO / "tests" / "fixtures" / "ib" / "sysfs"


def test_infiniband_ports_state_rate_width_and_counters_from_sysfs(tmp_path):
    res, prom, _node = run_health(tmp_path, "healthy_h100", infiniband_root=str(IB_FIXTURES / "degraded"),
                                  ib_expected_rate_gbps=400)
    assert res.returncode == 0, res.stderr
    m = read_metrics(prom)
    assert value(m, "gpufleet_ib_port_up", hca="mlx5_0", port="1", state="ACTIVE", phys_state="LinkUp") == 1
    assert value(m, "gpufleet_ib_port_up", hca="mlx5_1", port="1", state="DOWN", phys_state="Polling") == 0
    assert value(m, "gpufleet_ib_port_rate_gbps", hca="mlx5_0", port="1") == 200
    assert value(m, "gpufleet_ib_port_width_lanes", hca="mlx5_0", port="1") == 2
    assert value(m, "gpufleet_ib_port_expected_rate_gbps", hca="mlx5_0", port="1") == 400
    assert value(m, "gpufleet_ib_port_link_downed_total", hca="mlx5_1", port="1") == 4
    assert value(m, "gpufleet_ib_port_errors_total", hca="mlx5_1", port="1", counter="symbol_error") is not None
    assert value(m, "gpufleet_health_collector_up", collector="infiniband") == 1
    # An HCA that answers no performance query: its counters are unknown, never zeros.
    res, prom, _node = run_health(tmp_path, "healthy_h100", infiniband_root=str(IB_FIXTURES / "no_pma_old_kernel"))
    m = read_metrics(prom)
    assert total(m, "gpufleet_ib_port_errors_total") == 0 and not [k for k in m if k[0].endswith("_total")
                                                                    and k[0].startswith("gpufleet_ib_")]
    assert value(m, "gpufleet_ib_port_expected_rate_gbps") is None


def test_a_node_without_infiniband_writes_no_infiniband_series(tmp_path):
    res, prom, _node = run_health(tmp_path, "healthy_h100", infiniband_root=str(tmp_path / "no-such-dir"))
    m = read_metrics(prom)
    assert res.returncode == 0 and not [k for k in m if k[0].startswith("gpufleet_ib_")]
    assert value(m, "gpufleet_health_collector_up", collector="infiniband") is None
