"""Changelog fragments follow the antsibull convention (docs/contributing.md): one short entry per change, each
`<module or role> - <what changed for the operator> (<reference>).` on one line; `antsibull-changelog lint` (make
lint) checks the sections and types."""

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FRAGMENTS = sorted((REPO / "changelogs" / "fragments").glob("*.yml"))
ENTRY = re.compile(r"\A[^\n]+? - [^\n]+ \((issue \d+|https?://\S+)\)\.\Z")
MAX_LINE = 160  # ansible-lint's yamllint line length


def entries():
    for path in FRAGMENTS:
        doc = yaml.safe_load(path.read_text()) or {}
        for section, items in doc.items():
            for item in items or []:
                yield path.name, section, item


def test_there_are_fragments():
    assert FRAGMENTS


@pytest.mark.parametrize("name,section,entry", list(entries()), ids=lambda v: v if isinstance(v, str) else "")
def test_each_entry_is_one_change_on_one_line_with_a_reference(name, section, entry):
    if section == "trivial":
        return
    assert isinstance(entry, str), "%s %s: %r is not a plain line (a ': ' makes it a mapping)" % (name, section, entry)
    assert ENTRY.match(entry), ("%s %s: write `<module or role> - <what changed> (issue N).` on one line: %r"
                                % (name, section, entry))


@pytest.mark.parametrize("path", FRAGMENTS, ids=lambda p: p.name)
def test_each_entry_is_one_line_of_the_file(path):
    for line in path.read_text().splitlines():
        assert len(line) <= MAX_LINE, "%s: %d characters" % (path.name, len(line))
        assert not line.startswith("    "), "%s: an entry continued on another line: %r" % (path.name, line)
