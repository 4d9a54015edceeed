"""What the operator reads in report.html and report.md: real start and finish times in UTC with the run's duration,
counts as integers, an XID timeline on a wall-clock axis whose labels never overlap, lost GPUs shown as LOST with
their PCI address, the burn's Gflop/s over time, and an interrupted run marked as such."""

import copy
import json
import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_xid
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import (
    render_html,
    render_md,
    render_svg,
    report,
    report_format,
)
from helpers import sample_fleet

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def doc():
    data = sample_fleet.hosts()
    nodes = report.evaluate_fleet(list(data), data, sample_fleet.in_play())
    return report.build_report(nodes, "reading", playbook="burn_in", started="2026-11-29T09:00:00+00:00",
                               finished="2026-11-29T10:12:07+00:00")


@pytest.fixture(scope="module")
def html(doc):
    return render_html.render(doc)


def _node(doc, host):
    return next(n for n in doc["nodes"] if n["host"] == host)


def _gpu_card(html, host, index):
    """The markup of one GPU card of one node card."""
    card = html[html.index('data-host="%s"' % host):]
    card = card[:card.index("</article>")]
    start = card.index('data-gpu="%d"' % index)
    start = card.rindex("<div", 0, start)
    return card[start:card.index("</div>", start)]


# --- times -------------------------------------------------------------------------------------------------------------

def test_html_and_md_show_start_finish_in_utc_and_the_duration(doc, html):
    md = render_md.render(doc)
    for text in (html, md):
        assert "2026-11-29 09:00:00 UTC" in text and "2026-11-29 10:12:07 UTC" in text
        assert "1 h 12 min" in text
    assert 'datetime="2026-11-29T09:00:00+00:00"' in html, "the machine-readable time stays in the page"


def test_a_time_with_another_offset_is_shown_in_utc(doc):
    other = dict(doc, started="2026-11-29T10:00:00+01:00", finished="2026-11-29T09:45:00Z")
    md = render_md.render(other)
    assert "started: 2026-11-29 09:00:00 UTC" in md and "(took 45 min)" in md


def test_an_unknown_start_shows_no_made_up_duration(doc):
    same = dict(doc, started=doc["finished"])
    assert "took" not in render_md.render(same).split("## Summary")[0]
    assert report_format.run_times({"started": "garbage", "finished": doc["finished"]})["duration"] is None


@pytest.mark.parametrize("seconds,text", [(0, "0 s"), (59.6, "1 min"), (133, "2 min 13 s"), (3600, "1 h"),
                                          (4327, "1 h 12 min"), (93784, "1 d 2 h"), (-1, "unknown"),
                                          (None, "unknown")])
def test_duration_text(seconds, text):
    assert report_format.duration_text(seconds) == text


# --- counts --------------------------------------------------------------------------------------------------------------

def test_counts_read_as_integers_even_when_stored_as_floats(doc):
    # JSON Schema's "integer" accepts 2.0: a report.json written by another tool may carry counts as floats.
    floaty = copy.deepcopy(doc)
    s = floaty["summary"]
    s["nodes"], s["gpus"] = float(s["nodes"]), float(s["gpus"])
    s["verdicts"] = {k: float(v) for k, v in s["verdicts"].items()}
    s["gpu_verdicts"] = {k: float(v) for k, v in s["gpu_verdicts"].items()}
    for node in floaty["nodes"]:
        for g in node["gpus"]:
            g["index"] = float(g["index"])
        for f in node["findings"]:
            if f["gpu"] is not None:
                f["gpu"] = float(f["gpu"])
    assert report.validation_errors(floaty) == [], "the schema accepts these floats: the renderers must cope"
    html = render_html.render(floaty)
    md = render_md.render(floaty)
    for text in (html, md):
        assert not re.search(r"\b\d+\.0 (node|GPU)", text), re.search(r".{40}\b\d+\.0 (node|GPU).{20}", text)
        assert not re.search(r"GPU \d+\.0\b", text)
    assert '<div class="n">80</div>' in html and '<div class="n">80.0</div>' not in html
    assert "10 node(s), 80 GPU(s)" in md
    assert not re.search(r">\s*\d+\.0\s*<", html.split("<style>")[0] + html.split("</style>")[1].split("<svg")[0])


def test_figures_without_float_noise_in_markdown(doc):
    md = render_md.render(doc)
    assert "worst_case_lost_min=30," in md and "worst_case_lost_min=30.0" not in md
    assert "min_busbw_gbps=35," in md


