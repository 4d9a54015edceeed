"""What every hack/gen_* script does with its text: write the generated file, or with --check say whether the file
in the tree is current (exit 1 and the command to run when it is not)."""

import sys
from pathlib import Path


def write_or_check(output, text, check, script):
    output = Path(output)
    if check:
        if not output.exists() or output.read_text() != text:
            sys.stderr.write("%s is out of date: run hack/%s\n" % (output, script))
            return 1
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    return 0
