"""No block of 10 or more lines is repeated in plugins/ or roles/: the check `duplicates --min-lines 10` makes, offline.

Every file git knows under plugins/ and roles/ (tracked, or new and not ignored) that holds code, templates or
configuration is read: .py, .j2, .yml/.yaml, .sh and scripts with a shebang. Blank lines are dropped and whitespace is
collapsed; a window of MIN_LINES consecutive lines found twice (in two files, or twice in one) is a repeated block.
Make it one function, doc fragment, template include or task file. What is data by nature may stay, listed in
ALLOWED with the reason; modules' RETURN docs are left out (see _RETURN_DOC).
"""

import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIRS = ("plugins", "roles")
MIN_LINES = 10
SUFFIXES = (".py", ".j2", ".yml", ".yaml", ".sh")
# {frozenset of the two files: why the block stays}
ALLOWED = {
    frozenset({"roles/dcgm_exporter/molecule/default/verify.yml", "roles/dcgm_exporter/vars/main.yml"}):
        "the counters the alerts need, listed by the verify playbook on its own: a test oracle, not a copy to share",
}


# A module's RETURN documentation: the return values every check shares (verdict, reasons, evidence, tool...) are
# written in each module, since doc fragments for RETURN need ansible-core 2.20 and meta/runtime.yml supports 2.17.
_RETURN_DOC = re.compile(r'^RETURN = r"""\n.*?^"""', re.S | re.M)


def without_return_docs(name, text):
    """The text with a module's RETURN docstring blanked (its line numbers kept)."""
    if not name.startswith("plugins/modules/"):
        return text
    return _RETURN_DOC.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def tracked_files(repo=REPO, dirs=DIRS):
    try:
        out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                              "--"] + list(dirs), capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip("not a git checkout (%s): the tracked files are unknown" % exc)
    return sorted(set(p for p in out.decode("utf-8", "replace").split("\0") if p))


def is_source(path):
    if path.suffix in SUFFIXES:
        return True
    if path.suffix:
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"#!"
    except OSError:
        return False


def normalised(text):
    """[(line number, line with whitespace collapsed)] of the non-blank lines."""
    return [(n, " ".join(line.split())) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def repeated_blocks(texts, min_lines=MIN_LINES):
    """[(name, first line, name, first line)] of every window of min_lines normalised lines found twice, merged into
    one entry per pair of places (the first window of each run); overlapping windows of one file do not count."""
    places = defaultdict(list)
    for name, text in texts.items():
        lines = normalised(text)
        for k in range(len(lines) - min_lines + 1):
            key = tuple(line for _n, line in lines[k:k + min_lines])
            places[key].append((name, k, lines[k][0]))
    pairs = {}
    for found in places.values():
        for i, (name_a, k_a, first_a) in enumerate(found):
            for name_b, k_b, first_b in found[i + 1:]:
                if name_a == name_b and k_b - k_a < min_lines:
                    continue  # a run of repeated lines inside one block, not a second block
                run = (name_a, name_b, k_b - k_a)  # consecutive windows of one run share the offset
                if run not in pairs or (name_a, k_a) < pairs[run][:2]:
                    pairs[run] = (name_a, k_a, first_a, name_b, first_b)
    return sorted((a, first_a, b, first_b) for a, _k, first_a, b, first_b in pairs.values())


def test_the_detector_finds_a_block_moved_and_reindented_and_ignores_short_ones():
    block = "\n".join("value_%d = compute(%d)" % (n, n) for n in range(12))
    moved = "def f():\n\n" + "\n".join("        " + line for line in block.splitlines()) + "\n"
    assert repeated_blocks({"a.py": block, "b.py": moved}) == [("a.py", 1, "b.py", 3)]
    short = "\n".join(block.splitlines()[:9])
    assert repeated_blocks({"a.py": short, "b.py": short}) == []
    assert repeated_blocks({"a.py": block + "\n# between\n" + block}) == [("a.py", 1, "a.py", 14)]
    assert repeated_blocks({"a.py": "x = 1\n" * 15}) == []  # overlapping windows of one run are one block
    doc = 'RETURN = r"""\n' + block + '\n"""\nafter = 1\n'
    blanked = without_return_docs("plugins/modules/a.py", doc)
    assert repeated_blocks({"a.py": blanked, "b.py": blanked}) == [] and blanked.splitlines()[-1] == "after = 1"
    assert without_return_docs("plugins/module_utils/a.py", doc) == doc  # only modules' RETURN docs


def test_no_block_of_ten_lines_is_repeated_in_plugins_or_roles():
    texts = {}
    for name in tracked_files():
        path = REPO / name
        if path.is_file() and is_source(path):
            texts[name] = without_return_docs(name, path.read_text(encoding="utf-8", errors="replace"))
    assert len([n for n in texts if n.startswith("plugins/")]) > 50, "the plugins were not found: %s" % REPO
    found = [(a, la, b, lb) for a, la, b, lb in repeated_blocks(texts) if frozenset({a, b}) not in ALLOWED]
    assert not found, "repeated blocks of %d+ lines (share them: a function, a doc fragment, a template include, a " \
                      "task file):\n%s" % (MIN_LINES, "\n".join("  %s:%d ~ %s:%d" % f for f in found))
