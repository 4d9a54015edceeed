"""kentino.gpufleet.nvlink_facts run as Ansible runs it, against the simulator's stand-ins (nvidia-smi, systemctl,
dpkg-query) and prepared sysfs/procfs trees; every read matches the schema the controller checks."""

import os
import sys
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_nvlink
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULTS
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import schema_errors

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))
from helpers.module_runner import run_module  # noqa: E402

SIM_BIN = REPO / "sim" / "bin"


def read(tmp_path, scenario, **args):
    state = tmp_path / scenario
    env = {"GPUFLEET_SIM_SCENARIO": scenario, "GPUFLEET_SIM_STATE": str(state), "GPUFLEET_SIM_NODE": "node01",
           "GPUFLEET_SIM_TIME_SCALE": "0.001"}
    args.setdefault("sysfs_root", str(state / "sysfs"))
    args.setdefault("procfs_root", str(state / "procfs"))
    # The stand-ins create the node's state (and its sysfs tree) on their first call.
    os.makedirs(state, exist_ok=True)
    result = run_module("gpu_facts", {}, env=env, path_prepend=[SIM_BIN])
    assert not result.get("failed"), result
    result = run_module("nvlink_facts", args, env=env, path_prepend=[SIM_BIN])
    assert not result.get("failed"), result
    facts = result["ansible_facts"]["gpufleet_nvlink"]
    assert schema_errors("nvlink_facts", facts) == [], schema_errors("nvlink_facts", facts)
    return facts, result