# --- XID timeline --------------------------------------------------------------------------------------------------------

def _timeline_nodes(times_by_host):
    return [{"host": host, "xid_timeline": [{"time_s": t, "xid": xid, "gpu": 3, "pci": "0000:61:00",
                                             "severity": "critical", "message": "NVRM: Xid (PCI:0000:61:00): %d" % xid}
                                            for t, xid in events]}
            for host, events in times_by_host.items()]


def _axis_labels(svg):
    root = ET.fromstring(svg)
    rows = {}
    for text in root.iter(SVG + "text"):
        if "axis" in (text.get("class") or "").split():
            rows.setdefault(float(text.get("y")), []).append((float(text.get("x")), text.text or ""))
    return rows


def _assert_no_overlap(rows, char_px=7.5):
    """Labels of one line of the axis, with a generous width per character, never overlap."""
    for y, labels in rows.items():
        labels.sort()
        for (x1, t1), (x2, t2) in zip(labels, labels[1:], strict=False):
            assert x1 + len(t1) * char_px / 2 < x2 - len(t2) * char_px / 2, (y, t1, t2, x1, x2)


BASE = datetime(2026, 11, 29, 9, 0, 0, tzinfo=UTC).timestamp()


def test_timeline_axis_seconds_apart_is_wall_clock_with_seconds():
    svg = render_svg.xid_timeline(_timeline_nodes({"gpu-07": [(BASE + 1, 79), (BASE + 3.5, 45), (BASE + 9, 79)],
                                                   "gpu-08": [(BASE + 6, 13)]}))
    rows = _axis_labels(svg)
    times = [t for labels in rows.values() for _, t in labels if re.fullmatch(r"\d\d:\d\d:\d\d", t)]
    assert len(times) >= 3 and all(t.startswith("09:00:") for t in times), rows
    assert "2026-11-29" in [t for labels in rows.values() for _, t in labels], "the date is named once"
    assert "XID events by time (UTC)" in svg and "2026-11-29 09:00:01 UTC to 2026-11-29 09:00:09 UTC" in svg
    _assert_no_overlap(rows)


def test_timeline_axis_days_apart_names_days():
    day = 86400
    svg = render_svg.xid_timeline(_timeline_nodes({"gpu-05": [(BASE - 17 * day + 37, 92), (BASE - 10 * day, 92),
                                                              (BASE - 2 * day, 92), (BASE, 48)]}))
    rows = _axis_labels(svg)
    days = [t for labels in rows.values() for _, t in labels if re.fullmatch(r"[A-Z][a-z]{2} \d\d", t)]
    assert len(days) >= 4 and all(d.startswith("Nov ") for d in days), rows
    assert "2026" in [t for labels in rows.values() for _, t in labels]
    _assert_no_overlap(rows)


@pytest.mark.parametrize("span", [0.003, 0.4, 7, 50, 700, 5000, 40000, 200000, 3e6, 9e7])
def test_timeline_axis_labels_never_overlap_at_any_span(span):
    svg = render_svg.xid_timeline(_timeline_nodes({"n": [(BASE, 79), (BASE + span, 79)]}))
    rows = _axis_labels(svg)
    assert sum(len(v) for v in rows.values()) >= 2
    _assert_no_overlap(rows)


def test_timeline_marks_close_events_as_one_labelled_mark():
    # A PSU rail: four GPUs lost within 4 ms, on an axis of days: one mark "79×4", not four labels on each other.
    events = [(BASE + i * 0.001, 79) for i in range(4)] + [(BASE - 5 * 86400, 92)]
    svg = render_svg.xid_timeline(_timeline_nodes({"rail": events}))
    root = ET.fromstring(svg)
    labels = [t.text for t in root.iter(SVG + "text") if t.get("class") == "xidlabel"]
    assert sorted(labels) == ["79×4", "92"]
    tips = [c.find(SVG + "title").text for c in root.iter(SVG + "circle")]
    assert any(tip.count("XID 79") == 4 and "09:00:00.003 UTC" in tip for tip in tips)


def test_timeline_without_timed_events_is_empty():
    assert render_svg.xid_timeline([{"host": "a", "xid_timeline": [{"time_s": None, "xid": 79}]}]) == ""
    # Seconds since boot are not a wall-clock time: never drawn as a date in 1970.
    assert render_svg.xid_timeline(_timeline_nodes({"a": [(1843.3, 79), (float("nan"), 79)]})) == ""


