"""Every scenario through every stand-in once: each output parses as the real tool's format."""

import json
import re

import pytest
from simlib import SCENARIOS

FRAME = re.compile(r"^\d{1,3}\.\d%  proc'd: (-?\d+ \(\d+ Gflop/s\) (- )?)+  errors: .*  temps: ")
PREFIX = re.compile(r"^\[ *\d+\.\d{6}\] ")


# HGX scenarios whose GPUs never registered with the NVLink fabric: every CUDA tool fails with error 802.
FABRIC_NOT_READY = ("hgx_fabric_manager_stopped", "hgx_fabric_manager_mismatch")


@pytest.mark.parametrize("scenario", FABRIC_NOT_READY)
def test_cuda_tools_fail_with_802_while_the_fabric_is_not_ready(sim, scenario):
    burn = sim.run(scenario, "gpu_burn", "200")
    assert burn.returncode == 19 and burn.stderr == ("Couldn't init CUDA: Error (gpu_burn-drv.cpp:304): system not "
                                                     "yet initialized\n")
    assert re.search(r"^GPU 7: NVIDIA H100 80GB HBM3 \(UUID: GPU-", burn.stdout, re.M)  # nvidia-smi -L still works
    nccl = sim.run(scenario, "all_reduce_perf", "-b", "1M", "-e", "4M", "-f", "2", "-g", "1")
    assert nccl.returncode == 1 and "Test CUDA failure common.cu:1011 'system not yet initialized'" in nccl.stderr
    dry = sim.run(scenario, "torchrun", "--nproc-per-node=2", "dryrun.py")
    assert dry.returncode == 1 and dry.stderr.count("Error 802: system not yet initialized") == 2
    assert "ChildFailedError" in dry.stderr


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s not in FABRIC_NOT_READY])
def test_scenario_through_all_stand_ins(sim, scenario):
    burn = sim.run(scenario, "gpu_burn", "200")
    assert burn.returncode == 0, burn.stderr
    parts = [p for p in re.split(r"[\r\n]", burn.stdout) if p]
    assert parts[0] == "Using compare file: compare.ptx" and parts[1] == "Burning for 200 seconds."
    assert any(FRAME.match(p) for p in parts)
    tested = re.search(r"^Tested (\d+) GPUs:$", burn.stdout, re.M)
    verdicts = re.findall(r"^\tGPU (\d+): (OK|FAULTY)$", burn.stdout, re.M)
    assert tested and len(verdicts) == int(tested.group(1)) and [int(i) for i, _v in verdicts] == list(range(len(verdicts)))

    lines = sim.run(scenario, "journalctl", "-k", "-o", "json").stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert records and all(isinstance(r["MESSAGE"], (str, list)) and isinstance(r["__CURSOR"], str) for r in records)
    for r in records:
        if isinstance(r["MESSAGE"], str) and "NVRM: Xid" in r["MESSAGE"]:
            assert re.match(r"^NVRM: Xid \(PCI:[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\): \d+, ", r["MESSAGE"])
    dmesg = sim.run(scenario, "dmesg").stdout.splitlines()
    assert len(dmesg) == len(records) and all(PREFIX.match(line) for line in dmesg)

    diag = sim.run(scenario, "dcgmi", "diag", "-r", "1", "-j")
    doc = json.loads(diag.stdout)
    results = [r for c in doc["DCGM Diagnostic"]["test_categories"] for t in c["tests"] for r in t["results"]]
    assert results and all(r["status"] in ("Pass", "Fail", "Skip") and r["entity_group"] == "GPU" for r in results)
    assert diag.returncode in (0, 226) and (diag.returncode == 226) == any(
        w["error_severity"] >= 2 for r in results for w in r.get("warnings", []))

    smart = json.loads(sim.run(scenario, "nvme", "smart-log", "/dev/nvme1", "-o", "json").stdout)
    assert 273 < smart["temperature"] < 373 and 0 <= smart["critical_warning"] < 32

    nccl = sim.run(scenario, "all_reduce_perf", "-b", "1M", "-e", "4M", "-f", "2", "-g", "1")
    assert re.search(r"^ +1048576 +262144 +float +sum +-1 ", nccl.stdout, re.M)
    assert "# Collective test concluded: all_reduce_perf" in nccl.stdout

    dry = sim.run(scenario, "torchrun", "--nproc-per-node=1", "dryrun.py")
    if dry.returncode == 0:
        assert json.loads(dry.stdout.split("GPUFLEET_DRYRUN ", 1)[1])["world_size"] == 1
    else:  # the scenario's burn took GPU 0 away
        assert "ChildFailedError" in dry.stderr
