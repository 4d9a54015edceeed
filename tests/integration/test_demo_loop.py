"""make demo-loop stays true: the script runs the whole loop on the simulated fleet with the real Redfish emulator
and checks each step's end itself (exit 1 otherwise); this reads its transcript for the steps docs/lifecycle.md
shows."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_the_demo_loop_returns_one_node_and_sends_the_lemon_to_rma(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "hack" / "demo_loop.py"), "--root", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    for line in ("loop01: healthy -> quarantined by preflight", "slurm      loop01: DRAIN, reason 'gpufleet: GPU_LOST 3'",
                 "loop01: quarantined -> repairing by repair: bmc_power_cycle", "PowerState Off",
                 "loop01: validating -> healthy by preflight", "slurm      loop01: in service",
                 "loop01: nvidia-smi -L exits 0, 8 GPUs", "loop02: quarantined -> lemon by lemon_rule",
                 "loop02: lemon -> rma by lemon_rule", "gpufleet repair loop02: exit 2: out for RMA"):
        assert line in out, (line, out[-5000:])
    assert out.count("rma        reports/rma/loop02/gpufleet-rma-loop02-") == 2
    # the power cycle as the BMC reported it: off first, on at the end
    assert re.search(r"^playbook +bmc_power_cycle: node loop01: power-cycled through its BMC .*PowerForceOff, .*"
                     r"PowerState Off, .*PowerOn, .*PowerState On$", out, re.M), out[-5000:]