def test_a_healthy_hgx(tmp_path):
    facts, result = read(tmp_path, "healthy_h100")
    assert facts["interconnect"] == "nvswitch" and facts["driver_version"] == "570.133.20"
    assert facts["platform"]["nvswitch"] and facts["platform"]["nvswitch_pci"] == [
        "0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]
    fm = facts["fabric_manager"]
    assert (fm["package"], fm["upstream_version"], fm["active_state"], fm["unit_file_state"]) == (
        "nvidia-fabricmanager-570", "570.133.20", "active", "enabled")
    assert fm["nscq_package"] == "libnvidia-nscq-570"
    assert len(facts["gpus"]) == 8
    for gpu in facts["gpus"]:
        assert (gpu["fabric_state"], gpu["fabric_status"]) == ("completed", "Success")
        assert gpu["nvlink_links_up"] == gpu["nvlink_links_total"] == 18 and gpu["nvlink_crc_errors_total"] == 0
        assert gpu["pci"] and gpu["uuid"].startswith("GPU-")
    assert facts["topology"]["interconnect"] == "nvlink" and len(facts["topology"]["pairs"]) == 28
    assert facts["problems"] == []
    argvs = [c["argv"][1:] for c in result["nvidia_smi"]["calls"]]
    assert ["nvlink", "--status"] in argvs and ["nvlink", "--errorcounters"] in argvs and ["topo", "-m"] in argvs
    assert judge_nvlink.judge(facts, DEFAULTS, "node01") == []


def test_a_registered_gpu_with_an_unhealthy_fabric(tmp_path):
    """Every GPU Completed with Success, GPU 5's fabric health Unhealthy (route unhealthy): read and judged."""
    facts, _ = read(tmp_path, "hgx_fabric_unhealthy")
    gpu5 = facts["gpus"][5]
    assert (gpu5["fabric_state"], gpu5["fabric_status"], gpu5["fabric_health_summary"],
            gpu5["fabric_health_route_unhealthy"]) == ("completed", "Success", "Unhealthy", "True")
    assert facts["gpus"][0]["fabric_health_summary"] == "Healthy"
    found = judge_nvlink.judge(facts, DEFAULTS, "node01")
    assert [(f["code"], f["gpu"]) for f in found] == [("FABRIC_HEALTH_UNHEALTHY", 5)]


def test_the_fabric_managers_journal_says_why_it_exited(tmp_path):
    """The daemon at another version than the driver exits at start; its journal line names both versions."""
    facts, result = read(tmp_path, "hgx_fabric_manager_mismatch")
    journal = facts["fabric_manager"]["journal"]
    assert journal["read"] and journal["error"] is None and journal["lines"] == 5
    (event,) = journal["events"]
    assert (event["kind"], event["fabric_manager_version"], event["driver_version"]) == (
        "driver_version_mismatch", "570.148.08", "570.133.20")
    argv = next(c["argv"] for c in result["nvidia_smi"]["calls"] if c["argv"][0].endswith("journalctl"))
    assert argv[1:6] == ["-u", "nvidia-fabricmanager", "-b", "-n", "300"]
    found = judge_nvlink.judge(facts, DEFAULTS, "node01")
    mismatch = next(f for f in found if f["code"] == "FABRIC_MANAGER_VERSION_MISMATCH")
    assert event["line"] in mismatch["evidence"] and "570.133.20" in mismatch["action"]


def test_nothing_to_do_on_a_machine_without_nvswitches_is_read_and_not_a_fault(tmp_path):
    facts, _ = read(tmp_path, "v100_fabric_manager_not_needed")
    assert facts["fabric_manager"]["active_state"] == "failed" and not facts["platform"]["nvswitch"]
    assert [e["kind"] for e in facts["fabric_manager"]["journal"]["events"]] == ["no_nvswitch"]
    assert judge_nvlink.judge(facts, DEFAULTS, "node01") == []


def test_fabric_manager_stopped(tmp_path):
    facts, _ = read(tmp_path, "hgx_fabric_manager_stopped")
    assert facts["fabric_manager"]["active_state"] == "inactive"
    assert {g["fabric_state"] for g in facts["gpus"]} == {"in_progress"}
    assert {g["nvlink_links_up"] for g in facts["gpus"]} == {0}
    assert facts["topology"]["interconnect"] == "pcie"  # the untrained NVLinks: PCIe paths only
    assert facts["interconnect"] == "nvswitch"  # the machine still is one
    found = [f["code"] for f in judge_nvlink.judge(facts, DEFAULTS, "node01")]
    assert found == ["FABRIC_MANAGER_STOPPED"] + ["FABRIC_STATE_INCOMPLETE"] * 8


def test_one_link_down_and_counters_rising_over_a_burn(tmp_path):
    facts, _ = read(tmp_path, "hgx_nvlink_down")
    gpu5 = facts["gpus"][5]
    assert gpu5["nvlink_links_up"] == 17 and {"link": 11, "up": False, "speed_gbps": None} in gpu5["nvlink_links"]
    assert facts["topology"]["matrix"]["GPU5"]["GPU0"] == "NV17"
    down = [f for f in judge_nvlink.judge(facts, DEFAULTS, "node01")]
    assert [(f["code"], f["gpu"]) for f in down] == [("NVLINK_LINK_DOWN", 5)]

    before, _ = read(tmp_path, "hgx_nvlink_crc")
    env = {"GPUFLEET_SIM_SCENARIO": "hgx_nvlink_crc", "GPUFLEET_SIM_STATE": str(tmp_path / "hgx_nvlink_crc"),
           "GPUFLEET_SIM_NODE": "node01", "GPUFLEET_SIM_TIME_SCALE": "0.001",
           "PATH": str(SIM_BIN) + os.pathsep + os.environ["PATH"]}
    import subprocess
    burn = subprocess.run([str(SIM_BIN / "gpu_burn"), "600"], capture_output=True, text=True, env=env, timeout=120)
    assert burn.returncode == 0, burn.stderr
    after, _ = read(tmp_path, "hgx_nvlink_crc", baseline=before)
    assert after["baseline"]["read_at"] == before["read_at"]
    assert after["gpus"][6]["nvlink_crc_errors_total"] > before["gpus"][6]["nvlink_crc_errors_total"]
    found = [(f["code"], f["gpu"]) for f in judge_nvlink.judge(after, DEFAULTS, "node01")]
    assert found == [("NVLINK_ERRORS_RISING", 2), ("NVLINK_ERRORS_HIGH", 6)]


def test_a_pcie_node_and_gather_platform_only(tmp_path):
    facts, _ = read(tmp_path, "healthy_rtx5090")
    assert facts["interconnect"] == "pcie" and not facts["platform"]["nvswitch"]
    assert facts["fabric_manager"]["package"] is None and facts["fabric_manager"]["load_state"] == "not-found"
    assert {g["nvlink_present"] for g in facts["gpus"]} == {False} and {g["fabric_state"] for g in facts["gpus"]} == {None}
    assert judge_nvlink.not_applicable(facts)
    only_platform, result = read(tmp_path, "healthy_h100", gather=["platform"])
    assert only_platform["gathered"] == ["platform"] and only_platform["gpus"] == []
    assert result["nvidia_smi"]["calls"] == [] and only_platform["platform"]["nvswitch"]


def test_nvlink5_bridges_from_the_vpd(tmp_path):
    sysfs = tmp_path / "sys"
    for dev, vpd in (("mlx5_0", b"\x82\x10ConnectX-7\x90SW_MNG\x00"), ("mlx5_1", b"\x82\x10ConnectX-7 NIC")):
        (sysfs / "class" / "infiniband" / dev / "device").mkdir(parents=True)
        (sysfs / "class" / "infiniband" / dev / "device" / "vpd").write_bytes(vpd)
    result = run_module("nvlink_facts", {"gather": ["platform"], "sysfs_root": str(sysfs),
                                         "procfs_root": str(tmp_path / "proc")})
    platform = result["ansible_facts"]["gpufleet_nvlink"]["platform"]
    assert platform["nvlink5"] and platform["generation"] == "nvlink5" and platform["nvlink5_bridges"] == ["mlx5_0"]
    empty = run_module("nvlink_facts", {"gather": ["platform"], "sysfs_root": str(tmp_path / "none"),
                                        "procfs_root": str(tmp_path / "none")})
    assert empty["ansible_facts"]["gpufleet_nvlink"]["platform"]["generation"] is None


def test_no_nvidia_smi_and_a_bad_baseline_are_problems_not_failures(tmp_path):
    result = run_module("nvlink_facts", {"executable": str(tmp_path / "missing-nvidia-smi"),
                                         "gather": ["gpus", "nvlink"], "baseline": {"read_at": "yesterday"}})
    facts = result["ansible_facts"]["gpufleet_nvlink"]
    assert not result.get("failed") and facts["gpus"] == [] and facts["baseline"] is None
    assert [p["kind"] for p in facts["problems"]] == ["baseline_invalid", "tool_missing"]
    assert schema_errors("nvlink_facts", facts) == []


@pytest.mark.parametrize("check_mode", [True])
def test_check_mode_reads_the_same(tmp_path, check_mode):
    state = tmp_path / "n"
    env = {"GPUFLEET_SIM_SCENARIO": "hgx_nvlink_down", "GPUFLEET_SIM_STATE": str(state), "GPUFLEET_SIM_NODE": "n"}
    run_module("gpu_facts", {}, env=env, path_prepend=[SIM_BIN])
    result = run_module("nvlink_facts", {"sysfs_root": str(state / "sysfs"), "procfs_root": str(state / "procfs")},
                        env=env, path_prepend=[SIM_BIN], check_mode=check_mode)
    assert result["changed"] is False and result["ansible_facts"]["gpufleet_nvlink"]["gpus"][5]["nvlink_links_up"] == 17
