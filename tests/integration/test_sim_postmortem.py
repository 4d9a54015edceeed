"""kentino.gpufleet.job_postmortem on the simulated fleet, run like a user runs it (ansible-playbook).

Four simulated nodes run `gpufleet-sim job` with one T: each writes its ranks' torchrun log and flight-recorder dumps
into its state directory, and node03's scenario loses GPU 5 (XID 79) 40 s before the watchdog fires.
"""

import json
import os
import pickle
import subprocess
import sys
import time

import yaml
from helpers.playbook_runner import ANSIBLE_PLAYBOOK, REPO

SIM_BIN = REPO / "sim" / "bin"
EXTRA = {"job_postmortem_logs": ["{{ gpufleet_sim_state_dir }}/job/*.log"], "job_postmortem_job_user": str(os.getuid()),
         "job_postmortem_dump_prefixes": ["{{ gpufleet_sim_state_dir }}/job/dumps/nccl_trace_rank_"]}


def job_fleet(tmp_path, job, scenarios):
    inv = tmp_path / "inv"
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(inv), "--nodes",
                    str(len(scenarios)), "--scenario", ",".join(scenarios), "--prefix", "node"], check=True)
    at = time.time() - 20
    for n, scenario in enumerate(scenarios, 1):
        node = "node%02d" % n
        env = dict(os.environ, GPUFLEET_SIM_SCENARIO=str(REPO / "sim" / "scenarios" / (scenario + ".json")),
                   GPUFLEET_SIM_STATE=str(tmp_path / "sim-state" / node), GPUFLEET_SIM_NODE=node)
        subprocess.run([str(SIM_BIN / "gpufleet-sim"), "job", job, "--at", "%.6f" % at], env=env, check=True,
                       capture_output=True)
    return inv


def postmortem(tmp_path, inv, extra=None):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
               ANSIBLE_NOCOLOR="1", GPUFLEET_SIM_STATE_ROOT=str(tmp_path / "sim-state"))
    extra_vars = dict(EXTRA, job_postmortem_report_dir=str(tmp_path / "pm"))
    extra_vars.update(extra or {})
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "playbooks/job_postmortem.yml", "-i", str(inv), "-e",
                           json.dumps(extra_vars)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    latest = tmp_path / "pm" / "latest" / "postmortem.json"
    doc = json.loads(latest.read_text()) if latest.exists() else None
    return proc.returncode, proc.stdout + proc.stderr, doc


def test_riser_xid79_on_node03_gpu5_names_rank_21_and_the_riser(tmp_path):
    inv = job_fleet(tmp_path, "rank21_riser", ["healthy_rtx5090", "healthy_rtx5090", "riser_xid79_gpu5",
                                               "healthy_rtx5090"])
    rc, output, doc = postmortem(tmp_path, inv)
    assert rc == 0 and doc is not None, output[-4000:]
    v = doc["verdict"]
    assert (v["kind"], v["confidence"], v["rank"], v["host"], v["local_rank"], v["gpu"]) == \
        ("hardware", "high", 21, "node03", 5, 5)
    assert v["message"].startswith("node03 GPU 5 (PCI 0000:a1:00): XID 79 at T-40 s"), v["message"]
    assert v["action"].startswith("reseat the riser")
    assert "node03 GPU 5 (PCI 0000:a1:00): XID 79 at T-40 s" in output  # the playbook prints the verdict
    assert doc["job"]["world_size"] == 32 and doc["summary"]["dumps"] == 32
    assert doc["flight"]["problems"] == []  # the dump-reading worker processes work under Ansible (no fallback)
    html = (tmp_path / "pm" / "latest" / "postmortem.html").read_text()
    assert "XID 79 at T-40 s" in html


def test_software_mismatch_on_healthy_gpus(tmp_path):
    inv = job_fleet(tmp_path, "mismatch_rank3", ["healthy_rtx5090"] * 4)
    rc, output, doc = postmortem(tmp_path, inv)
    assert rc == 0 and doc is not None, output[-4000:]
    v = doc["verdict"]
    assert (v["kind"], v["confidence"], v["rank"], v["host"]) == ("software", "high", 3, "node01")
    assert v["message"].startswith("no hardware evidence: mismatched collective in your code at evaluate at "
                                   "/srv/train/trainer.py:212"), v["message"]
    assert doc["hardware"] == []


def test_unreachable_node_and_bad_dumps_lose_nothing_else(tmp_path):
    inv = job_fleet(tmp_path, "rank21_riser", ["healthy_rtx5090", "healthy_rtx5090", "riser_xid79_gpu5",
                                               "healthy_rtx5090"])
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["gpufleet_sim"]["hosts"]["node02"].update({"ansible_connection": "ssh", "ansible_host": "127.0.0.1",
                                                     "ansible_port": 1})
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    pwned = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, ("touch %s" % pwned,))

    dumps4 = tmp_path / "sim-state" / "node04" / "job" / "dumps"
    (dumps4 / "nccl_trace_rank_26").write_bytes(pickle.dumps({"version": "2.10", "entries": [Payload()]}))
    dumps1 = tmp_path / "sim-state" / "node01" / "job" / "dumps"
    data = (dumps1 / "nccl_trace_rank_2").read_bytes()
    (dumps1 / "nccl_trace_rank_2").write_bytes(data[: len(data) // 3])
    rc, output, doc = postmortem(tmp_path, inv)
    assert rc == 0 and doc is not None, output[-4000:]
    assert not pwned.exists()
    v = doc["verdict"]
    assert (v["kind"], v["rank"], v["host"], v["gpu"]) == ("hardware", 21, "node03", 5)
    by_code = {}
    for f in doc["findings"]:
        by_code.setdefault(f["code"], []).append(f)
    assert by_code["NO_EVIDENCE"][0]["message"].startswith("node02: unreachable")
    refused = " ".join(f["message"] for f in by_code["DUMP_REFUSED"])
    assert "nccl_trace_rank_26: refused" in refused and "posix.system" in refused
    assert "nccl_trace_rank_2: unreadable pickle" in refused
    rows = {r["rank"]: r for r in doc["ranks"]}
    assert rows[12]["role"] == "no_evidence" and rows[26]["dump"] == "refused" and rows[2]["dump"] == "refused"
