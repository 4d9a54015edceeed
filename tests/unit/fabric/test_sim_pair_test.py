"""The simulator's two-node pair test: the sim's mpirun across two hosts runs all_reduce_perf in its real two-node
format, with the bus bandwidth the simulated fabric gives the pair, or NCCL's error when a port flaps; the collection's
one nccl-tests parser reads it."""

import json
import os
import subprocess
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils.nccl_tests_output import parse_nccl_tests
from gpufleet_sim.ib_fabric import Fabric

SIM = Path(__file__).resolve().parents[3] / "sim"
FABRIC = {"seed": 7, "leaves": {"leafA": ["a1", "a2"], "leafB": ["b1", "b2"]},
          "faults": [{"kind": "slow_nic", "node": "a2", "rail": 3, "factor": 0.5},
                     {"kind": "flapping_port", "node": "b2", "rail": 0, "p_down": 1.0}]}


def pair_test(tmp_path, a, b, test_id="t1"):
    spec = tmp_path / "fabric.json"
    spec.write_text(json.dumps(FABRIC))
    env = dict(os.environ, GPUFLEET_SIM_FABRIC=str(spec), GPUFLEET_SIM_FABRIC_TEST=test_id, GPUFLEET_SIM_NODE=a,
               GPUFLEET_SIM_SCENARIO=str(SIM / "scenarios" / "healthy_h100.json"),
               GPUFLEET_SIM_STATE=str(tmp_path / a), GPUFLEET_SIM_TIME_SCALE="0.0001")
    proc = subprocess.run([str(SIM / "bin" / "mpirun"), "-np", "16", "-H", "%s:8,%s:8" % (a, b),
                           str(SIM / "bin" / "all_reduce_perf"), "-b", "1M", "-e", "1G", "-f", "4", "-g", "1"],
                          capture_output=True, text=True, env=env, timeout=60)
    return proc.returncode, parse_nccl_tests(proc.stdout + proc.stderr)


def test_a_healthy_pair_reports_ranks_on_both_hosts_and_the_fabric_s_figure(tmp_path):
    rc, parsed = pair_test(tmp_path, "a1", "b1")
    assert rc == 0 and parsed["failures"] == []
    assert [g["host"] for g in parsed["gpus"]] == ["a1"] * 8 + ["b1"] * 8
    expected = Fabric(FABRIC).pair("a1", "b1", "t1")["busbw_gbps"]
    assert abs(parsed["peak_busbw_gbps"] - expected) / expected < 0.02


def test_a_slow_nic_halves_the_pair_s_bus_bandwidth(tmp_path):
    rc, parsed = pair_test(tmp_path, "a2", "b1")
    assert rc == 0 and parsed["peak_busbw_gbps"] < 0.6 * Fabric(FABRIC).healthy_gbps()


def test_a_flapping_port_fails_the_test_with_nccl_s_remote_error(tmp_path):
    rc, parsed = pair_test(tmp_path, "a1", "b2")
    assert rc == 1
    assert parsed["failures"][0] == ("a1: Test NCCL failure common.cu:1006 'remote process exited or there was a "
                                     "network error'")
