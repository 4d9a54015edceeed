"""bench/fleet_burnin.py's split of the fleet's added time by task: the callback records each task's wall, and the
split joins the two runs by play, task and occurrence (never by position), keeps the repository's own callbacks on."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))
import fleet_burnin  # noqa: E402

PLAYBOOK = """
- name: one
  hosts: localhost
  gather_facts: false
  tasks:
    - name: wait
      ansible.builtin.command: sleep 0.3
      changed_when: false
    - name: quick
      ansible.builtin.debug:
        msg: hi
    - name: wait
      ansible.builtin.command: sleep 0.1
      changed_when: false
"""


def test_the_callback_records_each_tasks_wall_by_play_task_and_occurrence(tmp_path):
    (tmp_path / "pb.yml").write_text(PLAYBOOK)
    out = tmp_path / "walls.json"
    env = {k: v for k, v in os.environ.items() if k != "ANSIBLE_CONFIG"}
    env.update(ANSIBLE_CALLBACK_PLUGINS=str(REPO / "bench" / "callback_plugins"), ANSIBLE_CALLBACKS_ENABLED="task_walls",
               TASK_WALLS_OUT=str(out), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=%s" % sys.executable, str(tmp_path / "pb.yml")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [r[:3] for r in rows] == [["one", "wait", 1], ["one", "quick", 1], ["one", "wait", 2]]
    assert rows[0][3] >= 0.3 and rows[2][3] >= 0.1


def test_the_split_joins_the_runs_by_identity_and_sorts_by_the_time_added():
    one = [["p", "facts", 1, 0.5], ["p", "burn", 1, 120.0], ["p", "report", 1, 0.5]]
    many = [["p", "report", 1, 8.5], ["p", "burn", 1, 135.0], ["p", "facts", 1, 5.5], ["p", "only here", 1, 1.0]]
    lines = fleet_burnin.task_split(one, many, top=2)
    assert "+15.0s  burn" in lines[1] and "+8.0s  report" in lines[2]
    assert lines[-1].endswith("all 3 tasks (not in both runs: 1)")
    assert "+28.0s" in lines[-1]  # 15 + 8 + 5


def test_the_bench_keeps_the_callbacks_the_repositorys_ansible_cfg_enables():
    assert "kentino.gpufleet.run_record" in fleet_burnin.configured_callbacks()
