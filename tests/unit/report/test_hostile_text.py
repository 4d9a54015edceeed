"""Text from nodes (tool output, host names, finding messages) is shown, never interpreted: no terminal escape sequence
or other control character reaches report.md, report.html, junit.xml or the post-mortem's files (`cat report.md`
would replay them), and nothing in report.md's text is read as Markdown or HTML."""

import copy
import re
import xml.etree.ElementTree as ET

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import render_html, render_junit, render_md
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.report_format import printable
from helpers import sample_fleet

HOST = "<img src=x onerror=alert(1)>*node*"
MESSAGE = "**bold** [click](http://evil.invalid) <script>alert(2)</script> | cell ~~gone~~ `code`"
EVIDENCE = ["NVRM: Xid 79 \x1b[2J\x1b[1;31mRED\x1b[0m \x1b]0;owned\x07 title \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\",
            "bell\x07 backspace\x08 cr\r del\x7f c1\x9b31m bidi\u202eevil NUL\x00 tab\tok"]
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def hostile():
    doc = copy.deepcopy(sample_fleet.report_doc("20261129T090000Z"))
    node = next(n for n in doc["nodes"] if n["findings"])
    node["host"] = HOST
    node["findings"][0].update({"message": MESSAGE, "action": MESSAGE, "evidence": EVIDENCE})
    return doc


def test_printable_drops_escape_sequences_and_writes_other_controls_out():
    assert printable("a\x1b[1;31mRED\x1b[0m") == "aRED"
    assert printable("t\x1b]0;title\x07x") == "tx"
    assert printable("bell\x07 nul\x00 cr\r tab\t nl\n c1\x9b bidi\u202e") == \
        "bell\\x07 nul\\x00 cr\\x0d tab\t nl\n c1\\x9b bidi\\u202e"


@pytest.mark.parametrize("renderer", ["md", "html", "junit", "summary"])
def test_no_control_character_reaches_a_rendered_file(hostile, renderer):
    text = {"md": render_md.render, "html": render_html.render, "junit": render_junit.render,
            "summary": render_md.summary_table}[renderer](hostile)
    assert not CONTROL.search(text), repr(CONTROL.search(text))
    if renderer != "summary":
        assert "\\x07 backspace\\x08" in text  # written out, not dropped: the evidence says what the tool printed
    if renderer == "junit":
        ET.fromstring(text)  # well-formed XML 1.0


def test_markdown_text_is_escaped_in_headings_cells_and_findings(hostile):
    md = render_md.render(hostile)
    assert "## \\<img src=x onerror=alert(1)\\>\\*node\\*: " in md
    assert not re.search(r"(?<!\\)<(img|script|\/script)", md)  # every < escaped
    line = next(line for line in md.splitlines() if "click" in line and line.startswith("- **"))
    assert "\\*\\*bold\\*\\* \\[click\\](http://evil.invalid) \\<script\\>alert(2)\\</script\\> \\| cell " \
           "\\~\\~gone\\~\\~ \\`code\\`" in line
    row = next(line for line in render_md.summary_table(hostile).splitlines() if "onerror" in line)
    assert row.startswith("| \\<img src=x onerror=alert(1)\\>\\*node\\* |")


def test_html_escapes_the_same_text(hostile):
    html = render_html.render(hostile)
    assert "<img src=x" not in html and "<script>alert(2)" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
