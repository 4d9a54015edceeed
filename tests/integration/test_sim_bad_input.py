"""Bad input on one node loses nothing: that node gets a clear error, the others carry on, the report is written."""

import subprocess
import sys

import yaml
from helpers.playbook_runner import REPO, codes, nodes_by_host, run_playbook


def test_bad_values_on_some_nodes_do_not_stop_the_others(tmp_path):
    inv = tmp_path / "inv"
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(inv), "--nodes", "4",
                    "--scenario", "healthy_h100"], check=True)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    nodes = hosts["gpufleet_sim"]["hosts"]
    pwned = tmp_path / "pwned"
    nodes["sim-node01"]["gpufleet_burn_duration_s"] = "ten minutes"            # wrong type
    nodes["sim-node02"]["gpufleet_burn_executable"] = "/nonexistent/gpu_burn"  # missing tool
    nodes["sim-node03"]["gpufleet_burn_memory"] = "90%%; touch %s" % pwned     # shell metacharacters
    # A short burn and no dcgm/NCCL, as group vars so that the host values above still win.
    hosts["gpufleet_sim"]["vars"] = {"gpufleet_burn_duration_s": 300, "gpufleet_dcgm_enabled": False,
                                     "gpufleet_nccl_enabled": False}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    rc, output, report = run_playbook("burn_in", tmp_path, inventory=str(inv))
    assert report is not None, output[-4000:]
    assert rc == 2, output[-2000:]
    by_host = nodes_by_host(report)
    stopped = [f for f in by_host["sim-node01"]["findings"] if f["code"] == "RUN_STOPPED"]
    assert by_host["sim-node01"]["verdict"] == "error" and "gpufleet_burn_duration_s" in stopped[0]["message"]
    burn2 = by_host["sim-node02"]["checks"]["gpu_burn"]
    assert burn2["verdict"] == "error" and "/nonexistent/gpu_burn" in " ".join(burn2["reasons"])
    assert by_host["sim-node03"]["checks"]["gpu_burn"]["verdict"] == "error"
    assert not pwned.exists()
    assert by_host["sim-node04"]["verdict"] == "pass" and by_host["sim-node04"]["checks"]["gpu_burn"]["verdict"] == "pass"


def test_a_fleet_where_every_node_is_unreachable_still_gets_its_report(tmp_path):
    inv = tmp_path / "inv"
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(inv), "--nodes", "2"],
                   check=True)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    for node in hosts["gpufleet_sim"]["hosts"].values():  # nothing listens on port 1: refused at once
        node.update({"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1})
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    rc, output, report = run_playbook("burn_in", tmp_path, inventory=str(inv))
    assert report is not None, output[-3000:]
    assert rc != 0
    assert [n["verdict"] for n in report["nodes"]] == ["unreachable", "unreachable"]
    assert all("UNREACHABLE" in codes(n) for n in report["nodes"])
