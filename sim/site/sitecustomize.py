"""Started with every Python process of a simulated node (the sim inventory puts this directory on the nodes'
PYTHONPATH, nothing else does): the node's checkpoint drive runs at its scenario's speed (gpufleet_sim/drive.py), and
its module runs reuse what they compiled before (gpufleet_sim/module_code_cache.py)."""
import os
import sys

# One module code cache for the nodes of a run, beside their state directories.
if os.environ.get("GPUFLEET_SIM_STATE"):
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        from gpufleet_sim import module_code_cache

        module_code_cache.install(os.path.join(os.path.dirname(os.path.abspath(os.environ["GPUFLEET_SIM_STATE"])),
                                               ".module-code"))
    except Exception as exc:  # compiling as usual is always possible
        sys.stderr.write("gpufleet-sim: module code cache off: %s\n" % exc)

if os.environ.get("GPUFLEET_SIM_STATE") and os.environ.get("GPUFLEET_SIM_SCENARIO"):
    try:
        from gpufleet_sim import drive

        drive.install()
    except Exception as exc:  # a broken scenario must be seen, and must not stop the process it starts with
        sys.stderr.write("gpufleet-sim: the simulated checkpoint drive is off: %s\n" % exc)

# The node's InfiniBand ports exist from boot on real hardware: a node of a fabric gets its sysfs tree before its
# first reader (the fabric playbook reads every node's HCAs before any stand-in has run there).
if os.environ.get("GPUFLEET_SIM_STATE") and os.environ.get("GPUFLEET_SIM_FABRIC") and os.environ.get("GPUFLEET_SIM_NODE") \
        and not os.path.isdir(os.path.join(os.environ["GPUFLEET_SIM_STATE"], "sysfs", "class", "infiniband")):
    try:
        from gpufleet_sim import ib_fabric

        ib_fabric.write_ports(os.path.join(os.environ["GPUFLEET_SIM_STATE"], "sysfs", "class", "infiniband"),
                              ib_fabric.Fabric.load(os.environ["GPUFLEET_SIM_FABRIC"]),
                              os.environ["GPUFLEET_SIM_NODE"], 0.0)
    except Exception as exc:  # a broken fabric file must be seen, and must not stop the process it starts with
        sys.stderr.write("gpufleet-sim: the simulated InfiniBand ports are off: %s\n" % exc)
