"""A run the playbook refuses says why on the gpufleet command's own output, not only in ansible-runner's record.

The live view and `run -q` hide Ansible's output: when no report comes out, the failed tasks' messages (here
run_guard's "another run is in progress ... gpufleet abort ... gpufleet_report_dir") are printed, with where the
full output is kept.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def busy_reports(tmp_path):
    """A reports directory whose lock a live ansible-playbook holds (a process whose command line says so)."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "ansible-playbook"])
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / ".gpufleet-run.lock").write_text(json.dumps({
        "pid": holder.pid, "run_id": "20261201T000000Z-0fa1a1", "playbook": "burn_in",
        "started": "2026-12-01T00:00:00+00:00"}))
    yield reports
    holder.kill()
    holder.wait()


@pytest.mark.parametrize("argv", [["preflight"], ["run", "preflight", "-q"]], ids=["live-view", "run-quiet"])
def test_a_refused_run_shows_the_reason(tmp_path, busy_reports, argv):
    env = dict(os.environ, GPUFLEET_SIM_STATE_ROOT=str(tmp_path / "state"), COLUMNS="200", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "gpufleet_cli.main"] + argv + [
        "-i", "inventories/sim", "-l", "sim-node01", "--report-dir", str(busy_reports)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    err = proc.stderr
    assert "another run is in progress: run 20261201T000000Z-0fa1a1" in err, proc.stdout[-2000:] + err
    assert "gpufleet abort" in err and "gpufleet_report_dir" in err
    assert str(busy_reports / ".runner") in err  # where the whole output is kept
    assert not (tmp_path / "state").exists(), "a node was touched"