# --- lost GPUs -----------------------------------------------------------------------------------------------------------

def test_lost_codes_are_the_xid_judges():
    assert set(report_format.LOST_CODES) <= set(judge_xid.CODES)


def test_a_lost_gpu_card_says_lost_with_its_pci_and_no_figures(doc, html):
    gpu = next(g for g in _node(doc, "sim-node03")["gpus"] if g["index"] == 3)
    assert report_format.lost_finding(gpu)["code"] == "GPU_LOST"
    card = _gpu_card(html, "sim-node03", 3)
    assert "LOST" in card and gpu["pci"] in card and "0000:61:00" in card
    assert "sn " not in card and ">sn<" not in card and "Gflop/s" not in card and "?" not in card


def test_every_gpu_of_a_lost_psu_rail_says_lost(doc, html):
    node = _node(doc, "sim-node04")
    for index in (4, 5, 6, 7):
        card = _gpu_card(html, "sim-node04", index)
        assert 'class="gpu lost"' in card and "LOST" in card, card
        assert next(g for g in node["gpus"] if g["index"] == index)["pci"] in card
    healthy = _gpu_card(html, "sim-node04", 0)
    assert "LOST" not in healthy and "Gflop/s" in healthy


def test_no_card_shows_an_unknown_serial(html):
    assert "sn</span> ?" not in html and "model ?" not in html


def test_markdown_lists_lost_gpus(doc):
    md = render_md.render(doc)
    assert re.search(r"Lost GPUs: GPU 4 \(0000:81:00\) LOST: GPU_LOST, GPU 5", md), md[:3000]


# --- the burn over time ------------------------------------------------------------------------------------------------

def test_gflops_over_the_burn_is_drawn_per_gpu_next_to_the_temperature(doc, html):
    node = _node(doc, "sim-node03")
    series = node["series"]["gflops"]
    assert len(series) == 8 and all(len(points) > 10 for points in series.values())
    card = html[html.index('data-host="sim-node03"'):]
    card = card[:card.index("</article>")]
    two = card[card.index('<div class="two">'):]
    assert two.index("Temperature under load") < two.index("gpu-burn Gflop/s over the burn")
    chart = re.search(r'<svg[^>]*aria-label="gpu-burn Gflop/s over the burn".*?</svg>', two, re.S)
    root = ET.fromstring(chart.group(0))
    paths = [p for p in root.iter(SVG + "path") if p.get("class") == "series"]
    assert len(paths) == 8
    ticks = [t.text for t in root.iter(SVG + "text") if t.get("class") == "tick"]
    assert not [t for t in ticks if t and t.startswith("-")], "Gflop/s never goes below zero: %s" % ticks


def test_a_node_without_the_series_falls_back_to_bars_without_lost_gpus(doc):
    node = copy.deepcopy(_node(doc, "sim-node03"))
    node["series"].pop("gflops")
    charts = render_html._node_charts(node, str)
    assert "per GPU (mean)" in charts["throughput"]
    assert ">GPU 3<" not in charts["throughput"], "a lost GPU's mean from before it fell off is not a figure"


# --- an interrupted run ----------------------------------------------------------------------------------------------

def test_an_interrupted_run_is_marked_in_html_and_markdown(doc):
    """An interrupted run keeps its gate (on main the report recorded fail_on: never) and never passes it."""
    stopped = report.build_report(json.loads(json.dumps(doc["nodes"])), doc["run_id"], playbook=doc["playbook"],
                                  fail_on="warn", interrupted=True)
    assert report.validation_errors(stopped) == []
    assert stopped["fail_on"] == "warn" and stopped["summary"]["gate"]["failed"] is True
    html = render_html.render(stopped)
    assert 'id="interrupted"' in html and "Interrupted run." in html
    assert "<title>GPU fleet report reading: INTERRUPTED</title>" in html
    assert "gate failed: run interrupted (fail_on=warn)" in html and "gate passed" not in html
    md = render_md.render(stopped)
    assert md.startswith("# GPU fleet report reading (INTERRUPTED)")
    assert "**Interrupted run.**" in md and "Gate (fail_on=warn): FAILED: the run was interrupted" in md
    table = render_md.summary_table(stopped)
    assert "INTERRUPTED" in table and "passed" not in table


def test_a_finished_run_has_no_interrupted_marks(html, doc):
    assert 'id="interrupted"' not in html and "INTERRUPTED" not in html
    assert "Interrupted" not in render_md.render(doc)
