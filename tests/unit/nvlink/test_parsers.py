"""The NVLink, topology, fabric, systemctl and dpkg-query parsers against every fixture variant, and junk."""

from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import fabric_manager as fm
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi import parse_q
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_nvlink import (
    fabric_state_name,
    link_totals,
    parse_nvlink_errors,
    parse_nvlink_status,
    q_fabric,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_topo import cell_kind, parse_topo_matrix

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "nvlink"


def read(name):
    return (FIX / name).read_text()


def test_status_all_up():
    out = parse_nvlink_status(read("status_h100_8gpu.txt"))
    assert len(out["gpus"]) == 8 and not out["problems"] and out["unparsed"]["count"] == 0
    g = out["gpus"][5]
    assert g["index"] == 5 and g["uuid"] == "GPU-51b93026-6d5b-03bd-3a71-f85b47a61bde"
    assert g["name"] == "NVIDIA H100 80GB HBM3"
    assert [link["link"] for link in g["links"]] == list(range(18))
    assert all(link["up"] and link["speed_gbps"] == 26.562 for link in g["links"])


def test_status_one_link_down_and_one_slow():
    down = parse_nvlink_status(read("status_h100_link_down.txt"))["gpus"][3]["links"][11]
    assert down == {"link": 11, "up": False, "speed_gbps": None, "line": "Link 11: <inactive>"}
    slow = parse_nvlink_status(read("status_h100_link_slow.txt"))["gpus"][1]["links"][4]
    assert slow["up"] and slow["speed_gbps"] == 13.281


def test_status_all_inactive_message_belongs_to_its_gpu():
    out = parse_nvlink_status(read("status_b200_all_inactive.txt"))
    assert [g["all_inactive"] for g in out["gpus"]] == [False, True]
    assert out["gpus"][1]["links"] == [] and not out["problems"]
    assert out["gpus"][0]["links"][0]["speed_gbps"] == 53.125


@pytest.mark.parametrize("name,gpus", [("status_l40s_no_nvlink.txt", 4), ("status_empty.txt", 0)])
def test_status_without_nvlink(name, gpus):
    out = parse_nvlink_status(read(name))
    assert len(out["gpus"]) == gpus and all(g["links"] == [] and not g["all_inactive"] for g in out["gpus"])
    assert not out["problems"] and out["unparsed"]["count"] == 0


def test_status_integer_speed_and_header_without_uuid():
    assert parse_nvlink_status(read("status_a100_25.txt"))["gpus"][1]["links"][11]["speed_gbps"] == 25.0
    g = parse_nvlink_status(read("status_gb300_no_uuid.txt"))["gpus"][0]
    assert g["uuid"] is None and g["name"] == "NVIDIA GB300" and len(g["links"]) == 18


def test_status_lost_gpu_is_a_problem_between_blocks():
    out = parse_nvlink_status(read("status_lost_gpu.txt"))
    assert [g["index"] for g in out["gpus"]] == [0, 2]
    assert [(p["kind"], p["pci"]) for p in out["problems"]] == [("lost", "0000:2a:00")]
    assert len(out["gpus"][0]["links"]) == 18  # the error line does not end GPU 0's block early


def test_status_driver_error_and_junk_are_problems_or_unparsed_never_gpus():
    out = parse_nvlink_status(read("status_garbage.txt"))
    assert out["gpus"] == [] and out["problems"][0]["kind"] == "tool_error"
    junk = parse_nvlink_status("Link 0: 26 GB/s\n\x00\xff binary\nGPU x: nope\n")
    assert junk["gpus"] == [] and junk["unparsed"]["count"] == 3
    for bad in (None, b"\xff\xfe", 42, "GPU 0: X (UUID: GPU-1)\n\t Link 0: fast\n"):
        assert isinstance(parse_nvlink_status(bad), dict)


def test_errors_counters_per_link():
    out = parse_nvlink_errors(read("errors_h100.txt"))
    assert len(out["gpus"]) == 2 and not out["problems"] and out["unparsed"]["count"] == 0
    link = out["gpus"][1]["links"][7]
    assert link == {"replay_errors": 12, "recovery_errors": 0, "crc_errors": 4711}
    assert link_totals(link) == {"crc": 4711, "replay": 12, "recovery": 0}
    assert len(out["gpus"][0]["links"]) == 18


def test_errors_geforce_split_crc_counters_add_up():
    out = parse_nvlink_errors(read("errors_geforce_flit_data.txt"))
    link0 = out["gpus"][0]["links"][0]
    assert link0 == {"replay_errors": 0, "recovery_errors": 0, "crc_flit_errors": 5, "crc_data_errors": 2}
    assert link_totals(link0)["crc"] == 7
    assert link_totals(out["gpus"][0]["links"][1]) == {"crc": 0, "replay": 12, "recovery": 0}


def test_errors_na_unknown_error_and_new_counters():
    out = parse_nvlink_errors(read("errors_na_and_unknown.txt"))
    link = out["gpus"][0]["links"][0]
    assert link == {"replay_errors": None, "recovery_errors": None, "crc_errors": 3, "effective_errors": 9}
    assert [p["kind"] for p in out["problems"]] == ["unreadable_field"]
    assert out["unparsed"]["count"] == 1
    assert link_totals(link) == {"crc": 3, "replay": None, "recovery": None}
    assert parse_nvlink_errors(read("errors_gb300_no_uuid.txt"))["gpus"][0]["links"][0]["crc_errors"] == 0


@pytest.mark.parametrize("cell", ["-4", "1e3", "12abc", "0x10"])
def test_errors_counter_read_whole_a_negative_or_partial_number_is_unreadable(cell):
    out = parse_nvlink_errors("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n\t Link 0: CRC Errors: %s\n" % cell)
    assert out["gpus"][0]["links"][0] == {"crc_errors": None}
    assert [(p["kind"], p["message"]) for p in out["problems"]] == [("unreadable_field",
                                                                     "GPU 0 link 0 crc_errors: %s" % cell)]


def test_topo_hgx_with_nics_and_ansi():
    out = parse_topo_matrix(read("topo_h100_nics_ansi.txt"))
    assert out["devices"] == ["GPU%d" % i for i in range(8)] + ["NIC0", "NIC1"]
    assert out["gpus"] == list(range(8)) and len(out["pairs"]) == 28
    assert all(p["code"] == "NV18" and p["nvlinks"] == 18 and p["kind"] == "nvlink" for p in out["pairs"])
    assert out["matrix"]["GPU5"]["NIC1"] == "PIX" and out["matrix"]["NIC0"]["GPU0"] == "PIX"
    assert out["affinity"][5] == {"cpu": "48-95,144-191", "numa": "1", "gpu_numa_id": "N/A"}
    assert out["nics"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert out["interconnect"] == "nvlink" and not out["problems"] and out["unparsed"]["count"] == 0


def test_topo_pcie_bridge_pairs_old_columns_and_spaces():
    pcie = parse_topo_matrix(read("topo_pcie_plain.txt"))
    assert pcie["interconnect"] == "pcie" and {p["code"] for p in pcie["pairs"]} == {"NODE"}
    assert pcie["affinity"][0] == {"cpu": "0-119", "numa": "0", "gpu_numa_id": "N/A"}
    pairs = parse_topo_matrix(read("topo_nvlink_bridge_pairs.txt"))
    assert pairs["interconnect"] == "mixed"
    assert [(p["a"], p["b"], p["code"]) for p in pairs["pairs"]] == [(0, 1, "NV4"), (0, 2, "NODE"), (1, 2, "NODE")]
    old = parse_topo_matrix(read("topo_old_mlx_columns.txt"))
    assert old["devices"] == ["GPU0", "GPU1", "mlx5_0"] and old["pairs"][0]["nvlinks"] == 2
    spaces = parse_topo_matrix(read("topo_spaces_pasted.txt"))
    assert spaces["gpus"] == [0, 1, 2, 3] and spaces["matrix"]["GPU2"]["NIC0"] == "SYS"
    assert all(p["code"] == "NV6" for p in spaces["pairs"])


def test_topo_broken_inputs_are_problems():
    assert parse_topo_matrix(read("topo_header_only.txt"))["problems"][0]["kind"] == "unparsable_output"
    unknown = parse_topo_matrix(read("topo_unknown_code.txt"))
    assert unknown["pairs"][0]["kind"] == "unknown" and unknown["problems"][0]["kind"] == "unknown_code"
    for bad in ("", None, b"\x1b[4m", "no matrix here\n", 17):
        out = parse_topo_matrix(bad)
        assert out["gpus"] == [] and out["pairs"] == []
    assert cell_kind("SOC") == ("pcie", None) and cell_kind(" X ") == ("self", None)


@pytest.mark.parametrize("name,expected", [
    ("q_fabric_h100_completed.txt", ("completed", "Success", "0", "Full", None)),
    ("q_fabric_old_driver.txt", ("completed", "Success", None, None, None)),
    ("q_fabric_in_progress.txt", ("in_progress", None, None, None, None)),
    ("q_fabric_insufficient_resources.txt", ("completed", "Insufficient Resources", "0", "Degraded", "Unhealthy")),
    ("q_fabric_health_limited.txt", ("completed", "Success", "0", "Degraded", "Limited Capacity")),
    ("q_fabric_pcie_na.txt", (None, None, None, None, None)),
    ("q_fabric_gb200_not_supported.txt", (None, "Success", None, None, None)),
])
def test_fabric_section_of_q(name, expected):
    gpus = parse_q(read(name))["gpus"]
    fabric = q_fabric(gpus[0]["entries"])
    assert (fabric["state"], fabric["status"], fabric["clique_id"], fabric["health_bandwidth"],
            fabric["health_summary"]) == expected
    assert fabric["raw"]["state"]  # the raw value is kept as evidence


def test_fabric_health_conditions_of_q():
    """The Health block as current drivers print it (Summary, Bandwidth and the route and configuration rows): each
    condition read, healthy and unhealthy GPUs told apart."""
    gpus = parse_q(read("q_fabric_health_unhealthy.txt"))["gpus"]
    healthy, unhealthy = (q_fabric(g["entries"]) for g in gpus)
    assert (healthy["health_summary"], healthy["health_route_unhealthy"], healthy["health_incorrect_configuration"]) \
        == ("Healthy", "False", "None")
    assert (unhealthy["state"], unhealthy["status"], unhealthy["health_summary"]) == ("completed", "Success",
                                                                                      "Unhealthy")
    assert (unhealthy["health_route_recovery"], unhealthy["health_route_unhealthy"],
            unhealthy["health_access_timeout_recovery"], unhealthy["health_partition_assigned"]) == \
        ("False", "True", "False", None)
    assert unhealthy["raw"]["health_route_unhealthy"] == "True"
    older = q_fabric(parse_q(read("q_fabric_health_summary_only.txt"))["gpus"][0]["entries"])
    assert (older["health_summary"], older["health_bandwidth"], older["health_route_unhealthy"]) == \
        ("Unhealthy", "Full", None)


def test_fabric_state_names():
    assert fabric_state_name("In Progress") == "in_progress" and fabric_state_name("Not Started") == "not_started"
    assert fabric_state_name("[N/A]") is None and fabric_state_name(None) is None and q_fabric(None)["state"] is None


def test_systemctl_show():
    assert fm.parse_systemctl_show(read("systemctl_active.txt"))["ActiveState"] == "active"
    stopped = fm.parse_systemctl_show(read("systemctl_stopped_disabled.txt"))
    assert (stopped["ActiveState"], stopped["UnitFileState"]) == ("inactive", "disabled")
    assert fm.parse_systemctl_show(read("systemctl_not_found.txt"))["UnitFileState"] == ""
    assert fm.parse_systemctl_show(None) == {} and fm.parse_systemctl_show("garbage\n=x\n") == {}


def test_dpkg_query_and_versions():
    pkgs = fm.parse_dpkg_query(read("dpkg_query_cuda_repo_570.txt"))
    assert [(p["package"], p["installed"], p["held"]) for p in pkgs] == [
        ("nvidia-fabricmanager-570", True, True), ("libnvidia-nscq-570", True, True),
        ("nvidia-fabricmanager-dev-570", False, False)]
    fmp, nscq = fm.installed_fabric_manager(pkgs)
    assert fmp["package"] == "nvidia-fabricmanager-570" and nscq["version"] == "570.172.08-1"
    ubuntu = fm.installed_fabric_manager(fm.parse_dpkg_query(read("dpkg_query_ubuntu_580.txt")))[0]
    assert fm.upstream_version(ubuntu["version"]) == "580.95.05"
    assert fm.installed_fabric_manager(fm.parse_dpkg_query(read("dpkg_query_removed.txt"))) == (None, None)
    assert fm.upstream_version("1:4.2.3-1") == "4.2.3" and fm.upstream_version(None) is None
    assert fm.branch_of("570.172.08") == 570 and fm.branch_of("garbage") is None
    assert fm.parse_dpkg_query(None) == [] and fm.parse_dpkg_query("one field only\n") == []
