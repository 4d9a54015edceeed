"""`gpufleet plan`: the cadence of a recorded preflight's report, command-line values over the report's, the exit
codes, and the other subcommands still there."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import cadence, report

REPO = Path(__file__).resolve().parents[3]


def gpufleet(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "gpufleet_cli.main"] + list(args), cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(REPO), "COLUMNS": "160", "PATH": "/usr/bin"})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    hosts = json.loads((REPO / "tests" / "fixtures" / "report" / "sim_preflight.json").read_text())["hosts"]
    doc = report.build_report(report.evaluate_fleet(list(hosts), hosts), "20260101T000000Z-abcdef", "preflight")
    doc["cadence"] = cadence.report_section(doc, hosts, history={})
    out = tmp_path_factory.mktemp("reports")
    (out / "report.json").write_text(json.dumps(doc))
    return out


def test_plan_from_arguments_matches_the_pure_function():
    r = gpufleet("plan", "--gpus", "8", "--checkpoint-gb", "14", "--write-mb-s", "2800", "--interval-min", "30",
                 "--price", "2", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = cadence.plan(8, 50000.0, 5.0, 30, 2.0, 2)
    for key in ("optimal_interval_min", "interruptions_per_day", "current", "optimal", "saving_per_day"):
        assert got[key] == want[key]
    assert got["inputs"]["failure_source"].startswith("the default")


def test_plan_from_a_report_and_overrides(run_dir):
    r = gpufleet("plan", "--report", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    section = json.loads((run_dir / "report.json").read_text())["cadence"]
    assert got["inputs"]["gpus"] == section["inputs"]["gpus"] > 0
    assert got["optimal_interval_min"] == section["optimal_interval_min"]
    assert got["inputs"]["slowest_node"] == section["inputs"]["slowest_node"]
    # twice the write speed halves the write time of the same checkpoint; a price adds the cost
    r = gpufleet("plan", "--report", str(run_dir), "--write-mb-s", str(2 * section["inputs"]["write_mb_per_s"]),
                 "--price", "1.5", "--gpu-hours-per-failure", "20000", "--json")
    faster = json.loads(r.stdout)
    assert faster["checkpoint_write_s"] == pytest.approx(section["checkpoint_write_s"] / 2, rel=1e-3)
    assert faster["inputs"]["failure_source"] == "inventory gpufleet_failure_gpu_hours"
    assert faster["current"]["cost_per_day"] == pytest.approx(1.5 * faster["current"]["lost_gpu_hours_per_day"],
                                                              abs=0.01)
    shown = gpufleet("plan", "--report", str(run_dir / "report.json"))
    assert shown.returncode == 0 and "optimal interval (Young)" in shown.stdout and "GPU time lost a day" in shown.stdout


def test_missing_inputs_exit_1_and_a_bad_report_exits_2(tmp_path):
    r = gpufleet("plan", "--gpus", "8", cwd=tmp_path)  # no report here, no write speed
    assert r.returncode == 1 and "Missing: the checkpoint write time" in r.stdout
    (tmp_path / "broken.json").write_text("{not json")
    r = gpufleet("plan", "--report", str(tmp_path / "broken.json"))
    assert r.returncode == 2 and "cannot read the report" in r.stderr


def test_the_other_subcommands_are_still_there():
    r = gpufleet("--help")
    assert r.returncode == 0
    for command in ("run", "abort", "report", "postmortem", "plan"):
        assert command in r.stdout
