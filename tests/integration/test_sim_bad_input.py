"""Bad input on one node loses nothing: that node gets a clear error, the others carry on, the report is written."""

import subprocess
import sys

import yaml
from helpers.playbook_runner import REPO, codes, nodes_by_host, run_playbook


def _inventory(tmp_path, nodes=4):
    inv = tmp_path / "inv"
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(inv), "--nodes", str(nodes),
                    "--scenario", "healthy_h100"], check=True)
    return inv, yaml.safe_load((inv / "hosts.yml").read_text())


def test_a_wrong_type_or_a_typo_is_refused_before_any_node_is_touched(tmp_path):
    inv, hosts = _inventory(tmp_path, 2)
    nodes = hosts["gpufleet_sim"]["hosts"]
    nodes["sim-node01"]["gpufleet_burn_duration_s"] = "ten minutes"            # wrong type
    nodes["sim-node02"]["gpufleet_nccl_min_busbw_gbs"] = 9999                  # a typo of gpufleet_nccl_min_busbw_gbps
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    state = tmp_path / "sim-state"
    rc, output, report = run_playbook("burn_in", tmp_path, inventory=str(inv))
    assert rc == 2 and report is None, output[-3000:]
    assert "refusing to start" in output and "before touching any node" in output
    assert "host sim-node01: argument 'gpufleet_burn_duration_s'" in output
    assert "unknown variable gpufleet_nccl_min_busbw_gbs (did you mean gpufleet_nccl_min_busbw_gbps" in output
    assert not state.exists(), "a stand-in tool ran on a node"


def test_bad_values_at_run_time_on_some_nodes_do_not_stop_the_others(tmp_path):
    inv, hosts = _inventory(tmp_path)
    nodes = hosts["gpufleet_sim"]["hosts"]
    pwned = tmp_path / "pwned"
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
    burn2 = by_host["sim-node02"]["checks"]["gpu_burn"]
    assert burn2["verdict"] == "error" and "/nonexistent/gpu_burn" in " ".join(burn2["reasons"])
    assert by_host["sim-node03"]["checks"]["gpu_burn"]["verdict"] == "error"
    assert not pwned.exists()
    # The job refused sim-node03's memory before it could read anything: the burn stage's rescue made the reads after
    # the burn itself (the NVLink counters' rise needs the read after; the mark alone gives no rise).
    for name in ("sim-node02", "sim-node03"):
        checks = by_host[name]["checks"]
        assert checks["nvlink"]["verdict"] == "pass" and checks["nvlink"]["figures"]["errors_rise"] == 0, checks
        assert checks["xid_facts"]["verdict"] == "pass"
    for name in ("sim-node01", "sim-node04"):
        assert by_host[name]["verdict"] == "pass" and by_host[name]["checks"]["gpu_burn"]["verdict"] == "pass"


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
