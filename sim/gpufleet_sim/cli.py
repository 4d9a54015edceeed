"""Entry point of every stand-in: sim/bin/<tool> calls main("<tool>")."""

import os
import sys

from .scenario import ScenarioError

TOOLS = {
    "nvidia-smi": "nvidia_smi",
    "gpu_burn": "gpu_burn",
    "gpu-burn": "gpu_burn",
    "dcgmi": "dcgmi",
    "all_reduce_perf": "nccl",
    "journalctl": "journal",
    "dmesg": "journal",
    "nvme": "storage",
    "smartctl": "storage",
    "torchrun": "torchrun",
    "mpirun": "mpirun",
    "ib_write_bw": "perftest",
    "systemctl": "services",
    "dpkg-query": "services",
    "nvidia-bug-report.sh": "bug_report",
    "scontrol": "slurm",
    "sinfo": "slurm",
    "scancel": "slurm",
}


def main(tool=None, argv=None):
    tool = tool or os.path.basename(sys.argv[0])
    argv = sys.argv[1:] if argv is None else argv
    if TOOLS.get(tool) == "services":
        # The fabric manager's queries only; anything else goes to the real tool, with or without a scenario.
        from . import services
        try:
            return services.main(tool, argv)
        except ScenarioError as exc:
            sys.stderr.write("%s (gpufleet-sim stand-in): %s\n" % (tool, exc))
            return 2
    if TOOLS.get(tool) == "slurm":
        # The Slurm controller's view runs on the controller: it needs the sim's Slurm state, not a node's scenario.
        from . import slurm
        return slurm.main(tool, argv)
    if tool == "mpirun":
        # mpirun needs no node: it only launches its program (which is itself a stand-in).
        from . import mpirun
        return mpirun.main(argv)
    try:
        from .state import Node
        node = Node()
    except ScenarioError as exc:
        sys.stderr.write("%s (gpufleet-sim stand-in): %s\n" % (tool, exc))
        return 2
    import importlib
    mod = importlib.import_module("gpufleet_sim." + TOOLS[tool])
    if TOOLS[tool] in ("journal", "storage"):
        return mod.main(node, tool, argv)
    try:
        return mod.main(node, argv)
    except BrokenPipeError:
        return 141
