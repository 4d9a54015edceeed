"""The simulator's two-node pair test: the sim's mpirun across two hosts runs all_reduce_perf in its real two-node
format, with the bus bandwidth the simulated fabric gives the pair, or NCCL's error when a port flaps; the collection's
one nccl-tests parser reads it."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.nccl_tests_output import parse_nccl_tests
from gpufleet_sim.ib_fabric import Fabric

SIM = Path(__file__).resolve().parents[3] / "sim"
FABRIC = {"seed": 7, "leaves": {"leafA": ["a1", "a2"], "leafB": ["b1", "b2"]},
          "faults": [{"kind": "slow_nic", "node": "a2", "rail": 3, "factor": 0.5},
                     {"kind": "flapping_port", "node": "b2", "rail": 0, "p_down": 1.0}],
          "down": ["c1"], "hung": ["c2"]}
FABRIC["leaves"]["leafC"] = ["c1", "c2"]


def pair_test(tmp_path, a, b, test_id="t1", timeout=60):
    spec = tmp_path / "fabric.json"
    spec.write_text(json.dumps(FABRIC))
    env = dict(os.environ, GPUFLEET_SIM_FABRIC=str(spec), GPUFLEET_SIM_FABRIC_TEST=test_id, GPUFLEET_SIM_NODE=a,
               GPUFLEET_SIM_SCENARIO=str(SIM / "scenarios" / "healthy_h100.json"),
               GPUFLEET_SIM_STATE=str(tmp_path / a), GPUFLEET_SIM_TIME_SCALE="0.0001")
    proc = subprocess.run([str(SIM / "bin" / "mpirun"), "-np", "16", "-H", "%s:8,%s:8" % (a, b),
                           str(SIM / "bin" / "all_reduce_perf"), "-b", "1M", "-e", "1G", "-f", "4", "-g", "1"],
                          capture_output=True, text=True, env=env, timeout=timeout)
    return proc.returncode, parse_nccl_tests(proc.stdout + proc.stderr), proc.stderr


def test_a_healthy_pair_reports_ranks_on_both_hosts_and_the_fabric_s_figure(tmp_path):
    rc, parsed, stderr = pair_test(tmp_path, "a1", "b1")
    assert rc == 0 and parsed["failures"] == []
    assert [g["host"] for g in parsed["gpus"]] == ["a1"] * 8 + ["b1"] * 8
    expected = Fabric(FABRIC).pair("a1", "b1", "t1")["busbw_gbps"]
    assert abs(parsed["peak_busbw_gbps"] - expected) / expected < 0.02


def test_a_slow_nic_halves_the_pair_s_bus_bandwidth(tmp_path):
    rc, parsed, stderr = pair_test(tmp_path, "a2", "b1")
    assert rc == 0 and parsed["peak_busbw_gbps"] < 0.6 * Fabric(FABRIC).healthy_gbps()


def test_a_flapping_port_fails_the_test_with_nccl_s_remote_error(tmp_path):
    rc, parsed, stderr = pair_test(tmp_path, "a1", "b2")
    assert rc == 1
    assert parsed["failures"][0] == ("a1: Test NCCL failure common.cu:1006 'remote process exited or there was a "
                                     "network error'")


def test_a_partner_ssh_cannot_reach_fails_in_mpirun_with_open_mpi_s_daemon_error(tmp_path):
    rc, parsed, stderr = pair_test(tmp_path, "a1", "c1")
    assert rc == 1 and parsed["rows"] == []
    assert stderr.startswith("ssh: connect to host c1 port 22: No route to host\n")
    assert "ORTE was unable to reliably start one or more daemons." in stderr


def test_a_hung_pair_test_never_finishes_by_itself(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        pair_test(tmp_path, "a1", "c2", timeout=3)


def test_under_a_real_open_mpi_mpirun_rank_0_alone_prints_like_nccl_tests(tmp_path):
    """The stand-in as the test fleet runs it (tests/fleet/test_fabric_mpirun.py), here with both ranks on this
    machine (one host: a one-node test of the simulated node): every rank joins MPI (mpi4py), rank 0 alone prints."""
    python = "/usr/bin/python3"  # Debian's, with python3-mpi4py (hack/system-deps), whatever python3 PATH finds
    if not shutil.which("mpirun") or subprocess.run([python, "-c", "import mpi4py"]).returncode:
        pytest.skip("needs Open MPI's mpirun and python3-mpi4py (Debian openmpi-bin python3-mpi4py: hack/system-deps)")
    env = dict(os.environ, GPUFLEET_SIM_SCENARIO=str(SIM / "scenarios" / "healthy_h100.json"),
               GPUFLEET_SIM_STATE=str(tmp_path / "n1"), GPUFLEET_SIM_TIME_SCALE="0.0001",
               OMPI_MCA_btl="self,tcp", OMPI_MCA_pml="ob1")
    proc = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", python,
                           str(SIM / "bin" / "all_reduce_perf"), "-b", "1M", "-e", "8M", "-f", "2", "-g", "1"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("# Collective test starting: all_reduce_perf") == 1, proc.stdout
    parsed = parse_nccl_tests(proc.stdout + proc.stderr)
    assert [g["host"] for g in parsed["gpus"]] == ["n1", "n1"] and parsed["failures"] == []
    assert parsed["largest_size_bytes"] == 8 * 1024 * 1024 and parsed["peak_busbw_gbps"] > 0
