"""Checkpoint cadence (plugins/plugin_utils/cadence.py) against values computed by hand, the failure rate's sources,
and the report section built from a recorded preflight (tests/fixtures/report/sim_preflight.json): valid against
report_schema.json, rendered in report.md and report.html."""

import json
import math
import time
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import (
    cadence,
    render_html,
    render_md,
    report,
    report_format,
)

REPO = Path(__file__).resolve().parents[3]


def test_single_8_gpu_node_by_hand():
    # 8 GPUs at 1 failure per 50,000 GPU-hours: MTBF 6,250 h = 22.5e6 s, 0.00384 interruptions a day.
    # 14 GB at 2,800 MB/s: 5 s. Young: sqrt(2 x 5 x 22.5e6) = 15,000 s = 250 min.
    p = cadence.plan(8, 50000, cadence.checkpoint_write_s(14, 2800), interval_min=30, restart_min=2, price=2.0)
    assert p["status"] == "ok" and p["missing"] == []
    assert p["mtbf_hours"] == 6250 and p["interruptions_per_day"] == pytest.approx(0.00384)
    assert p["checkpoint_write_s"] == 5.0 and p["optimal_interval_min"] == 250.0
    # at 30 min: 5/1800 writing + (900 + 120)/22.5e6 redone = 0.0028231...; x 8 x 24 = 0.54204 GPU-hours a day
    assert p["current"]["checkpoint_overhead_pct"] == pytest.approx(100 * 5 / 1800, abs=1e-4)
    assert p["current"]["lost_gpu_hours_per_day"] == pytest.approx(192 * (5 / 1800 + 1020 / 22.5e6), abs=1e-3)
    assert p["current"]["lost_gpu_hours_per_day"] == pytest.approx(0.542, abs=1e-3)
    assert p["current"]["cost_per_day"] == pytest.approx(1.08, abs=0.01)
    assert p["current"]["worst_case_lost_min"] == 32.0
    # at 250 min: 5/15000 + (7500 + 120)/22.5e6 = 6.72e-4; x 192 = 0.129 GPU-hours a day
    assert p["optimal"]["lost_gpu_hours_per_day"] == pytest.approx(0.129, abs=1e-3)
    assert p["saving_gpu_hours_per_day"] == pytest.approx(0.413, abs=1e-3)
    assert p["saving_per_day"] == pytest.approx(0.83, abs=0.01)
    # Daly: 15000 x (1 + sqrt(x)/3 + x/9) - 5 with x = 5 / 45e6
    assert p["daly_interval_min"] == pytest.approx(14996.67 / 60, abs=0.01)


def test_llama3_scale():
    # 16,384 GPUs: 7.86 interruptions a day (the paper saw 419 in 54 days = 7.76); MTBF 3.05 h
    p = cadence.plan(16384, 50000)
    assert p["interruptions_per_day"] == pytest.approx(7.864, abs=1e-3) and p["mtbf_hours"] == pytest.approx(3.0518,
                                                                                                             abs=1e-3)
    assert p["status"] == "incomplete" and "write time" in p["missing"][0]
    # 1,024 GPUs, 140 GB at 2 GB/s = 70 s: sqrt(2 x 70 x 175,781.25 s) = 4,960.8 s = 82.7 min
    p = cadence.plan(1024, 50000, cadence.checkpoint_write_s(140, 2000), interval_min=60)
    assert p["optimal_interval_min"] == pytest.approx(4960.78 / 60, abs=0.01)
    # at 60 min: 24,576 GPU-hours a day x (70/3600 + (1800 + 120)/175,781.25)
    assert p["current"]["lost_gpu_hours_per_day"] == pytest.approx(24576 * (70 / 3600 + 1920 / 175781.25), abs=0.01)
    # the optimum is the minimum of W: both sides of it lose more
    mtbf_s = 50000 / 1024 * 3600
    w = [sum(cadence.lost_share(t, 70, mtbf_s, 120)) for t in (4000, 4960.78, 6000)]
    assert w[1] < w[0] and w[1] < w[2]


def test_missing_or_bad_inputs_never_raise():
    assert cadence.plan(0, 50000)["status"] == "incomplete"
    assert cadence.plan("8", None)["missing"][1].startswith("a failure rate")
    p = cadence.plan(8, 50000, 5.0)
    assert p["status"] == "ok" and p["current"] is None and "current checkpoint interval" in p["missing"][0]
    assert cadence.plan(8, 50000, float("nan"))["status"] == "incomplete"
    assert cadence.plan(8, 50000, 5.0, 30, price=-1)["current"]["cost_per_day"] is None


@pytest.mark.parametrize("inventory, history, expected, words", [
    (20000, {"failures": 9, "gpu_hours": 1e6}, 20000, "inventory"),
    (None, {"failures": 3, "gpu_hours": 150000, "window_days": 90}, 50000, "audit history: 3 interruption(s)"),
    (None, {"failures": 10, "gpu_hours": 100000, "window_days": 30}, 150000 / 11, "audit history"),
    (None, {"failures": 0, "gpu_hours": 0}, 50000, "audit history: 0"),  # no history yet: the default
    (None, {"failures": "x"}, 50000, "the default"),
    (None, None, 50000, "the default, from Llama 3 405B training"),
])
def test_failure_rate_sources(inventory, history, expected, words):
    rate, source = cadence.failure_rate(inventory, history)
    assert rate == pytest.approx(expected) and words in source


