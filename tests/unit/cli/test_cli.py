"""The gpufleet command: extra-vars parsing, the report table, and a real run through ansible-runner."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet_cli.main import parse_extra

REPO = Path(__file__).resolve().parents[3]
GPUFLEET = Path(sys.executable).with_name("gpufleet")


def test_extra_vars_forms(tmp_path):
    f = tmp_path / "vars.yml"
    f.write_text("gpufleet_burn_duration_s: 3600\n")
    assert parse_extra(["a=1", "b=text", '{"c": [1, 2]}', "@%s" % f]) == {
        "a": 1, "b": "text", "c": [1, 2], "gpufleet_burn_duration_s": 3600}
    with pytest.raises(SystemExit):
        parse_extra(["no-equals-sign"])


@pytest.mark.skipif(not GPUFLEET.exists(), reason="gpufleet is installed by `make venv`")
def test_run_preflight_on_one_sim_node_through_ansible_runner(tmp_path):
    env = dict(os.environ, GPUFLEET_SIM_STATE_ROOT=str(tmp_path / "state"), COLUMNS="200")
    proc = subprocess.run([str(GPUFLEET), "run", "preflight", "-i", "inventories/sim", "-l", "sim-node07",
                           "-e", "gpufleet_fail_on=warn", "--report-dir", str(tmp_path / "reports"), "-q"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    # sim-node07 runs a neighbour process: at fail_on=warn the gate fails and so does the command.
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sim-node07" in proc.stdout and "GPU_BUSY" in proc.stdout + json.dumps(
        json.loads((tmp_path / "reports" / "latest" / "report.json").read_text()))
    assert (tmp_path / "reports" / ".runner").is_dir()  # ansible-runner's event record of the run
    shown = subprocess.run([str(GPUFLEET), "report", str(tmp_path / "reports" / "latest")], cwd=REPO,
                           capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 2 and "FAILED: sim-node07" in shown.stdout
