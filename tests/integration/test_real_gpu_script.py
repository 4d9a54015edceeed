"""hack/real-gpu/run, the script a session lent a real GPU machine runs first, tried here on the simulated stand-ins
(REAL_GPU_SIM=1): a machine is lent rarely and briefly, and a script that broke since its last run would waste it.
It must run every step, keep every result and raw output it promises (docs/contributing.md), and pack them."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_the_real_gpu_script_runs_every_step_on_the_stand_ins(tmp_path):
    kit = tmp_path / "kit"
    kit.mkdir()  # nothing in it: the stand-ins need no build, and this Python has ansible-core and jsonschema
    env = dict(os.environ, REAL_GPU_SIM="1", REAL_GPU_BURN_S="5", REAL_GPU_RAW_BURN_S="2", REAL_GPU_BURN_IN_S="20",
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"], LC_ALL="C.UTF-8")
    proc = subprocess.run([str(REPO / "hack" / "real-gpu" / "run"), str(tmp_path / "out"), str(kit)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    with tarfile.open(tmp_path / "out" / "real-gpu.tar.gz") as tar:
        names = set(tar.getnames())
    work = tmp_path / "out" / "real-gpu"
    for check in ("gpu_facts", "nvlink_facts", "xid_dmesg", "health_snapshot", "gpu_burn", "gpu_burn_no_kernel",
                  "nccl_test"):
        assert "real-gpu/results/%s.json" % check in names, check
    results = {p.stem: json.loads(p.read_text()) for p in (work / "results").glob("*.json")}
    assert results["gpu_facts"]["ansible_facts"]["gpufleet_gpu_count"] == 8
    assert results["gpu_burn"]["verdict"] == "pass" and results["nccl_test"]["verdict"] == "pass"
    raw = {p.name for p in (work / "raw").iterdir()}
    # Every call of a recorded tool (argv, output, exit code), and the two tools run by path, whole.
    assert any(n.endswith("-nvidia-smi.argv") for n in raw) and any(n.endswith("-dmesg.out") for n in raw)
    assert {"gpu_burn-2s.out", "gpu_burn-2s.rc", "all_reduce_perf-g8.out", "gpu_burn-no-compare-kernel.out"} <= raw
    assert "Tested 8 GPUs:" in (work / "raw" / "gpu_burn-2s.out").read_text()
    report = json.loads((work / "reports" / "latest" / "report.json").read_text())
    assert [(n["host"], n["verdict"]) for n in report["nodes"]] == [("real-gpu", "pass")], report["nodes"]
