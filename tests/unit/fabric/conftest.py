"""The fabric tests drive the search against the simulator's fabric model (sim/gpufleet_sim/ib_fabric.py)."""

import sys
from pathlib import Path

SIM = Path(__file__).resolve().parents[3] / "sim"
if str(SIM) not in sys.path:
    sys.path.insert(0, str(SIM))
