"""The processes of a test's own simulated nodes: known by the state directory in their environment (an async task's
processes leave the playbook's process tree), never by a machine-wide pattern another run would match too."""

import os


def sim_processes(state_root):
    """Command lines of the processes whose environment names state_root (a sim state root or one node's directory)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as fh:
                if str(state_root).encode() in fh.read():
                    with open("/proc/%s/cmdline" % pid, "rb") as fh:
                        found.append(fh.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found
