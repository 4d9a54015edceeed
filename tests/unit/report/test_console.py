"""What the console shows while a fleet runs: job_wait's progress lines with several nodes (one aligned block per
round, the same elapsed time on every node's line, how far past the plan a check is), and no colour codes when the
output is piped even without ANSIBLE_NOCOLOR."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.action.job_wait import progress_line, span_text

REPO = Path(__file__).resolve().parents[3]
HOSTS = ["gpu-node-%02d" % i for i in range(1, 9)] + ["dgx-h100-long-name-09"]
LINE = re.compile(r"^  (?P<host>\S+) *  (?P<label>gpu_burn) running: (?P<rest>.*)$")


@pytest.mark.parametrize("seconds,text", [(0, "0 s"), (59, "59 s"), (60, "1 min"), (90, "1 min 30 s"),
                                          (3600, "1 h"), (3960, "1 h 6 min")])
def test_span_text(seconds, text):
    assert span_text(seconds) == text


def test_progress_line_reads_elapsed_of_planned_and_overrun():
    assert progress_line("gpu-node-01", 21, "gpu_burn", 60, 600) == \
        "  gpu-node-01            gpu_burn running: 1 min of 10 min planned (10%)"
    assert progress_line("gpu-node-01", 11, "gpu_burn", 720, 600) == \
        "  gpu-node-01  gpu_burn running: 12 min, 2 min past the 10 min planned"
    assert progress_line("n1", 2, "dcgmi diag", 120, 0) == "  n1  dcgmi diag running: 2 min"


@pytest.fixture(scope="module")
def nine_node_wait(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("job_wait")
    (tmp / "hosts.ini").write_text("[nodes]\n" + "".join(
        "%s ansible_connection=local ansible_python_interpreter=%s\n" % (h, sys.executable) for h in HOSTS))
    (tmp / "play.yml").write_text("""
- name: Wait for a job on nine nodes
  hosts: nodes
  gather_facts: false
  tasks:
    - name: Start a job that outlasts its plan
      ansible.builtin.command: sleep 10
      async: 120
      poll: 0
      register: __job

    - name: Wait for it
      kentino.gpufleet.job_wait:
        job: "{{ __job }}"
        label: gpu_burn
        planned: 6
        poll: 3
        progress_every: 3
""")
    env = {k: v for k, v in os.environ.items() if k not in ("ANSIBLE_NOCOLOR", "ANSIBLE_FORCE_COLOR")}
    env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false")
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp / "hosts.ini"),
                           str(tmp / "play.yml")], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_progress_lines_of_nine_nodes_are_aligned_rounds(nine_node_wait):
    lines = [line for line in nine_node_wait.splitlines() if "gpu_burn running:" in line]
    assert lines, nine_node_wait[-3000:]
    matches = [LINE.match(line) for line in lines]
    assert all(matches), [line for line, m in zip(lines, matches, strict=True) if not m]
    # The label starts in the same column on every line: the longest host name sets the width.
    assert len({m.start("label") for m in matches}) == 1
    assert {m.group("host") for m in matches} <= set(HOSTS)
    assert len({m.group("host") for m in matches}) >= len(HOSTS) - 1, "nearly every node reports (2 CPUs: one may "
    "finish between rounds)"
    seen = {}
    for m in matches:
        elapsed = re.match(r"(\d+) s", m.group("rest"))
        assert elapsed, m.group(0)
        value = int(elapsed.group(1))
        assert value % 3 == 0, "rounds are whole multiples of progress_every: %s" % m.group(0)
        assert value not in seen.setdefault(m.group("host"), set()), "one line per node per round"
        seen[m.group("host")].add(value)
        if value > 6:
            assert "past the 6 s planned" in m.group(0)
        else:
            assert "of 6 s planned (%d%%)" % (100 * value // 6) in m.group(0)


def test_piped_output_has_no_colour_codes_without_nocolor(nine_node_wait):
    assert "\x1b[" not in nine_node_wait and "TASK [Wait for it]" in nine_node_wait
