"""The processes of a test's simulated nodes: every one of them (stand-in tools, the collection's modules, Ansible's
async wrappers) carries its node's state directory in its environment, so a test finds exactly its own."""

import os


def node_processes(state_root):
    """Command lines of the live processes whose GPUFLEET_SIM_STATE lies under `state_root`."""
    marker = ("GPUFLEET_SIM_STATE=%s" % state_root).encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as fh:
                if marker not in fh.read():
                    continue
            with open("/proc/%s/stat" % pid) as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                found.append(fh.read().replace(b"\0", b" ").decode(errors="replace").strip())
        except OSError:
            continue
    return found
