"""Stand-in for mpirun: runs the program once as every rank would (the stand-ins print rank 0's view).

Accepts the usual Open MPI options (-np/-n N, --allow-run-as-root, -x VAR[=VAL], --bind-to X, --map-by X, -H hosts,
--hostfile F, --mca K V, --oversubscribe) and exports OMPI_COMM_WORLD_SIZE=N to the program, and the hosts of -H
(`a:8,b:8`) as GPUFLEET_SIM_MPI_HOSTS=a,b: with a fabric (GPUFLEET_SIM_FABRIC) all_reduce_perf then answers as a
two-node test between them (sim/gpufleet_sim/ib_fabric.py).
"""

import json
import os
import sys

# What Open MPI 4 prints when ssh cannot start its daemon (orted) on a host of -H.
_NO_DAEMON = ("--------------------------------------------------------------------------\n"
              "ORTE was unable to reliably start one or more daemons.\n"
              "This usually is caused by:\n\n"
              "* not finding the required libraries and/or binaries on\n"
              "  one or more nodes. Please check your PATH and LD_LIBRARY_PATH\n"
              "  settings, or configure OMPI with --enable-orterun-prefix-by-default\n\n"
              "* lack of authority to execute on one or more specified nodes.\n"
              "  Please verify your allocation and authorities.\n"
              "--------------------------------------------------------------------------\n")


def _down(hosts):
    """The hosts of -H the fabric file (GPUFLEET_SIM_FABRIC) marks as unreachable over SSH."""
    path = os.environ.get("GPUFLEET_SIM_FABRIC")
    if not path or not hosts:
        return []
    try:
        with open(path) as f:
            down = set(json.load(f).get("down") or [])
    except (OSError, ValueError):
        return []  # the test itself reports a broken fabric file
    return [h for h in hosts if h in down]

_WITH_VALUE = {"-np", "-n", "-c", "--np", "-x", "--bind-to", "--map-by", "-H", "--host", "--hostfile", "-hostfile",
               "--rank-by", "-npernode", "--npernode", "-wdir", "--wdir"}
_WITH_TWO = {"--mca", "-mca", "-gmca", "--gmca"}


def main(argv):
    np_ = 1
    hosts = []
    env = dict(os.environ)
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg in _WITH_TWO:
            i += 3
            continue
        if arg in _WITH_VALUE:
            val = argv[i + 1] if i + 1 < len(argv) else ""
            if arg in ("-np", "-n", "-c", "--np"):
                np_ = int(val) if val.isdigit() else 1
            elif arg in ("-H", "--host"):
                for host in val.split(","):
                    name = host.partition(":")[0]
                    if name and name not in hosts:
                        hosts.append(name)
            elif arg == "-x":
                name, eq, value = val.partition("=")
                if eq:
                    env[name] = value
            i += 2
            continue
        i += 1
    prog = argv[i:]
    if not prog:
        sys.stderr.write("mpirun could not find anything to do.\n")
        return 1
    env["OMPI_COMM_WORLD_SIZE"] = str(np_)
    env["OMPI_COMM_WORLD_RANK"] = "0"
    if hosts:
        env["GPUFLEET_SIM_MPI_HOSTS"] = ",".join(hosts)
    down = _down(hosts)
    if down:
        sys.stderr.write("ssh: connect to host %s port 22: No route to host\n%s" % (down[0], _NO_DAEMON))
        return 1
    try:
        os.execvpe(prog[0], prog, env)
    except OSError as exc:
        sys.stderr.write("--------------------------------------------------------------------------\n"
                         "mpirun was unable to launch the specified application as it could not access\n"
                         "or execute an executable:\n\nExecutable: %s\nError: %s\n" % (prog[0], exc.strerror))
        return 1
    return 0
