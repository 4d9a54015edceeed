"""argparse types of the gpufleet command's options: a value out of range is a usage error naming the option (exit 2),
never replaced by a default or read as something else further on."""

import argparse
import math
import os
import sys
from pathlib import Path


def _number(text, kind):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a %s" % (text, "whole number" if kind is int else "number")) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError("%r is not a finite number" % text)
    return value


def _at_least(kind, minimum, strictly, maximum=None):
    """An argparse type: a finite `kind` above `minimum` (strictly) or not below it, and not above `maximum`."""
    def parse(text):
        value = _number(text, kind)
        if value < minimum or (strictly and value == minimum):
            raise argparse.ArgumentTypeError("must be %s, got %s" % (
                "greater than %s" % minimum if strictly else "%s or more" % minimum, text))
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError("must be at most %s, got %s" % (
                "%d" % maximum if float(maximum).is_integer() else maximum, text))
        return value
    return parse


def between(kind, low, high):
    """An argparse type: a finite `kind` from `low` to `high`, the range where the value still means something (a
    plan for 10^20 GPUs or a checkpoint every 10^-300 minutes is a typo, not a question)."""
    return _at_least(kind, low, False, high)


positive_int = _at_least(int, 0, strictly=True)
index = _at_least(int, 0, strictly=False)
positive_float = _at_least(float, 0, strictly=True)
non_negative_float = _at_least(float, 0, strictly=False)


def existing_dir(text):
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError("%s is not a directory%s" % (
            text, "" if Path(text).exists() else " (it does not exist)"))
    return text


def inventory_path(text):
    """An inventory that exists (a file, a directory of them, or an executable script): a missing one is a usage error
    here, where Ansible would only warn and then say that no host matched."""
    if not Path(text).exists():
        raise argparse.ArgumentTypeError("%s does not exist (give an inventory file or directory)" % text)
    return text


def add_inventory_option(parser):
    """-i/--inventory, repeatable, each one checked to exist."""
    parser.add_argument("-i", "--inventory", action="append", type=inventory_path,
                        help="inventory (default: ansible.cfg's, the sim fleet)")


def run_report_dir(extra, key, default):
    """The directory a run writes its reports into: `-e KEY=...` when given, else `default` (--report-dir); made and
    checked (make_output_dir) with the name of whichever of the two gave it, and set in extra."""
    option = "-e " + key if key in extra else "--report-dir"
    return make_output_dir(extra.setdefault(key, default), option)


def output_file(text):
    """A file to write: its directory exists and is writable, and it is not itself a directory."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError("%s is a directory: give a file name" % text)
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError("cannot write %s: directory %s does not exist" % (text, parent))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError("cannot write %s: directory %s is not writable" % (text, parent))
    return text


def output_dir(text):
    """A directory to write into: one that exists, or one that can be made under the nearest directory that does."""
    path = Path(text)
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError("%s exists and is not a directory: give a directory" % text)
        existing = path
    else:
        existing = next((p for p in path.absolute().parents if p.exists()), None)
        if existing is None or not existing.is_dir():
            raise argparse.ArgumentTypeError("cannot make %s: %s is not a directory" % (text, existing))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError("cannot write into %s: %s is not writable" % (text, existing))
    return text


def make_output_dir(text, option):
    """Make the directory a run writes its reports into (mkdir -p); a path that is a file, under a file, or not
    writable ends the command as a usage error naming the option (exit 2), before Ansible starts."""
    try:
        output_dir(text)
        Path(text).mkdir(parents=True, exist_ok=True)
        return Path(text)
    except argparse.ArgumentTypeError as exc:
        problem = str(exc)
    except OSError as exc:
        problem = "cannot make %s: %s" % (text, exc.strerror or exc)
    sys.stderr.write("gpufleet: error: argument %s: %s\n" % (option, problem))
    raise SystemExit(2)


def _matching(pattern, what):
    """An argparse type: a whole value of `pattern` (no control characters can pass), else a usage error."""
    import re

    compiled = re.compile(pattern)

    def parse(text):
        if not compiled.match(text):
            raise argparse.ArgumentTypeError("%r is not %s" % (text, what))
        return text
    return parse


node_name = _matching(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z", "a node name (letters, digits, '.', '_', '-')")
reason = _matching(r"\A[ -~]{1,300}\Z", "one line of 1 to 300 printable ASCII characters")
finding_code = _matching(r"\A[A-Z][A-Z0-9_]{0,63}\Z", "a finding code in UPPER_SNAKE (e.g. XID_CRITICAL)")
gpu_id = _matching(r"\A(?:[0-9]{1,3}|[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-7])?)\Z",
                   "a GPU index or a PCI address dddd:bb:dd")
