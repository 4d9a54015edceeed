"""The gpufleet command: extra-vars parsing, the report table, and a real run through ansible-runner."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet_cli.main import parse_extra

REPO = Path(__file__).resolve().parents[3]
# `python -m` with this checkout on the path: the code under test, wherever the installed script points.
GPUFLEET_CMD = [sys.executable, "-m", "gpufleet_cli.main"]


def test_extra_vars_forms(tmp_path):
    f = tmp_path / "vars.yml"
    f.write_text("gpufleet_burn_duration_s: 3600\n")
    assert parse_extra(["a=1", "b=text", '{"c": [1, 2]}', "@%s" % f]) == {
        "a": 1, "b": "text", "c": [1, 2], "gpufleet_burn_duration_s": 3600}
    with pytest.raises(SystemExit):
        parse_extra(["no-equals-sign"])


def test_run_preflight_on_one_sim_node_through_ansible_runner(tmp_path):
    # The command of this checkout (the installed `gpufleet` script may come from another one), its output piped as
    # in CI or `| tee`: Ansible's output as it comes, then the report table once, no colour codes, no CR LF.
    env = {k: v for k, v in os.environ.items() if k not in ("ANSIBLE_NOCOLOR", "ANSIBLE_FORCE_COLOR", "FORCE_COLOR")}
    env.update(GPUFLEET_SIM_STATE_ROOT=str(tmp_path / "state"), COLUMNS="200", PYTHONPATH=str(REPO))
    proc = subprocess.run(GPUFLEET_CMD + ["run", "preflight", "-i", "inventories/sim", "-l", "sim-node07",
                                         "-e", "gpufleet_fail_on=warn", "--report-dir", str(tmp_path / "reports")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    # sim-node07 runs a neighbour process: at fail_on=warn the gate fails and so does the command.
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sim-node07" in proc.stdout and "GPU_BUSY" in proc.stdout + json.dumps(
        json.loads((tmp_path / "reports" / "latest" / "report.json").read_text()))
    assert (tmp_path / "reports" / ".runner").is_dir()  # ansible-runner's event record of the run
    assert "TASK [" in proc.stdout and "PLAY RECAP" in proc.stdout, "Ansible's output is shown"
    assert "\x1b[" not in proc.stdout + proc.stderr, "colour codes in piped output"
    assert "\r" not in proc.stdout
    assert proc.stdout.count("worst finding") == 1, "the summary table is printed once"
    assert proc.stdout.index("PLAY RECAP") < proc.stdout.index("worst finding")
    assert "gate fail_on=warn: 1 of 1 node(s) failed it: sim-node07" in proc.stdout
    shown = subprocess.run(GPUFLEET_CMD + ["report", str(tmp_path / "reports" / "latest")], cwd=REPO,
                           capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 2 and "FAILED: sim-node07" in shown.stdout and "\x1b[" not in shown.stdout


def test_quiet_run_prints_only_the_table(tmp_path):
    env = dict(os.environ, GPUFLEET_SIM_STATE_ROOT=str(tmp_path / "state"), COLUMNS="200", PYTHONPATH=str(REPO))
    proc = subprocess.run(GPUFLEET_CMD + ["run", "preflight", "-i", "inventories/sim", "-l", "sim-node01",
                                         "--report-dir", str(tmp_path / "reports"), "-q"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "TASK [" not in proc.stdout and "sim-node01" in proc.stdout and "Gate (fail_on=fail): passed" in proc.stdout
