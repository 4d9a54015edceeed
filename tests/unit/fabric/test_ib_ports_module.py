"""kentino.gpufleet.ib_ports as Ansible runs it: one read before the load, one after with the first as baseline (joined
by HCA and port, never by position), a node without InfiniBand skipped with the reason; the simulator's sysfs tree
(rails from the fabric, counters rising with the load) read by the same module; the report's view of the result."""

from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_ib
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import evaluate_node
from gpufleet_sim.ib_fabric import Fabric, port_files, write_ports
from helpers.module_runner import run_module

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "ib" / "sysfs"
T = {"gpufleet_ib_expected_rate_gbps": 400, "gpufleet_ib_expected_width": 4}


def test_before_and_after_the_load_the_rise_is_judged_per_port(contract):
    before = run_module("ib_ports", {"root": str(FIX / "ndr_ok"), "thresholds": T})
    assert before["verdict"] == "pass" and [p["hca"] for p in before["ports"]] == ["mlx5_0", "mlx5_1"]
    # The baseline in another order: the ports are joined by HCA and port number.
    after = run_module("ib_ports", {"root": str(FIX / "ndr_after_load"), "baseline": before["ports"][::-1],
                                    "thresholds": T})
    findings = contract("ib_ports", after, judge_ib.judge, T)
    assert [(f["code"], f["message"].split(": ", 1)[1]) for f in findings] == [
        ("IB_LINK_FLAPPED", "mlx5_1 port 1 went down 1 times during the load"),
        ("IB_ERRORS_RISING", "mlx5_1 port 1 error counters rose under load: link_error_recovery +2, port_rcv_errors "
                             "+57, symbol_error +1843")]
    assert after["verdict"] == "fail"


def test_a_node_without_infiniband_is_skipped_with_the_reason_never_a_pass(tmp_path, contract):
    for root in (tmp_path / "absent", tmp_path):
        result = run_module("ib_ports", {"root": str(root)})
        assert result["verdict"] == "skipped" and result["not_run"].startswith("no InfiniBand on this node: ")
        assert contract("ib_ports", result, judge_ib.judge, {}) == []


def test_a_port_gone_after_the_load_fails_and_a_malformed_baseline_is_refused(tmp_path, contract):
    write_ports(str(tmp_path / "two"), Fabric({"rails": 2, "leaves": {"L": ["n1"]}}), "n1", 0)
    write_ports(str(tmp_path / "one"), Fabric({"rails": 1, "leaves": {"L": ["n1"]}}), "n1", 600)
    before = run_module("ib_ports", {"root": str(tmp_path / "two")})
    after = run_module("ib_ports", {"root": str(tmp_path / "one"), "baseline": before["ports"]})
    assert [f["code"] for f in contract("ib_ports", after, judge_ib.judge, {})] == ["IB_PORT_DOWN"]
    assert "port mlx5_1/1 was there before the load and is gone after it" in after["reasons"][0]
    bad = run_module("ib_ports", {"root": str(FIX / "ndr_ok"), "baseline": [{"hca": "../x", "port": 1, "counters": {}}]})
    assert bad["failed"] and "baseline: entry 0 is not a port read" in bad["msg"]
    relative = run_module("ib_ports", {"root": "sys/class/infiniband"})
    assert relative["failed"] and "root: 'sys/class/infiniband' is not an absolute path" in relative["msg"]


def test_the_simulated_ports_follow_the_fabric_and_rise_with_the_load(tmp_path):
    fabric = Fabric({"leaves": {"L": ["n1", "n2"]}, "faults": [
        {"kind": "slow_nic", "node": "n1", "rail": 2, "factor": 0.5},
        {"kind": "bad_cable", "node": "n1", "rail": 5, "factor": 0.7},
        {"kind": "flapping_port", "node": "n2", "rail": 0, "p_down": 0.5}]})
    assert port_files(fabric, "elsewhere", 600) == {}, "a node on no leaf has no InfiniBand"
    files = port_files(fabric, "n1", 0)
    assert len([k for k in files if k.endswith("/rate")]) == 8
    assert files["mlx5_2/ports/1/rate"] == "200 Gb/sec (2X NDR)\n" and files["mlx5_0/ports/1/rate"] == "400 Gb/sec (4X NDR)\n"
    write_ports(str(tmp_path / "before"), fabric, "n1", 0)
    write_ports(str(tmp_path / "after"), fabric, "n1", 600)
    before = run_module("ib_ports", {"root": str(tmp_path / "before"), "thresholds": T})
    after = run_module("ib_ports", {"root": str(tmp_path / "after"), "baseline": before["ports"], "thresholds": T})
    assert [r.split(": ", 1)[1] for r in after["reasons"]] == [
        "mlx5_2 port 1 runs at 200 Gb/s, below the expected 400 Gb/s", "mlx5_2 port 1 trained at 2X, below the expected 4X",
        "mlx5_5 port 1 error counters rose under load: excessive_buffer_overrun_errors +1, port_rcv_errors +18, "
        "symbol_error +180"]
    write_ports(str(tmp_path / "n2"), fabric, "n2", 600)
    flapped = run_module("ib_ports", {"root": str(tmp_path / "n2"), "baseline": before["ports"]})
    assert [f.split(": ", 1)[1] for f in flapped["reasons"]][0] == "mlx5_0 port 1 went down 5 times during the load"


def test_the_report_shows_the_findings_on_the_node_and_a_skip_with_its_reason():
    before = run_module("ib_ports", {"root": str(FIX / "ndr_ok")})
    after = run_module("ib_ports", {"root": str(FIX / "ndr_after_load"), "baseline": before["ports"]})
    node = evaluate_node("node07", {"gpufleet_result_ib_ports": after})
    assert node["checks"]["ib_ports"]["verdict"] == "fail"
    assert [(f["code"], f["check"]) for f in node["findings"] if f["check"] == "ib_ports"] == [
        ("IB_LINK_FLAPPED", "ib_ports"), ("IB_ERRORS_RISING", "ib_ports")]
    assert node["findings"][0]["message"].startswith("node07: mlx5_1 port 1")
    skipped = evaluate_node("node08", {"gpufleet_result_ib_ports": {"skipped": True, "skip_reason":
                                                                     "disabled: gpufleet_burn_enabled is false"}})
    assert skipped["checks"]["ib_ports"]["verdict"] == "skipped"
    assert skipped["checks"]["ib_ports"]["reasons"] == ["not run: disabled: gpufleet_burn_enabled is false"]
