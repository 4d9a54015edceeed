"""The fleet_report action run by ansible-playbook for real: one node healthy (local connection), one unreachable
(ssh to a closed port), one with a bad inventory threshold; check the files, the summary, the gate and check mode."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "report" / "sim_burn_in.json"
PLAYBOOK = """
- name: Nodes
  hosts: nodes
  gather_facts: false
  tasks:
    - name: Enter the stage
      ansible.builtin.set_fact:
        gpufleet_stage: facts
    - name: Reach the node (node-down is unreachable here)
      ansible.builtin.ping:
    - name: Done
      ansible.builtin.set_fact:
        gpufleet_stage: done
    - name: Report, keeping the result even when the gate fails
      run_once: true
      delegate_to: localhost
      block:
        - name: Report
          kentino.gpufleet.fleet_report:
            playbook: action_test
            run_id: "{{ run_id }}"
            report_dir: "{{ report_dir }}"
            fail_on: "{{ fail_on }}"
            fail_task: "{{ fail_task | default(true) }}"
            show_summary: "{{ show_summary | default(false) }}"
          register: gpufleet_report
      always:
        - name: Keep the result for the test
          ansible.builtin.copy:
            content: "{{ gpufleet_report | to_json }}"
            dest: "{{ report_dir }}/result-{{ run_id }}.json"
            mode: "0644"
          check_mode: false
