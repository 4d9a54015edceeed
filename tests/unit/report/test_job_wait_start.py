"""kentino.gpufleet.job_wait with `start`: the job is started and waited for in one task (one worker per node, no gap
between the start and the first poll in which the run's lease could go stale), as `async` + `poll: 0` would start it;
check mode runs the module synchronously; `omit` removes an option at any depth; a module that cannot start is the
task's failure, with its message; a reason not to run (`skip`) skips the task with that reason and starts nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

PLAY = """
- name: Start and wait in one task
  hosts: nodes
  gather_facts: false
  tasks:
    - name: A job that outlasts one poll, with an omitted option
      kentino.gpufleet.job_wait:
        start:
          module: ansible.builtin.command
          args:
            # 6 s, not 2: under a loaded machine the first poll's own start took 2 s (one poll then sufficed)
            argv: [sh, -c, 'sleep 6; echo "$$ done"']
            chdir: "{{ omit }}"
        label: demo
        poll: 1
        state_dir: "{{ state_dir }}"
        run_id: run-1
      register: __job

    - name: A module that refuses its options fails the task
      block:
        - name: Start gpu_burn for 0 s
          kentino.gpufleet.job_wait:
            start:
              module: kentino.gpufleet.gpu_burn
              args:
                duration: 0
            poll: 1
      rescue:
        - name: Keep the failure
          ansible.builtin.set_fact:
            __refused: "{{ ansible_failed_result }}"

    - name: A job with a reason not to run is skipped with that reason and starts nothing
      kentino.gpufleet.job_wait:
        start:
          module: ansible.builtin.command
          args:
            argv: [touch, "{{ out_dir }}/{{ inventory_hostname }}.started"]
        skip: "{{ 'disabled: gpufleet_dcgm_enabled is false' if inventory_hostname == 'node1' else '' }}"
        poll: 1
      register: __skipped

    - name: Keep the results
      check_mode: false
      ansible.builtin.copy:
        content: "{{ {'job': __job, 'refused': __refused, 'skipped': __skipped} | to_json }}"
        dest: "{{ out_dir }}/{{ inventory_hostname }}.json"
        mode: "0600"
      delegate_to: localhost
"""


def _play(tmp_path, *args, home=None):
    (tmp_path / "hosts.ini").write_text("[nodes]\n" + "".join(
        "node%d ansible_connection=local ansible_python_interpreter=%s\n" % (i, sys.executable) for i in (1, 2)))
    (tmp_path / "play.yml").write_text(PLAY)
    env = {k: v for k, v in os.environ.items() if k not in ("ANSIBLE_NOCOLOR", "ANSIBLE_FORCE_COLOR")}
    env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false")
    if home is not None:
        env["HOME"] = str(home)
    extra = {"state_dir": str(tmp_path / "state"), "out_dir": str(tmp_path)}
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "hosts.ini"),
                           str(tmp_path / "play.yml"), "-e", json.dumps(extra)] + list(args), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {n: json.loads((tmp_path / ("%s.json" % n)).read_text()) for n in ("node1", "node2")}, proc.stdout


@pytest.mark.parametrize("mode", ["run", "check"])
def test_start_and_wait_in_one_task(tmp_path, mode):
    results, output = _play(tmp_path, *(["--check"] if mode == "check" else []))
    for node, got in results.items():
        job, refused = got["job"], got["refused"]
        if mode == "check":
            # command does not run in check mode: the module's own answer, no job started
            assert job.get("skipped") or "check mode" in str(job.get("msg")), job
            assert "polls" not in job
        else:
            assert job["finished"] is True and job["rc"] == 0 and job["stdout"].endswith(" done"), job
            assert job["polls"] >= 2, "a 6 s job with 1 s polls is waited for on the node, more than once"
            assert job["cmd"] == ["sh", "-c", 'sleep 6; echo "$$ done"'], job
            # the lease of the run was refreshed by the polls
            assert (tmp_path / "state" / "runs" / "run-1" / "lease").exists(), node
        assert refused["failed"] is True and "duration must be at least 1 second" in refused["msg"], refused
    skipped = results["node1"]["skipped"]
    assert skipped["skipped"] is True and skipped["skip_reason"] == "disabled: gpufleet_dcgm_enabled is false"
    assert not (tmp_path / "node1.started").exists() and "polls" not in skipped
    if mode == "run":  # an empty reason starts the job
        assert results["node2"]["skipped"]["finished"] is True and (tmp_path / "node2.started").exists()
    assert "UNREACHABLE" not in output


def test_the_wait_reads_the_job_where_the_wrapper_wrote_it(tmp_path):
    """A controller whose HOME is not the user's home in the password database (sudo -E, a container, a CI job): the
    async wrapper writes the job's status under $HOME, where `~` for the connection is the other home. The wait reads
    the file the wrapper named, and the job ends as it did, not as "not found"."""
    home = tmp_path / "home"
    home.mkdir()
    results, _output = _play(tmp_path, home=home)
    for node, got in results.items():
        assert got["job"]["finished"] is True and got["job"]["rc"] == 0, (node, got["job"])
    assert (home / ".ansible_async").is_dir(), "the premise: the wrapper wrote under $HOME"
