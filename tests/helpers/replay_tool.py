#!/usr/bin/env python3
"""A recorded tool call answered again: linked under the tool's name (nvidia-smi, dmesg) first on PATH, it prints
what the real tool printed for the same arguments and exits as it did. The calls are files in $REPLAY_DIR named
NN-<tool>.argv (one argument per line), .out and, where the exit status was not 0, .rc (hack/real-gpu/run records
them). Arguments never recorded exit 127 saying so: a test then sees that the module asked something new.

Where several calls have the same arguments (a sampled time series), each call gets the next one, in NN order, and
the last one again once they are used up; $REPLAY_STATE is a directory that counts what was served."""

import hashlib
import os
import sys
from pathlib import Path


def main():
    tool = Path(sys.argv[0]).name
    wanted = "\n".join(sys.argv[1:])
    matches = [argv for argv in sorted(Path(os.environ["REPLAY_DIR"]).glob("*-%s.argv" % tool))
               if argv.read_text().rstrip("\n") == wanted]
    if not matches:
        sys.stderr.write("%s: no recorded call with the arguments %r\n" % (tool, sys.argv[1:]))
        return 127
    served = 0
    if len(matches) > 1:
        counter = Path(os.environ["REPLAY_STATE"]) / hashlib.sha256(wanted.encode()).hexdigest()
        fd = os.open(counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, b".")  # one byte per call: the file's size counts the calls
            served = os.fstat(fd).st_size - 1
        finally:
            os.close(fd)
    argv = matches[min(served, len(matches) - 1)]
    sys.stdout.write(argv.with_suffix(".out").read_text())
    rc = argv.with_suffix(".rc")
    return int(rc.read_text()) if rc.exists() else 0


if __name__ == "__main__":
    sys.exit(main())