"""


def _write_inventory(tmp_path):
    hosts = json.loads(FIXTURE.read_text())["hosts"]
    healthy = dict(hosts["sim-node02"])
    healthy.pop("ansible_facts")
    for key in ("gpufleet_stage", "gpufleet_completed"):
        healthy.pop(key)
    hv_dir = tmp_path / "host_vars"
    hv_dir.mkdir()
    (hv_dir / "node-ok.json").write_text(json.dumps(healthy))
    bad = dict(healthy, gpufleet_temp_max_c="85C")
    (hv_dir / "node-badvar.json").write_text(json.dumps(bad))
    (tmp_path / "hosts.ini").write_text(
        "[nodes]\n"
        "node-ok ansible_connection=local ansible_python_interpreter=%s\n"
        "node-down ansible_host=127.0.0.1 ansible_port=1 ansible_connection=ssh ansible_user=nobody\n"
        "node-badvar ansible_connection=local ansible_python_interpreter=%s\n"
        "[all:vars]\nansible_python_interpreter=%s\n" % (sys.executable, sys.executable, sys.executable))
    (tmp_path / "play.yml").write_text(PLAYBOOK)


def _run(tmp_path, run_id, fail_on="fail", check=False, extra=()):
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "hosts.ini"),
           str(tmp_path / "play.yml"), "-e", "run_id=%s" % run_id, "-e", "report_dir=%s" % (tmp_path / "reports"),
           "-e", "fail_on=%s" % fail_on]
    for item in extra:
        cmd += ["-e", item]
    if check:
        cmd.append("--check")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
               ANSIBLE_SSH_ARGS="-o ConnectTimeout=3 -o BatchMode=yes", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=240)
    result_file = tmp_path / "reports" / ("result-%s.json" % run_id)
    result = json.loads(result_file.read_text()) if result_file.exists() else None
    return proc, result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("action")
    _write_inventory(tmp_path)
    first = _run(tmp_path, "run-1")
    second = _run(tmp_path, "run-2", fail_on="never")
    checked = _run(tmp_path, "run-check", check=True)
    return tmp_path, first, second, checked


@pytest.fixture(scope="module")
def run_without_failing(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("action-nofail")
    _write_inventory(tmp_path)
    return _run(tmp_path, "run-nofail", extra=["fail_task=false", "show_summary=true"])


def test_report_written_and_gate_fails(runs):
    tmp_path, (proc, result), _, _ = runs
    assert result is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode != 0, "the gate must fail the play: node-down is unreachable"
    assert result["failed"] is True
    assert result["nodes"] == {"node-ok": "pass", "node-down": "unreachable", "node-badvar": "error"}
    assert "node-down" in result["msg"] and "node-badvar" in result["msg"] and "node-ok" not in result["msg"]
    run_dir = tmp_path / "reports" / "run-1"
    for name in ("report.json", "report.md", "report.html", "junit.xml"):
        assert (run_dir / name).is_file(), name
    assert result["html_path"] == str(run_dir / "report.html")
    doc = json.loads((run_dir / "report.json").read_text())
    down = next(n for n in doc["nodes"] if n["host"] == "node-down")
    assert down["stage"] == "facts" and down["reachable"] is False
    assert "| node-down | UNREACHABLE | facts |" in result["summary_md"]
    assert result["gate_failed"] is True


def test_gate_failure_without_failing_the_task_prints_the_summary_once(run_without_failing):
    proc, result = run_without_failing
    assert proc.returncode == 4, "only node-down's unreachability fails the play, not the gate: %s" % (
        proc.stdout[-3000:])
    assert result.get("failed") is not True and result["gate_failed"] is True
    assert result["failing_nodes"] == ["node-down", "node-badvar"] and "node-down" in result["msg"]
    # show_summary prints the table as plain lines (not a JSON or YAML string), and once.
    assert proc.stdout.count("| node | verdict | stage | worst finding | action |") == 1
    assert "\n| node-down | UNREACHABLE | facts |" in proc.stdout
    assert "HTML report: %s" % result["html_path"] in proc.stdout


def test_config_error_names_host_variable_and_type(runs):
    _, (_, result), _, _ = runs
    errors = result["config_errors"]
    assert len(errors) == 1
    assert "node-badvar" in errors[0] and "gpufleet_temp_max_c" in errors[0] and "a number" in errors[0]
    assert "'85C'" in errors[0]


def test_latest_link_follows_the_last_written_run(runs):
    tmp_path, _, (proc, result), _ = runs
    assert result is not None, proc.stdout[-3000:]
    assert result.get("failed") is not True, "fail_on=never never fails the task"
    assert result["failing_nodes"] == []
    latest = tmp_path / "reports" / "latest"
    assert latest.is_symlink() and os.readlink(latest) == "run-2"
    assert (tmp_path / "reports" / "run-1" / "report.json").is_file(), "the previous run stays intact"


def test_check_mode_writes_nothing(runs):
    tmp_path, _, _, (proc, result) = runs
    assert result is not None, proc.stdout[-3000:]
    assert "run_dir" not in result and "html_path" not in result
    assert not (tmp_path / "reports" / "run-check").exists()
    assert result["msg"].startswith("check mode, no files written")
    assert result["nodes"]["node-down"] == "unreachable", "check mode still judges"


def test_an_empty_fleet_fails_instead_of_passing(tmp_path):
    (tmp_path / "hosts.ini").write_text("[nodes]\n")
    (tmp_path / "play.yml").write_text(
        "- name: Report\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Report\n      kentino.gpufleet.fleet_report:\n"
        "        hosts: \"{{ query('inventory_hostnames', 'nodes') }}\"\n"
        "        report_dir: \"%s\"\n" % (tmp_path / "reports"))
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "hosts.ini"),
                           str(tmp_path / "play.yml")], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1"))
    assert proc.returncode == 2
    assert "matched no host" in proc.stdout
    assert not (tmp_path / "reports").exists()


def test_a_report_that_cannot_be_written_still_reaches_the_console_and_a_fallback_file(tmp_path):
    """The directory was checked before the run, and then vanished or went read-only: the verdicts are not lost."""
    _write_inventory(tmp_path)
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "hosts.ini"),
           str(tmp_path / "play.yml"), "-e", "run_id=run-lost", "-e", "report_dir=/proc/gpufleet-no-such-dir",
           "-e", "fail_on=never"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
               ANSIBLE_SSH_ARGS="-o ConnectTimeout=3 -o BatchMode=yes", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode != 0
    assert "The verdicts are not lost" in proc.stdout and "| node-ok | PASS |" in proc.stdout, proc.stdout[-3000:]
    fallback = Path(tempfile.gettempdir()) / "gpufleet-report-run-lost.json"
    assert fallback.exists() and json.loads(fallback.read_text())["run_id"] == "run-lost"
    fallback.unlink()
