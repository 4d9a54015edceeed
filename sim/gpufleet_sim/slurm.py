"""Stand-in scontrol, sinfo and scancel: a Slurm controller's view of the simulated nodes, one state file per node.

The lifecycle (kentino.gpufleet.slurm_node) drains, waits for and resumes nodes through these, in Slurm's exact
formats (tests/fixtures/slurm): `scontrol show node -o NODE` is slurm_sprint_node_table's one line (State=BASE+FLAG,
`Reason=<text> [<user>@<time>]` after the power fields), `sinfo -h -N -n NODE -o %T` the state's word (drained,
draining, idle, allocated), and the client's own error lines and exit status 1.

State: `$GPUFLEET_SIM_SLURM/<node>.json` (default `<the sim state root>/slurm`, beside the nodes' state
directories): {jobs, drain, reason, reason_user, reason_time}. A node is known to this Slurm when it is the node of
the environment (GPUFLEET_SIM_NODE), its file exists or the simulator has a state directory of that name; any other
name is Slurm's "Node X not found". `gpufleet-sim slurm` sets the node's jobs
(a job holds a node: ALLOCATED, a drain leaves it DRAINING until the job ends) and shows its state file.
"""

import getpass
import json
import os
import re
import sys
import time

NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# One line of `scontrol show node -o` (Slurm 23.11 field set, as tests/fixtures/slurm/idle.txt); {state} and
# {reason} vary.
LINE = ("NodeName={name} Arch=x86_64 CoresPerSocket=32 CPUAlloc={cpualloc} CPUEfctv=64 CPUTot=64 CPULoad=0.02 "
        "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8(S:0-1) NodeAddr={name} NodeHostName={name} "
        "Version=23.11.4 OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)  "
        "RealMemory=1031000 AllocMem=0 FreeMem=1019876 Sockets=2 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 "
        "Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  BootTime=2024-05-02T09:14:11 "
        "SlurmdStartTime=2024-05-02T09:15:02 LastBusyTime=2024-05-06T11:02:40 ResumeAfterTime=None "
        "CfgTRES=cpu=64,mem=1031000M,billing=64,gres/gpu=8 AllocTRES={alloctres} CurrentWatts=0 AveWatts=0{reason}")


def slurm_dir():
    explicit = os.environ.get("GPUFLEET_SIM_SLURM")
    if explicit:
        return explicit
    state = os.environ.get("GPUFLEET_SIM_STATE")
    if not state:
        raise SystemExit("slurm (gpufleet-sim stand-in): set GPUFLEET_SIM_SLURM or GPUFLEET_SIM_STATE")
    return os.path.join(os.path.dirname(os.path.abspath(state)), "slurm")


def _path(name):
    return os.path.join(slurm_dir(), name + ".json")


def known(name):
    """The sim's slurm.conf: the node whose environment this is, and every node with a state file or directory."""
    return bool(NAME.match(name or "")) and (name == os.environ.get("GPUFLEET_SIM_NODE") or os.path.exists(
        _path(name)) or os.path.isdir(os.path.join(os.path.dirname(slurm_dir()), name)))


def load(name):
    try:
        with open(_path(name)) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return {"jobs": 0, "drain": False, "reason": None, "reason_user": None, "reason_time": None}


def save(name, node):
    os.makedirs(slurm_dir(), exist_ok=True)
    tmp = _path(name) + ".%d.tmp" % os.getpid()
    with open(tmp, "w") as fh:
        json.dump(node, fh)
    os.replace(tmp, _path(name))


def state_string(node):
    """node_state_string_complete: the base (ALLOCATED while a job runs, else IDLE), then +DRAIN."""
    return ("ALLOCATED" if node["jobs"] else "IDLE") + ("+DRAIN" if node["drain"] else "")


def show_line(name, node):
    reason = " Reason=%s [%s@%s]" % (node["reason"], node["reason_user"], node["reason_time"]) if node["reason"] \
        else ""
    busy = bool(node["jobs"])
    return LINE.format(name=name, state=state_string(node), cpualloc=64 if busy else 0,
                       alloctres="cpu=64,mem=1000G,gres/gpu=8" if busy else "", reason=reason)


def sinfo_word(node):
    if node["drain"]:
        return "draining" if node["jobs"] else "drained"
    return "allocated" if node["jobs"] else "idle"


def _option(argv, *names):
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "=") and name.startswith("--"):
                return arg.split("=", 1)[1]
    return None


def scontrol(argv, out, err):
    words = [a for a in argv if a not in ("-o", "--oneliner")]
    if words[:2] == ["show", "node"] and len(words) == 3:
        name = words[2]
        if not known(name):
            out.write("Node %s not found\n" % name)
            return 1
        out.write(show_line(name, load(name)) + "\n")
        return 0
    if words[:1] == ["update"]:
        fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        fields = {k.lower(): v for k, v in fields.items()}
        name, state = fields.get("nodename"), (fields.get("state") or "").lower()
        if not name or not known(name):
            err.write("slurm_update error: Invalid node name specified\n")
            return 1
        node = load(name)
        if state == "drain":
            if not fields.get("reason"):
                err.write("You must specify a reason when DRAINING a node\nRequest aborted\n")
                return 1
            node.update(drain=True, reason=fields["reason"], reason_user=getpass.getuser(),
                        reason_time=time.strftime("%Y-%m-%dT%H:%M:%S"))
        elif state == "resume":
            node.update(drain=False, reason=None, reason_user=None, reason_time=None)
        else:
            err.write("Invalid input: %s\nRequest aborted\n" % " ".join(words[1:]))
            return 1
        save(name, node)
        return 0
    err.write("scontrol (gpufleet-sim stand-in): only `show node -o NODE` and `update nodename=N state=drain|resume "
              "[reason=...]` are simulated, not %r\n" % " ".join(argv))
    return 1


def sinfo(argv, out, err):
    name = _option(argv, "-n", "--nodes")
    if _option(argv, "-o", "--format") != "%T" or "-N" not in argv or not name:
        err.write("sinfo (gpufleet-sim stand-in): only `sinfo -h -N -n NODE -o %T` is simulated\n")
        return 1
    if known(name):
        out.write(sinfo_word(load(name)) + "\n")
    return 0


def scancel(argv, out, err):
    name = _option(argv, "--nodelist", "-w")
    if not name or not known(name):
        err.write("scancel: error: Invalid node name specified\n")
        return 1
    node = load(name)
    node["jobs"] = 0
    save(name, node)
    return 0


def main(tool, argv):
    return {"scontrol": scontrol, "sinfo": sinfo, "scancel": scancel}[tool](argv, sys.stdout, sys.stderr)
