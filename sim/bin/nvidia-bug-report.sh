#!/usr/bin/env python3
"""gpufleet-sim stand-in for nvidia-bug-report.sh (see sim/README.md). Works from the repo or installed with links elsewhere."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
from gpufleet_sim.cli import main  # noqa: E402

sys.exit(main("nvidia-bug-report.sh"))
