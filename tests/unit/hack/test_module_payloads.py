"""The test sessions' shared module payloads (tests/controller_site, tests/helpers/module_payloads.py): a second
ansible-playbook run reuses what the first built, through ansible-core's own cache; a changed plugin file names
another directory; a run without the variable builds its payloads as always, and none leaves its link behind."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.module_payloads import cache_dir

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.command: echo payload-ok
      register: out
      changed_when: false
    - ansible.builtin.debug:
        msg: "{{ out.stdout }}"
"""


def run(tmp_path, cache):
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFLEET_TEST_ANSIBALLZ_CACHE", "ANSIBLE_CONFIG")}
    env.update(ANSIBLE_LOCAL_TEMP=str(tmp_path / "local-tmp"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               PYTHONPATH=str(REPO / "tests" / "controller_site"))
    if cache:
        env["GPUFLEET_TEST_ANSIBALLZ_CACHE"] = str(cache)
    (tmp_path / "pb.yml").write_text(PLAYBOOK)
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=%s" % sys.executable, str(tmp_path / "pb.yml")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    tasks = json.loads(proc.stdout)["plays"][0]["tasks"]
    assert tasks[1]["hosts"]["localhost"]["msg"] == "payload-ok"
    # the run's local temporary directory is gone, with the link in it (ansible removes it at exit)
    assert list((tmp_path / "local-tmp").iterdir()) == []


def payloads(cache):
    return {p.relative_to(cache): p.stat().st_mtime_ns for p in cache.rglob("*command-ZIP*") if p.is_file()}


def test_the_second_run_uses_the_payload_the_first_built(tmp_path):
    cache = tmp_path / "cache"
    run(tmp_path, cache)
    built = payloads(cache)
    (name,) = [p for p in built if not p.name.endswith(".lock")]
    assert name.parts[0].startswith("ansible-") and name.name.startswith("ansible.modules.command-"), built
    run(tmp_path, cache)
    assert payloads(cache) == built  # read, not built again


def test_without_the_variable_nothing_is_shared(tmp_path):
    run(tmp_path, None)
    assert not (tmp_path / "cache").exists()


def test_a_changed_plugin_file_names_another_directory(tmp_path):
    plugins = tmp_path / "plugins"
    shutil.copytree(REPO / "plugins" / "module_utils", plugins / "module_utils",
                    ignore=shutil.ignore_patterns("__pycache__"))
    first = cache_dir(plugins, tmp_path / "c")
    assert cache_dir(plugins, tmp_path / "c") == first
    util = plugins / "module_utils" / "findings.py"
    util.write_bytes(util.read_bytes() + b"\n")
    changed = cache_dir(plugins, tmp_path / "c")
    assert changed != first
    util.unlink()
    assert cache_dir(plugins, tmp_path / "c") not in (first, changed)
