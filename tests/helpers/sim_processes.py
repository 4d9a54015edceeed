"""The processes of a test's simulated nodes: every one of them (stand-in tools, the collection's modules, Ansible's
async wrappers) carries its node's state directory in its environment, so a test finds exactly its own."""

import os
import signal


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


def kill_tree(pid):
    """SIGKILL a process and everything it started that is still its descendant: a controller that dies with its
    workers and their connections (Ansible's workers run in sessions of their own, so killing the process group of
    ansible-playbook leaves them polling). What daemonized itself (Ansible's async wrappers) is not a descendant."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as fh:
                    children.setdefault(int(fh.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    for member in tree:
        try:
            os.kill(member, signal.SIGKILL)
        except OSError:
            pass
