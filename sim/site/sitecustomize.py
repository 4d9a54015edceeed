"""Started with every Python process of a simulated node (the sim inventory puts this directory on the nodes'
PYTHONPATH, nothing else does): the node's checkpoint drive runs at its scenario's speed (gpufleet_sim/drive.py)."""
import os
import sys

if os.environ.get("GPUFLEET_SIM_STATE") and os.environ.get("GPUFLEET_SIM_SCENARIO"):
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        from gpufleet_sim import drive

        drive.install()
    except Exception as exc:  # a broken scenario must be seen, and must not stop the process it starts with
        sys.stderr.write("gpufleet-sim: the simulated checkpoint drive is off: %s\n" % exc)
