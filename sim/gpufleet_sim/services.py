"""Stand-ins for systemctl and dpkg-query, for the fabric manager only: the simulated node's fabric manager package
and service come from the scenario (gpufleet_sim/fabric.py), everything else goes to the machine's real tool.

  systemctl show <fabric manager unit> [--property=A ... | -p A ...]   KEY=VALUE lines (systemctl(1)); a unit the
                                                                       node does not have: LoadState=not-found
  systemctl is-active|is-enabled <fabric manager unit>
  dpkg-query -W [-f=FORMAT | --showformat=FORMAT] <patterns>           for patterns of the fabric manager's packages
                                                                       (nvidia-fabricmanager*, libnvidia-nscq*,
                                                                       libnvsdm*, nvlsm): one line per package known
                                                                       to the node (${Package} ${Version}
                                                                       ${db:Status-Abbrev} ${Status}), "dpkg-query:
                                                                       no packages found matching X" (exit 1) for the
                                                                       others
Any other invocation runs the next systemctl/dpkg-query on PATH after this directory (exit 127 with a message when
there is none), so the stand-ins never hide the real tools from anything but the fabric manager's checks.
"""

import fnmatch
import os
import sys

from . import fabric

FM_PATTERNS = ("nvidia-fabricmanager", "libnvidia-nscq", "libnvsdm", "nvlsm")
PROPERTIES = ("Type", "LoadState", "ActiveState", "SubState", "UnitFileState", "ExecMainStatus", "FragmentPath")


def _real(tool):
    here = os.path.dirname(os.path.realpath(sys.argv[0])) if sys.argv and sys.argv[0] else ""
    for d in os.environ.get("PATH", "").split(os.pathsep):
        cand = os.path.join(d, tool)
        if not d or os.path.realpath(d) == here or not os.access(cand, os.X_OK):
            continue
        if os.path.realpath(cand) == os.path.realpath(sys.argv[0]):
            continue
        return cand
    return None


def _delegate(tool, argv):
    real = _real(tool)
    if real is None:
        sys.stderr.write("%s (gpufleet-sim stand-in): only the fabric manager's queries are simulated and no real %s "
                         "is on PATH: %s\n" % (tool, tool, " ".join(argv)))
        return 127
    os.execv(real, [real] + list(argv))
    return 127  # not reached


def _node():
    from .state import Node
    return Node()


def _unit_states(node, unit):
    fm = fabric.fabric_manager(node)
    if fm is None or unit.replace(".service", "") != fm["service"]:
        return {"Type": "simple", "LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead",
                "UnitFileState": "", "ExecMainStatus": "0", "FragmentPath": ""}
    failed = fm["mismatch"] or fm["nothing_to_do"]  # the daemon exited at start (fabric.fm_journal says why)
    return {"Type": "forking", "LoadState": "loaded",
            "ActiveState": "active" if fm["active"] else ("failed" if failed else "inactive"),
            "SubState": "running" if fm["active"] else ("failed" if failed else "dead"),
            "UnitFileState": "enabled" if fm["enabled"] else "disabled",
            "ExecMainStatus": "1" if failed else "0",
            "FragmentPath": "/lib/systemd/system/%s.service" % fm["service"]}


def systemctl(argv, out=sys.stdout):
    args = [a for a in argv if a not in ("--no-pager", "--quiet", "-q")]
    if len(args) < 2 or args[0] not in ("show", "is-active", "is-enabled"):
        return _delegate("systemctl", argv)
    units = [a for a in args[1:] if not a.startswith("-")]
    props = []
    i = 1
    while i < len(args):
        a = args[i]
        if a.startswith("--property="):
            props += a.split("=", 1)[1].split(",")
        elif a in ("-p", "--property") and i + 1 < len(args):
            props += args[i + 1].split(",")
            units = [u for u in units if u != args[i + 1]]
            i += 1
        i += 1
    if len(units) != 1 or not units[0].replace(".service", "").startswith("nvidia-fabricmanager"):
        return _delegate("systemctl", argv)
    states = _unit_states(_node(), units[0])
    if args[0] == "is-active":
        out.write(states["ActiveState"] + "\n")
        return 0 if states["ActiveState"] == "active" else 3
    if args[0] == "is-enabled":
        if states["LoadState"] == "not-found":
            sys.stderr.write("Failed to get unit file state for %s: No such file or directory\n" % units[0])
            return 1
        out.write(states["UnitFileState"] + "\n")
        return 0 if states["UnitFileState"] == "enabled" else 1
    for key in PROPERTIES:
        if not props or key in props:
            out.write("%s=%s\n" % (key, states[key]))
    return 0


def _packages(node):
    fm = fabric.fabric_manager(node)
    if fm is None:
        return []
    return [(fm["package"], fm["version"] + "-1"), (fm["nscq_package"], fm["nscq_version"] + "-1")]


def _format(fmt, package, version):
    text = fmt.replace("\\t", "\t").replace("\\n", "\n")
    for key, value in (("${Package}", package), ("${binary:Package}", package), ("${Version}", version),
                       ("${db:Status-Abbrev}", "ii "), ("${Status}", "install ok installed")):
        text = text.replace(key, value)
    return text


def dpkg_query(argv, out=sys.stdout, err=sys.stderr):
    fmt = "${binary:Package}\t${Version}\n"
    patterns = []
    show = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-W", "--show"):
            show = True
        elif a.startswith("-f=") or a.startswith("--showformat="):
            fmt = a.split("=", 1)[1]
        elif a in ("-f", "--showformat") and i + 1 < len(argv):
            fmt = argv[i + 1]
            i += 1
        elif not a.startswith("-"):
            patterns.append(a)
        else:
            return _delegate("dpkg-query", argv)
        i += 1
    if not show or not patterns or not all(p.startswith(FM_PATTERNS) for p in patterns):
        return _delegate("dpkg-query", argv)
    known = _packages(_node())
    rc = 0
    for pattern in patterns:
        matched = [(p, v) for p, v in known if fnmatch.fnmatchcase(p, pattern)]
        if not matched:
            err.write("dpkg-query: no packages found matching %s\n" % pattern)
            rc = 1
        for package, version in matched:
            out.write(_format(fmt, package, version))
    return rc


def main(tool, argv):
    if tool == "systemctl":
        return systemctl(argv)
    return dpkg_query(argv)
