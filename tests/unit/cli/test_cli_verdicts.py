"""The CLI's exit codes and table say what the report says: an interrupted run is no pass (exit 3, on main 0), a check
whose stage was switched off is SKIPPED beside the node's PASS (on main a plain PASS)."""

import copy
import json
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.plugin_utils import render_md, report

from gpufleet_cli import commands
from gpufleet_cli.main import main

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "report" / "sim_burn_in.json"


def _report(interrupted=False, switch_off=None):
    hosts = json.loads(FIXTURE.read_text())["hosts"]
    hosts = {h: hosts[h] for h in ("sim-node01", "sim-node02")}  # the healthy ones: a pass
    if switch_off:
        hosts["sim-node01"]["gpufleet_result_" + switch_off] = {"skipped": True, "skip_reason": "disabled: off"}
    if interrupted:
        hosts["sim-node02"].pop("gpufleet_completed", None)
        hosts["sim-node02"].update(gpufleet_stage="burn", gpufleet_interrupted=True)
    nodes = report.evaluate_fleet(list(hosts), copy.deepcopy(hosts))
    return report.build_report(nodes, "20260101T000000Z-abcdef", playbook="burn_in", interrupted=interrupted)


def _write(tmp_path, doc):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_an_interrupted_run_is_never_a_pass(tmp_path, capsys):
    doc = _report(interrupted=True)
    assert doc["fail_on"] == "fail" and doc["summary"]["gate"]["failed"]
    assert main(["report", _write(tmp_path, doc)]) == commands.EXIT_NOT_RUN == commands.exit_code(doc)
    assert "FAILED: the run was interrupted" in capsys.readouterr().out
    assert main(["report", _write(tmp_path, _report())]) == 0


def test_a_switched_off_check_is_skipped_in_every_summary(tmp_path, capsys):
    doc = _report(switch_off="dcgm_diag")
    node = next(n for n in doc["nodes"] if n["host"] == "sim-node01")
    assert node["verdict"] == "pass" and node["skipped"] == ["dcgm_diag"]
    assert "PASS (SKIPPED: dcgm_diag)" in render_md.summary_table(doc)
    assert main(["report", _write(tmp_path, doc)]) == 0
    assert "SKIPPED: dcgm_diag" in capsys.readouterr().out
