"""Render the sample fleet report (fixture hostvars) into tests/output and check it in headless Chromium: the page's
script ran to the end (it sets data-gpufleet-rendered to the number of node cards), no console errors, the fleet
overview and every node are in the rendered DOM, and a screenshot is taken.

Set GPUFLEET_UPDATE_SCREENSHOT=1 to copy the screenshot to docs/img/report.png (the README's picture).
Needs Debian's chromium (apt-get install chromium); CI installs it.
"""

import os
import re
import shutil
import subprocess
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
