"""playbooks/job_postmortem.yml run for real on a local node: the evidence is read as the SSH user even when the
inventory says ansible_become: true (as the example inventory does for provisioning), and no dump byte reaches the
console, even with -v. One ansible-playbook run (a few seconds)."""

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from helpers.fr_dumps import job_dumps, write_dumps
from helpers.playbook_runner import ANSIBLE_PLAYBOOK, REPO


def test_evidence_is_read_unprivileged_whatever_the_inventory_says_and_dumps_stay_off_the_console(tmp_path):
    # A become tool that fails loudly: if the task became root, the node's evidence would be lost with this message.
    no_sudo = tmp_path / "no-sudo"
    no_sudo.write_text("#!/bin/sh\necho 'become was attempted' >&2\nexit 1\n")
    no_sudo.chmod(0o755)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {"localhost": local}, "children": {"gpufleet_nodes": {"hosts": {"node1": dict(
        local, ansible_become=True, ansible_become_method="sudo", ansible_become_exe=str(no_sudo))}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    paths = write_dumps(tmp_path / "dumps", job_dumps(world=2, culprit=1, seq=10))
    # The controller's temp directory (where the action keeps the dumps until read): short, Ansible puts sockets there.
    temp = Path(tempfile.mkdtemp(prefix="gf-"))
    extra = {"job_postmortem_dump_prefixes": [str(tmp_path / "dumps" / "nccl_trace_rank_")],
             "job_postmortem_job_user": str(os.getuid()), "job_postmortem_report_dir": str(tmp_path / "pm"),
             "job_postmortem_lookback": "-1h"}
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
               ANSIBLE_NOCOLOR="1", TMPDIR=str(temp))
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "playbooks/job_postmortem.yml", "-i", str(tmp_path / "hosts.yml"),
                           "-v", "-e", json.dumps(extra)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "become was attempted" not in output
    for path in paths.values():
        data = open(path, "rb").read()
        assert base64.b64encode(data).decode()[:64] not in output  # -v prints the task's result: no dump in it
    doc = json.loads((tmp_path / "pm" / "latest" / "postmortem.json").read_text())
    assert doc["summary"]["dumps"] == 2, doc["summary"]
    left = [p.name for p in temp.iterdir() if p.name.startswith("gpufleet-dumps-")]
    shutil.rmtree(temp, ignore_errors=True)
    assert left == []  # read, then deleted