def test_history_observations_from_a_real_history(tmp_path):
    """The plan reads the fleet's own rate from the history file the report writes; a file that is not a history is
    a note, never a lost report."""
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, default_path

    assert cadence.history_observations(None) == (None, "no gpufleet_history_dir")
    assert cadence.history_observations(str(tmp_path)) == (None, "no GPU-hours in the history yet")
    now = time.time()
    with History(default_path(tmp_path)) as h:
        for day, host_up in ((2, 1), (1, 1), (0, 0)):
            ts = now - day * 86400.0
            h.record({"run_id": "r%d" % day, "playbook": "audit", "started": None, "finished": None, "ts": ts,
                      "verdict": "pass"},
                     [{"host": "n1", "ts": ts, "verdict": "pass" if host_up else "unreachable", "reachable": host_up,
                       "gpu_count": 8, "gpus": [], "xids": [], "baselines": [], "doc": None}])
    obs, why = cadence.history_observations(str(tmp_path))
    assert why is None and obs["failures"] == 1 and obs["gpu_hours"] == pytest.approx(8 * 48, abs=0.1)
    rate, source = cadence.failure_rate(None, obs)
    assert rate == pytest.approx((384 + 50000) / 2, abs=1) and "audit history: 1 interruption" in source
    (tmp_path / "foreign").mkdir()
    with open(default_path(tmp_path / "foreign"), "w") as fh:
        fh.write("not a database " * 20)
    obs, why = cadence.history_observations(str(tmp_path / "foreign"))
    assert obs is None and why.startswith("the history could not be read:")


@pytest.fixture(scope="module")
def preflight():
    recorded = json.loads((REPO / "tests" / "fixtures" / "report" / "sim_preflight.json").read_text())
    hosts = recorded["hosts"]
    nodes = report.evaluate_fleet(list(hosts), hosts)
    return report.build_report(nodes, "20260101T000000Z-abcdef", playbook="preflight"), hosts


def test_report_section_from_a_recorded_preflight(preflight):
    doc, hosts = preflight
    section = cadence.report_section(doc, hosts, history={})
    slowest = max((n["checks"]["checkpoint_storage"]["figures"]["estimated_checkpoint_s"], n["host"])
                  for n in doc["nodes"] if (n["checks"].get("checkpoint_storage") or {}).get("figures", {}).get(
                      "estimated_checkpoint_s"))
    assert section["status"] == "ok", section
    gpus = sum(len(n["gpus"]) for n in doc["nodes"])
    assert section["inputs"]["gpus"] == doc["summary"]["gpus"] == gpus
    assert section["inputs"]["slowest_node"] == slowest[1] and section["checkpoint_write_s"] == pytest.approx(
        slowest[0], abs=1e-3)
    assert section["inputs"]["interval_min"] == 30.0 and section["inputs"]["failure_source"].startswith("the default")
    mtbf_s = 50000 / gpus * 3600
    assert section["optimal_interval_min"] == pytest.approx(math.sqrt(2 * slowest[0] * mtbf_s) / 60, rel=1e-3)
    doc = dict(doc, cadence=section)
    report.validate_report(doc)
    md = render_md.render(doc)
    assert "## Checkpoint cadence" in md and "Young's optimal interval: %.1f min" % section["optimal_interval_min"] in md
    html = render_html.render(doc)
    shown = report_format.number(section["optimal_interval_min"], 1)  # as report.html writes figures: 165.0 is "165"
    assert 'id="checkpoint-cadence"' in html and "%s min" % shown in html


def test_inventory_settings_win(preflight):
    doc, hosts = preflight
    hosts = {h: dict(v, gpufleet_failure_gpu_hours="20000", gpufleet_gpu_hour_price=3, gpufleet_cadence_gpus=16)
             for h, v in hosts.items()}
    section = cadence.report_section(doc, hosts, history={"failures": 99, "gpu_hours": 1.0})
    assert section["inputs"]["gpu_hours_per_failure"] == 20000 and section["inputs"]["gpus"] == 16
    assert section["current"]["cost_per_day"] == pytest.approx(3 * section["current"]["lost_gpu_hours_per_day"],
                                                               abs=0.01)


def test_without_a_write_speed_the_section_says_what_is_missing(preflight):
    doc, hosts = preflight
    bare = dict(doc, nodes=[dict(n, checks={k: v for k, v in n["checks"].items() if k != "checkpoint_storage"})
                            for n in doc["nodes"]])
    section = cadence.report_section(bare, hosts, history={})
    assert section["status"] == "incomplete" and section["interruptions_per_day"] == pytest.approx(
        24 * sum(len(n["gpus"]) for n in doc["nodes"]) / 50000)
    report.validate_report(dict(bare, cadence=section))
    assert "Not computed: the checkpoint write time" in render_md.render(dict(bare, cadence=section))
    err = cadence.error_section(ValueError("boom"))
    report.validate_report(dict(bare, cadence=err))
    assert "could not be computed: boom" in render_html.render(dict(bare, cadence=err))
