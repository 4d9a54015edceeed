"""The gpufleet command's usage errors name the option and exit 2 before any work; options point where they say.

A value out of range is never replaced by a default without a word (`plan --gpu-hours-per-failure 0` planned with
50,000), a missing directory is never read as an empty history, an output file that cannot be written is a message,
not a traceback (a report or handover directory that is a file or under one included); `report --report-dir DIR`
reads DIR, not ./reports; a plan input far outside what it could mean (10^20 GPUs) is refused.
"""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# This checkout's CLI package, not the one the shared venv's editable install points at.
sys.path.insert(0, str(REPO))
for _name in [m for m in sys.modules if m == "gpufleet_cli" or m.startswith("gpufleet_cli.")]:
    del sys.modules[_name]
from gpufleet_cli.main import main  # noqa: E402


def usage_error(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    return exc.value.code, err


@pytest.mark.parametrize("argv", [
    ["plan", "--gpu-hours-per-failure", "0"],
    ["plan", "--gpu-hours-per-failure", "-100"],
    ["plan", "--gpu-hours-per-failure", "nan"],
    ["plan", "--gpu-hours-per-failure", "inf"],
    ["plan", "--restart-min", "-5"],
    ["plan", "--gpus", "-8"],
    ["plan", "--gpus", "0"],
    ["plan", "--gpus", "8.5"],
    ["plan", "--checkpoint-gb", "0"],
    ["plan", "--write-mb-s", "-1"],
    ["plan", "--interval-min", "nan"],
    ["plan", "--price", "-2"],
    ["plan", "--history-dir", "/nonexistent"],
    ["plan", "--gpus", "99999999999999999999"],
    ["plan", "--checkpoint-gb", "1e308"],
    ["plan", "--write-mb-s", "1e-300"],
    ["plan", "--interval-min", "1e-300"],
    ["plan", "--gpu-hours-per-failure", "1e300"],
    ["plan", "--restart-min", "1e300"],
    ["plan", "--price", "1e300"],
    ["history", "--export", "csv", "--out", "/nonexistent/x.csv"],
    ["history", "--history-dir", "/nonexistent"],
    ["history", "n1", "--gpu", "-1"],
    ["history", "--days", "0"],
    ["handover", "n1", "--history-dir", "/nonexistent"],
    ["handover", "n1", "--out", "/dev/null"],
    ["handover", "n1", "--out", "/dev/null/sheets"],
    ["postmortem", "--world-size", "0"],
    ["postmortem", "--since", "yesterday"],
    ["postmortem", "--since", "-2x"],
    ["postmortem", "--since", "-2h", "--until", "2026-13-45"],
    ["run", "preflight", "--report-dir", "/dev/null"],
    ["preflight", "--report-dir", "/dev/null/reports"],
    ["audit", "--report-dir", "/dev/null"],
    ["abort", "--report-dir", "/dev/null"],
    ["postmortem", "--report-dir", "/dev/null"],
    ["quarantine", "n1", "--dry-run", "--report-dir", "/dev/null"],
])
def test_a_bad_value_is_a_usage_error_that_names_the_option(capsys, argv):
    option = [word for word in argv if word.startswith("--")][-1]
    code, err = usage_error(capsys, argv)
    assert code == 2, err
    assert "argument %s" % option in err, err
    assert "Traceback" not in err


def test_an_out_file_that_cannot_be_written_is_a_usage_error_not_a_traceback(capsys, tmp_path):
    (tmp_path / "history").mkdir()
    code, err = usage_error(capsys, ["history", "--export", "csv", "--out", str(tmp_path / "history"),
                                     "--report-dir", str(tmp_path)])
    assert code == 2 and "argument --out" in err and "is a directory" in err, err


def test_good_values_still_plan(capsys):
    assert main(["plan", "--gpus", "64", "--checkpoint-gb", "140", "--write-mb-s", "2500", "--interval-min", "30",
                 "--price", "2.1", "--gpu-hours-per-failure", "20000", "--restart-min", "0", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["inputs"]["gpu_hours_per_failure"] == 20000 and plan["inputs"]["restart_min"] == 0


def _report(run_dir, run_id, host):
    run_dir.mkdir(parents=True)
    (run_dir / "report.json").write_text(json.dumps({
        "run_id": run_id, "playbook": "audit", "nodes": [
            {"host": host, "verdict": "pass", "stage": "done", "worst": None, "action": "none"}],
        "summary": {"gate": {"fail_on": "fail", "failed": False, "nodes": []}}}))
    (run_dir.parent / "latest").symlink_to(run_dir.name)


def test_report_reads_the_report_dir_it_is_given(capsys, tmp_path, monkeypatch):
    _report(tmp_path / "reports" / "20261201T000000Z-aaaaaa", "20261201T000000Z-aaaaaa", "node-here")
    _report(tmp_path / "elsewhere" / "20261202T000000Z-bbbbbb", "20261202T000000Z-bbbbbb", "node-there")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["report", "--report-dir", str(tmp_path / "elsewhere")]) == 0
    out = capsys.readouterr().out
    assert "node-there" in out and "node-here" not in out, out
    assert main(["report"]) == 0
    assert "node-here" in capsys.readouterr().out


def test_a_clone_whose_collection_ansible_cannot_find_is_said_before_any_run(tmp_path):
    from gpufleet_cli.main import collection_problem

    assert collection_problem(REPO) is None
    assert "no clone of kentino.gpufleet at %s" % tmp_path in collection_problem(tmp_path)
    (tmp_path / "galaxy.yml").write_text("namespace: kentino\n")
    (tmp_path / "playbooks").mkdir()
    broken = collection_problem(tmp_path)
    assert "collections/ansible_collections/kentino/gpufleet does not lead back to the clone" in broken
    assert "checkout -- collections" in broken
    link = tmp_path / "collections" / "ansible_collections" / "kentino"
    link.mkdir(parents=True)
    (link / "gpufleet").symlink_to("../../..")
    assert collection_problem(tmp_path) is None


def test_a_report_dir_given_as_an_extra_var_is_checked_as_the_option_is(capsys):
    code, err = usage_error(capsys, ["preflight", "-e", "gpufleet_report_dir=/dev/null"])
    assert code == 2 and "argument -e gpufleet_report_dir: /dev/null exists and is not a directory" in err, err


@pytest.mark.parametrize("extra, problem", [
    ("@/nonexistent/vars.yml", "cannot read /nonexistent/vars.yml: No such file or directory"),
    ("{bad json", "not a JSON object"),
    ("=5", "'' is not a variable name"),
    ("gpufleet burn=60", "'gpufleet burn' is not a variable name"),
    ("no-equals-sign", "use KEY=VALUE, a JSON object, or @file"),
    ("[1, 2]", "use KEY=VALUE"),
])
def test_an_extra_var_that_cannot_be_read_is_a_usage_error(capsys, extra, problem):
    code, err = usage_error(capsys, ["preflight", "-e", extra])
    assert code == 2 and "argument -e" in err and problem in err, err
    assert "Traceback" not in err


def test_extra_vars_from_a_file_that_is_not_yaml_or_not_a_mapping(capsys, tmp_path):
    (tmp_path / "list.yml").write_text("- a\n- b\n")
    (tmp_path / "bad.yml").write_text("key: [unclosed\n")
    code, err = usage_error(capsys, ["burn-in", "-e", "@%s" % (tmp_path / "list.yml")])
    assert code == 2 and "does not give a mapping of variables" in err, err
    code, err = usage_error(capsys, ["burn-in", "-e", "@%s" % (tmp_path / "bad.yml")])
    assert code == 2 and "is not YAML or JSON" in err, err


@pytest.mark.parametrize("argv", [
    ["preflight", "-i", "/nonexistent/hosts.yml"],
    ["run", "audit", "-i", "/nonexistent/hosts.yml"],
    ["abort", "-i", "/nonexistent/hosts.yml"],
    ["postmortem", "-i", "/nonexistent/hosts.yml"],
    ["quarantine", "n1", "-i", "/nonexistent/hosts.yml"],
])
def test_a_missing_inventory_is_a_usage_error_not_no_hosts_matched(capsys, argv):
    code, err = usage_error(capsys, argv)
    assert code == 2 and "argument -i/--inventory: /nonexistent/hosts.yml does not exist" in err, err


def test_a_relative_time_as_the_docs_give_it_is_a_value_not_an_option(capsys):
    # `--since -2h` (argparse alone: "expected one argument"); the usage error that follows is --world-size's, so
    # --since and --until were read
    code, err = usage_error(capsys, ["postmortem", "--since", "-2h", "--until", "-30m", "--world-size", "0"])
    assert code == 2 and "argument --world-size" in err, err
    assert "argument --since" not in err and "argument --until" not in err, err
