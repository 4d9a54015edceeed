"""ib_write_bw per rail: the parser on the tool's formats (Gb/sec, MB/sec with two sizes, no HCA, a server that does
not answer), the real binary without an HCA and the simulator's stand-in saying the same, the stand-in's per-rail
figures between two simulated nodes, and the judge's per-rail findings against gpufleet_fabric_rail_write_gbps."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_fabric
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete
from ansible_collections.kentino.gpufleet.plugins.module_utils.perftest_output import parse_ib_write_bw, rail_result

REPO = Path(__file__).resolve().parents[3]
FIX = REPO / "tests" / "fixtures" / "ib" / "perftest"
STANDIN = REPO / "sim" / "bin" / "ib_write_bw"


def fixture(name):
    return (FIX / name).read_text()


def test_gbits_output_gives_the_rail_s_average_and_its_device():
    parsed = parse_ib_write_bw(fixture("ndr_gbits.txt"))
    assert (parsed["device"], parsed["link_type"], parsed["unit"], parsed["average_gbps"]) == (
        "mlx5_3", "IB", "Gb/sec", 392.35)
    assert parsed["rows"] == [{"bytes": 1048576, "iterations": 5000, "peak_gbps": 392.41, "average_gbps": 392.35,
                               "msg_rate_mpps": 0.046773}]
    assert parsed["problems"] == [] and parsed["unparsed"]["count"] == 0


def test_mbytes_output_is_converted_and_the_largest_size_is_the_figure():
    parsed = parse_ib_write_bw(fixture("hdr_mbytes_two_sizes.txt"))
    assert parsed["unit"] == "MB/sec" and [r["bytes"] for r in parsed["rows"]] == [65536, 1048576]
    assert parsed["average_gbps"] == 196.28  # 23398.40 x 2^20 bytes x 8 bits


def test_no_hca_and_an_unreachable_server_are_problems_in_the_tool_s_words():
    assert rail_result("mlx5_0", 1, fixture("no_hca.stdout"), fixture("no_hca.stderr")) == {
        "hca": "mlx5_0", "gbps": None, "error": "Did not detect devices; Unable to find the Infiniband/RoCE device",
        "evidence": ["mlx5_0: Did not detect devices",
                                              "mlx5_0: Unable to find the Infiniband/RoCE device"]}
    failed = rail_result("mlx5_5", 1, fixture("connect_failed.stdout"), fixture("connect_failed.stderr"))
    assert failed["gbps"] is None and failed["error"].startswith("Couldn't connect to fab-node07:18515")
    garbage = parse_ib_write_bw("\x00\x01 nonsense\n 12 34\n")
    assert garbage["rows"] == [] and garbage["unparsed"]["count"] == 2


def _run(tool, *args, env=None):
    proc = subprocess.run([str(tool)] + list(args), capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, **(env or {})))
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.skipif(shutil.which("ib_write_bw") is None, reason="perftest not installed (hack/system-deps)")
def test_the_real_binary_without_an_hca_and_the_stand_in_say_the_same(tmp_path):
    real = _run(shutil.which("ib_write_bw"), "-d", "mlx5_0", "--report_gbits", "-F", "10.0.0.2")
    stand_in = _run(STANDIN, "-d", "mlx5_0", "--report_gbits", "-F", "10.0.0.2",
                    env={"GPUFLEET_SIM_STATE": str(tmp_path / "n1"), "GPUFLEET_SIM_NODE": "n1",
                         "GPUFLEET_SIM_SCENARIO": "healthy_h100", "GPUFLEET_SIM_FABRIC": ""})
    assert real == stand_in == (1, "", fixture("no_hca.stderr"))


def test_the_stand_in_measures_each_rail_between_two_simulated_nodes(tmp_path):
    fabric = tmp_path / "fabric.json"
    fabric.write_text('{"seed": 1, "noise": 0.0, "leaves": {"L1": ["n1", "n2"], "L2": ["n3"]}, "down": ["n3"], '
                      '"faults": [{"kind": "slow_nic", "node": "n2", "rail": 3, "factor": 0.5}]}')
    env = {"GPUFLEET_SIM_STATE": str(tmp_path / "n1"), "GPUFLEET_SIM_NODE": "n1",
           "GPUFLEET_SIM_SCENARIO": "healthy_h100", "GPUFLEET_SIM_FABRIC": str(fabric)}
    rails = [rail_result("mlx5_%d" % r, *_run(STANDIN, "-d", "mlx5_%d" % r, "--report_gbits", "n2", env=env))
             for r in range(8)]
    figures = [r["gbps"] for r in rails]
    assert all(r["error"] is None for r in rails)
    assert figures == [392.0] * 3 + [196.0] + [392.0] * 4, "n2's rail 3 trained at 2X"
    assert rails[3]["evidence"] == ["mlx5_3: 65536 bytes x 5000: 196.00 Gb/s average"]
    unreachable = rail_result("mlx5_0", *_run(STANDIN, "-d", "mlx5_0", "n3", env=env))
    assert unreachable["error"] == "Couldn't connect to n3:18515; Unable to init the socket connection"
    on_its_port = rail_result("mlx5_1", *_run(STANDIN, "-d", "mlx5_1", "-p", "18516", "n3", env=env))
    assert on_its_port["error"] == "Couldn't connect to n3:18516; Unable to init the socket connection"
    unknown = rail_result("mlx5_9", *_run(STANDIN, "-d", "mlx5_9", "n2", env=env))
    assert unknown["error"] == "IB device mlx5_9 not found; Unable to find the Infiniband/RoCE device"


T = complete({"gpufleet_fabric_pair_busbw_gbps": 100.0, "gpufleet_fabric_rail_write_gbps": 390.0})


def _pair(a, b, gbps, rails, rnd=1):
    return {"nodes": [a, b], "round": rnd, "busbw_gbps": gbps, "error": None, "evidence": [], "rails": rails}


def test_a_slow_rail_is_named_on_the_accused_node_and_an_errored_rail_accuses_nobody():
    rail = [{"hca": "mlx5_%d" % r, "gbps": 391.0, "error": None} for r in range(2)]
    slow = [{"hca": "mlx5_0", "gbps": 391.0, "error": None}, {"hca": "mlx5_1", "gbps": 196.0, "error": None}]
    result = {"leaves": {}, "pairs": [_pair("n1", "n2", 50.0, slow), _pair("n3", "n4", 99.0, rail),
                                      _pair("n5", "n6", 99.0, [{"hca": "mlx5_0", "gbps": None, "error": "Couldn't "
                                                                "connect to n6:18515"}]),
                                      _pair("n1", "n3", 49.0, slow, 2), _pair("n2", "n4", 99.0, rail, 2)]}
    found = [(subjects, f["code"], f["message"]) for subjects, f in judge_fabric.attributed(result, T)]
    assert (["n1"], "FABRIC_RAIL_SLOW", "pair n1 <-> n2 rail mlx5_1: 196.0 Gb/s, below 331.5 Gb/s "
            "(gpufleet_fabric_rail_write_gbps 390 less 15%)") in found
    assert [s for s, code, _m in found if code == "FABRIC_RAIL_ERROR"] == [[]], "n5 and n6 passed the pair test"
    assert [c for _s, c, _m in found].count("FABRIC_RAIL_SLOW") == 2
    unset = complete({"gpufleet_fabric_pair_busbw_gbps": 100.0})
    assert "FABRIC_RAIL_SLOW" not in [f["code"] for f in judge_fabric.judge(result, unset)]
