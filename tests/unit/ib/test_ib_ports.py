"""InfiniBand single-node side: the ibstat parser (both layouts), the sysfs port readers, and the port judge (down,
rate or width below expected, counters rising under load), on fixtures in the tools' exact formats."""

from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import ib_sysfs, judge_ib
from ansible_collections.kentino.gpufleet.plugins.module_utils.ibstat import parse_ibstat
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "ib"


def ports(name):
    return [(p["hca"], p["port"], p["state"], p["phys_state"], p["rate_gbps"], p["rate_note"])
            for p in parse_ibstat((FIX / name).read_text())["ports"]]


def test_ibstat_every_hca_layout():
    parsed = parse_ibstat((FIX / "ibstat_two_hcas.txt").read_text())
    assert ports("ibstat_two_hcas.txt") == [("mlx5_0", 1, "Active", "LinkUp", 400.0, None),
                                            ("mlx5_1", 1, "Down", "Polling", 10.0, None)]
    assert parsed["hcas"][0]["firmware"] == "28.39.1002" and parsed["unparsed"]["count"] == 0
    assert parsed["ports"][0]["link_layer"] == "InfiniBand"


def test_ibstat_one_port_layout_fdr10_and_sdr_rates():
    assert ports("ibstat_one_port.txt") == [("mlx5_0", 1, "Active", "LinkUp", 200.0, None)]
    assert ports("ibstat_fdr10_two_ports.txt") == [("mlx4_0", 1, "Active", "LinkUp", 40.0, "FDR10"),
                                                   ("mlx4_0", 2, "Down", "Disabled", 2.5, None)]


def test_ibstat_without_an_hca_is_a_problem_and_garbage_is_unparsed():
    parsed = parse_ibstat((FIX / "ibstat_no_hca.txt").read_text())
    assert parsed["ports"] == [] and parsed["problems"][0]["kind"] == "tool_error"
    parsed = parse_ibstat("Port 1:\nState: Active\n\x00garbage\nRate: fast\n")
    assert parsed["ports"] == [] and parsed["unparsed"]["count"] == 4


@pytest.mark.parametrize("text, value", [
    ("400 Gb/sec (4X NDR)\n", {"rate_gbps": 400.0, "width": 4, "speed": "NDR"}),
    ("200 Gb/sec (2X NDR)", {"rate_gbps": 200.0, "width": 2, "speed": "NDR"}),
    ("2.5 Gb/sec (1X)", {"rate_gbps": 2.5, "width": 1, "speed": None}),
    ("2.5 Gb/sec (1X SDR)", {"rate_gbps": 2.5, "width": 1, "speed": "SDR"}),
    ("40 Gb/sec (4X FDR10)", {"rate_gbps": 40.0, "width": 4, "speed": "FDR10"}),
    ("fast", None), ("", None), ("400 Gb/sec", None),
])
def test_sysfs_rate(text, value):
    assert ib_sysfs.parse_rate(text) == value


def test_sysfs_state_and_counters():
    assert ib_sysfs.parse_state("4: ACTIVE\n") == (4, "ACTIVE")
    assert ib_sysfs.parse_state("7: Phy Test") == (7, "Phy Test")
    assert ib_sysfs.parse_state("ACTIVE") is None
    assert ib_sysfs.parse_counter("65535\n") == 65535 and ib_sysfs.parse_counter("N/A (no PMA)\n") is None


def test_read_ports_reads_the_tree_and_a_missing_root_is_a_problem(tmp_path):
    read = ib_sysfs.read_ports(str(FIX / "sysfs" / "degraded"))
    assert [(p["hca"], p["port"], p["state_name"], p["phys_state"], p["rate_gbps"], p["width"]) for p in read["ports"]] \
        == [("mlx5_0", 1, "ACTIVE", "LinkUp", 200.0, 2), ("mlx5_1", 1, "DOWN", "Polling", 10.0, 4)]
    assert read["ports"][1]["counters"]["link_downed"] == 4
    old = ib_sysfs.read_ports(str(FIX / "sysfs" / "no_pma_old_kernel"))["ports"][0]
    assert old["speed"] is None and set(old["counters"].values()) == {None}
    missing = ib_sysfs.read_ports(str(tmp_path / "none"))
    assert missing["ports"] == [] and missing["problems"][0]["kind"] == "no_infiniband"


T = complete({"gpufleet_ib_expected_rate_gbps": 400, "gpufleet_ib_expected_width": 4})


def judged(after, before=None, t=T):
    result = {"ports": ib_sysfs.read_ports(str(FIX / "sysfs" / after))["ports"], "problems": []}
    if before:
        result["baseline"] = dict(("%s/%s" % (p["hca"], p["port"]), p["counters"])
                                  for p in ib_sysfs.read_ports(str(FIX / "sysfs" / before))["ports"])
    return [(f["code"], f["severity"], f["message"]) for f in judge_ib.judge(result, t, "node07")]


def test_healthy_ports_pass():
    assert judged("ndr_ok", "ndr_ok") == []


def test_a_port_down_and_a_port_trained_at_2x_fail():
    assert judged("degraded") == [
        ("IB_RATE_LOW", "fail", "node07: mlx5_0 port 1 runs at 200 Gb/s, below the expected 400 Gb/s"),
        ("IB_WIDTH_LOW", "fail", "node07: mlx5_0 port 1 trained at 2X, below the expected 4X"),
        ("IB_PORT_DOWN", "fail", "node07: mlx5_1 port 1 is DOWN / Polling, not ACTIVE / LinkUp")]
    assert judged("degraded", t=complete({}))[0][0] == "IB_PORT_DOWN", "unset expectations are not checked"


def test_counters_rising_under_load_are_a_flap_and_a_warning():
    assert judged("ndr_after_load", "ndr_ok") == [
        ("IB_LINK_FLAPPED", "fail", "node07: mlx5_1 port 1 went down 1 times during the load"),
        ("IB_ERRORS_RISING", "warn", "node07: mlx5_1 port 1 error counters rose under load: link_error_recovery +2, "
                                     "port_rcv_errors +57, symbol_error +1843")]
    tolerant = dict(T, gpufleet_ib_error_rise_max=100000)
    assert [c for c, _, _ in judged("ndr_after_load", "ndr_ok", tolerant)] == ["IB_LINK_FLAPPED"]


def test_no_port_is_an_error_not_a_pass(tmp_path):
    result = {"ports": [], "problems": ib_sysfs.read_ports(str(tmp_path))["problems"]}
    assert [f["code"] for f in judge_ib.judge(result, T, "node07")] == ["IB_NO_PORTS"]
