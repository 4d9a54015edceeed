"""Stand-in for nvidia-bug-report.sh: the real script's options (-o/--output-file BASE, --safe-mode,
--extra-system-data), its console messages and its log, gzip-compressed to BASE.log.gz: the prologue, then sections
separated by a line of underscores (`*** <file>` with the file's contents, or a command and its output), here the
node's nvidia-smi -q, its kernel log and the files of the node's state directory the real script would read
(/proc/cmdline, /etc/os-release). The real script must run as root; the simulator runs without root."""

import gzip
import io
import os
import platform
import sys
import time

from . import journal, nvidia_smi

RULE = "____________________________________________"
VERSION = "35411290"


def _section(title, body):
    return "%s\n\n%s\n%s\n\n" % (RULE, title, body.rstrip("\n"))


def main(node, argv, out=sys.stdout, err=sys.stderr):
    base = "nvidia-bug-report.log"
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-o", "--output-file"):
            if i + 1 >= len(argv) or not argv[i + 1]:
                out.write("Error: --output-file requires a filename argument.\n")
                return 1
            base = argv[i + 1]
            i += 1
        elif arg in ("--safe-mode", "--extra-system-data"):
            pass
        elif arg in ("-v", "--version"):
            out.write(VERSION + "\n")
            return 0
        else:
            out.write('Error: Unknown option "%s".\n' % arg)
            return 1
        i += 1
    log = base + ".gz"
    out.write("\nnvidia-bug-report.sh will now collect information about your\nsystem and create the file '%s' in the "
              "current\ndirectory.  It may take several seconds to run.\n\nRunning nvidia-bug-report.sh..." % log)
    text = ["%s\n\nStart of NVIDIA bug report log file.  Please include this file, along\nwith a detailed description "
            "of your problem, when reporting a graphics\ndriver bug via the NVIDIA Linux forum (see "
            "forums.developer.nvidia.com)\nor by sending email to 'linux-bugs@nvidia.com'.\n\nnvidia-bug-report.sh "
            "Version: %s\n\nDate: %s\nuname: Linux %s %s\ncommand line flags: %s\n\n" % (
                RULE, VERSION, time.strftime("%a %b %d %H:%M:%S %Z %Y"), node.name if hasattr(node, "name") else
                platform.node(), platform.release(), " ".join(argv))]
    for name in ("proc/cmdline", "etc/os-release"):
        path = os.path.join(str(node.path()), "bug_report", name)
        if os.path.exists(path):
            with open(path) as fh:
                text.append(_section("*** /%s" % name, fh.read()))
    smi = io.StringIO()
    nvidia_smi.main(node, ["-q"], smi, smi)
    text.append(_section("/usr/bin/nvidia-smi --query", smi.getvalue()))
    klog = io.StringIO()
    journal.main(node, "dmesg", [], klog, klog)
    text.append(_section("dmesg", klog.getvalue()))
    with open(log, "wb") as fh:
        fh.write(gzip.compress("".join(text).encode("utf-8")))
    out.write(" complete.\n\nThe file %s has been created; please send this report,\nalong with a description of "
              "your bug, to linux-bugs@nvidia.com.\n" % log)
    return 0
