"""A controller without jsonschema (not a dependency of ansible-core) gets a clear message naming the package and the
Python to install it into, not "Unexpected Exception, this is probably a bug". A real ansible-playbook run (seconds)
with a jsonschema that cannot be imported in front of the real one."""

import os
import subprocess
import sys

from helpers.playbook_runner import ANSIBLE_PLAYBOOK, REPO

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Judge nothing
      kentino.gpufleet.fleet_report:
        hosts: [localhost]
        report_dir: {report_dir}
"""


def test_fleet_report_without_jsonschema_names_the_package(tmp_path):
    shadow = tmp_path / "shadow" / "jsonschema"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'jsonschema'\")\n")
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(report_dir=tmp_path / "reports"))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PYTHONPATH=str(tmp_path / "shadow"))
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=%s" % sys.executable, str(play)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Unexpected Exception" not in output and "Traceback" not in output, output[-3000:]
    assert "needs the Python package jsonschema on the controller" in output, output[-3000:]
    assert "%s -m pip install jsonschema" % sys.executable in output
