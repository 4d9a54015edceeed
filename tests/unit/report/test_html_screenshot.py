"""Render the sample fleet report (fixture hostvars) into tests/output and check it in headless Chromium: the page's
script ran to the end (it sets data-gpufleet-rendered to the number of node cards), no console errors, the fleet
overview and every node are in the rendered DOM, and a screenshot is taken. Layout is measured in the browser after
it laid the page out (a copy of the page with a small measuring script): at 420 px wide every node's action stays
inside the viewport and the page does not scroll sideways; the XID timeline's axis labels never overlap.

Set GPUFLEET_UPDATE_SCREENSHOT=1 to copy the screenshot to docs/img/report.png (the README's picture).
Needs Debian's chromium (apt-get install chromium); CI installs it.
"""

import json
import os
import re
import shutil
import subprocess
from html import escape, unescape
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import report
from helpers import sample_fleet

REPO = Path(__file__).resolve().parents[3]
OUTPUT = REPO / "tests" / "output" / "report-sample"
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def sample():
    data = sample_fleet.hosts()
    nodes = report.evaluate_fleet(list(data), data, sample_fleet.in_play())
    doc = report.build_report(nodes, "sample", playbook="burn_in", started="2026-11-29T09:00:00+00:00",
                              finished="2026-11-29T10:12:00+00:00")
    shutil.rmtree(OUTPUT, ignore_errors=True)
    written = report.write_report(doc, OUTPUT)
    return doc, Path(written["files"]["report.html"])


def _chromium(tmp_path, *args):
    profile = tmp_path / "profile"
    cmd = [str(CHROMIUM)] + FLAGS + ["--user-data-dir=%s" % profile, "--enable-logging=stderr", "--v=0"] + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_page_renders_without_script_errors(sample, tmp_path):
    doc, html = sample
    proc = _chromium(tmp_path, "--dump-dom", html.as_uri())
    dom = proc.stdout
    assert 'data-gpufleet-rendered="%d"' % len(doc["nodes"]) in dom, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not [line for line in console if re.search(r"error|uncaught", line, re.I)], console
    assert 'id="fleet-overview"' in dom
    for node in doc["nodes"]:
        assert 'data-host="%s"' % node["host"] in dom


def test_screenshot(sample, tmp_path):
    _doc, html = sample
    png = OUTPUT / "report.png"
    proc = _chromium(tmp_path, "--screenshot=%s" % png, "--window-size=1400,2000", "--hide-scrollbars", html.as_uri())
    assert png.is_file(), proc.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000, "a blank page compresses to a few KB"
    if os.environ.get("GPUFLEET_UPDATE_SCREENSHOT") == "1":
        target = REPO / "docs" / "img" / "report.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, target)


# Chromium's headless window is at least 500 px wide, so the report is laid out in a frame of the width under test
# (srcdoc: same origin as this page); once it has loaded, the boxes the browser laid out go to <html data-layout>.
FRAME = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="report" style="width:%(width)dpx;height:900px;border:0" srcdoc="%(srcdoc)s"></iframe>
<script>
window.addEventListener("load", function () {
  "use strict";
  var win = document.getElementById("report").contentWindow, doc = win.document;
  function box(el) { var r = el.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top,
    bottom: r.bottom, width: r.width, height: r.height, text: el.textContent}; }
  function all(sel) { return Array.prototype.map.call(doc.querySelectorAll(sel), box); }
  document.documentElement.setAttribute("data-layout", JSON.stringify({
    rendered: doc.documentElement.getAttribute("data-gpufleet-rendered"),
    viewport: doc.documentElement.clientWidth, inner: win.innerWidth, scroll: doc.documentElement.scrollWidth,
    actions: all("table.nodes td.action"), axis: all("svg.xid-timeline text.axis"),
    marks: all("svg.xid-timeline text.xidlabel")}));
});
</script></body></html>"""


def _layout(html, tmp_path, width):
    page = tmp_path / ("measure-%d.html" % width)
    page.write_text(FRAME % {"width": width, "srcdoc": escape(html.read_text(), quote=True)})
    proc = _chromium(tmp_path, "--dump-dom", "--window-size=1400,1000", page.as_uri())
    found = re.search(r'data-layout="([^"]*)"', proc.stdout)
    assert found, proc.stderr[-2000:]
    return json.loads(unescape(found.group(1)))


def test_action_column_stays_visible_at_420_px(sample, tmp_path):
    doc, html = sample
    layout = _layout(html, tmp_path, 420)
    assert layout["inner"] == 420 and layout["rendered"] == str(len(doc["nodes"])), layout
    view = layout["viewport"]
    assert len(layout["actions"]) == len(doc["nodes"])
    for cell in layout["actions"]:
        assert cell["width"] > 50 and cell["height"] > 0, cell
        assert cell["left"] >= 0 and cell["right"] <= view + 0.5, "action cell outside the %d px viewport: %s" % (
            view, cell)
    assert layout["scroll"] <= view + 1, "the page scrolls sideways: %d px wide in a %d px window" % (
        layout["scroll"], view)
    png = OUTPUT / "report-420.png"
    _chromium(tmp_path, "--screenshot=%s" % png, "--window-size=420,2400", "--hide-scrollbars", html.as_uri())
    assert png.is_file()


def _overlaps(boxes):
    lines = {}
    for b in boxes:
        lines.setdefault(round(b["top"]), []).append(b)
    bad = []
    for row in lines.values():
        row.sort(key=lambda b: b["left"])
        bad += [(a["text"], b["text"]) for a, b in zip(row, row[1:], strict=False) if a["right"] > b["left"]]
    return bad


def test_xid_timeline_labels_do_not_overlap_in_the_browser(sample, tmp_path):
    _doc, html = sample
    layout = _layout(html, tmp_path, 1400)
    assert len(layout["axis"]) >= 3 and layout["marks"], layout
    assert not _overlaps(layout["axis"]), _overlaps(layout["axis"])
    assert not _overlaps(layout["marks"]), _overlaps(layout["marks"])
