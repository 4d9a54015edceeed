"""Helpers of the sim tests (imported by name: conftest puts this directory on sys.path).

Run the sim's stand-ins as real subprocesses, one fresh node state per test (tmp_path), time heavily compressed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SIM = REPO / "sim"
BIN = SIM / "bin"
SCENARIOS = sorted(p.stem for p in (SIM / "scenarios").glob("*.json"))


def gpu_count(scenario):
    """The GPUs a scenario's node has: its gpu_count, else the simulator's default (gpufleet_sim/scenario.py)."""
    if str(SIM) not in sys.path:
        sys.path.insert(0, str(SIM))
    from gpufleet_sim.scenario import DEFAULTS
    return json.loads((SIM / "scenarios" / (scenario + ".json")).read_text()).get("gpu_count", DEFAULTS["gpu_count"])
FAST = "0.001"  # gpu_burn 600 -> 0.6 s


class Sim:
    def __init__(self, tmp_path):
        self.tmp = tmp_path

    def env(self, scenario, node="node", scale=FAST, extra=None):
        env = dict(os.environ)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.update({"GPUFLEET_SIM_SCENARIO": scenario, "GPUFLEET_SIM_STATE": str(self.tmp / node),
                    "GPUFLEET_SIM_TIME_SCALE": str(scale), "GPUFLEET_SIM_NODE": node,
                    "PATH": str(BIN) + os.pathsep + env.get("PATH", ""), "LC_ALL": "C"})
        env.update(extra or {})
        return env

    def run(self, scenario, tool, *args, node="node", scale=FAST, extra=None, timeout=60):
        return subprocess.run([str(BIN / tool)] + [str(a) for a in args], capture_output=True, text=True,
                              env=self.env(scenario, node, scale, extra), timeout=timeout)

    def popen(self, scenario, tool, *args, node="node", scale=FAST, extra=None):
        return subprocess.Popen([str(BIN / tool)] + [str(a) for a in args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env(scenario, node, scale, extra))

    def state(self, node="node"):
        return self.tmp / node
