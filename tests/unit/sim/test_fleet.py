"""Scenarios, node state (reset, scenario switch), the sim inventory, N-node generation, installed-elsewhere layout."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from simlib import BIN, REPO, SCENARIOS, SIM, gpu_count


def test_every_scenario_expands_to_its_distinct_gpus(sim_package):
    """Eight GPUs unless the scenario says how many (a workstation's one)."""
    from gpufleet_sim import scenario
    seen_uuids = set()
    for name in SCENARIOS:
        doc = json.loads((SIM / "scenarios" / (name + ".json")).read_text())
        assert doc.get("description"), name  # documented in the file itself
        count = gpu_count(name)
        for node in ("sim-node01", "sim-node02"):
            gpus = scenario.load(name, node)["gpu_list"]
            assert len(gpus) == count and len({g["pci_bus_id"] for g in gpus}) == count
            uuids = {g["uuid"] for g in gpus}
            assert not uuids & seen_uuids  # two nodes with the same scenario never share a UUID
            seen_uuids |= uuids


def test_bad_scenario_names_the_problem(sim):
    res = sim.run("no_such_scenario", "nvidia-smi", "-L")
    assert res.returncode == 2 and "no_such_scenario not found" in res.stderr and "healthy_h100" in res.stderr
    unset = subprocess.run([str(BIN / "nvidia-smi"), "-L"], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_SIM")})
    assert unset.returncode == 2 and "GPUFLEET_SIM_SCENARIO is not set" in unset.stderr


def test_reset_restores_lost_gpus_and_rearms_events(sim):
    sim.run("riser_xid79", "gpu_burn", "300")
    assert sim.run("riser_xid79", "nvidia-smi", "-L").returncode == 15
    out = subprocess.run([str(SIM / "reset"), str(sim.state())], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("reset ")
    assert sim.run("riser_xid79", "nvidia-smi", "-L").returncode == 0
    assert "GPU 3: FAULTY" in sim.run("riser_xid79", "gpu_burn", "300").stdout  # the fault fires again
    env = sim.env("riser_xid79")
    assert subprocess.run([str(BIN / "gpufleet-sim"), "reset"], env=env, capture_output=True).returncode == 0
    assert sim.run("riser_xid79", "nvidia-smi", "-L").returncode == 0


def test_reset_refuses_a_directory_that_is_not_a_node_state(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    out = subprocess.run([str(SIM / "reset"), str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 1 and (tmp_path / "precious.txt").exists()


def test_switching_scenario_starts_a_clean_state(sim):
    sim.run("riser_xid79", "gpu_burn", "300")
    res = sim.run("healthy_rtx5090", "nvidia-smi", "-L")  # same state dir, other scenario
    assert res.returncode == 0 and "GPU is lost" not in res.stdout
    assert ": 79, " not in sim.run("healthy_rtx5090", "journalctl", "-k", "-o", "cat").stdout


def test_default_inventory_wires_nine_scenarios():
    hosts = yaml.safe_load((REPO / "inventories" / "sim" / "hosts.yml").read_text())["gpufleet_sim"]
    assert sorted(hosts["hosts"]) == ["sim-node%02d" % i for i in range(1, 10)]
    used = [h["gpufleet_sim_scenario"] for h in hosts["hosts"].values()]
    assert set(used) <= set(SCENARIOS) and len(set(used)) == 9
    assert {"healthy_h100", "healthy_rtx5090", "riser_xid79", "psu_rail_b", "ecc_leak", "pcie_degraded",
            "neighbour_process", "checkpoint_readonly", "hgx_nvlink_down"} == set(used)
    gv = yaml.safe_load((REPO / "inventories" / "sim" / "group_vars" / "gpufleet_sim.yml").read_text())
    assert gv["ansible_connection"] == "local"
    assert gv["gpufleet_psu_rails"] == {"A": [0, 1, 2, 3], "B": [4, 5, 6, 7]}
    assert set(gv["gpufleet_environment"]) == {"PATH", "GPUFLEET_SIM_SCENARIO", "GPUFLEET_SIM_STATE",
                                               "GPUFLEET_SIM_NODE", "GPUFLEET_SIM_TIME_SCALE", "PYTHONPATH",
                                               "GPUFLEET_SIM_FABRIC"}
    assert gv["gpufleet_environment"]["PATH"].startswith("{{ gpufleet_sim_root }}/bin:")
    assert "gpufleet_sim_root ~ '/site'" in gv["gpufleet_environment"]["PYTHONPATH"]  # the simulated drive


def _make_inventory(out, *args):
    res = subprocess.run([sys.executable, str(SIM / "make_inventory.py"), "--out", str(out)] + list(args),
                         capture_output=True, text=True)
    hosts = out / "hosts.yml"
    return res, (yaml.safe_load(hosts.read_text()) if hosts.exists() else None)


def test_make_inventory_generates_n_nodes(tmp_path):
    res, inv = _make_inventory(tmp_path / "a", "--nodes", "32", "--scenario", "healthy_h100")
    assert res.returncode == 0, res.stderr
    hosts = inv["gpufleet_sim"]["hosts"]
    assert len(hosts) == 32 and "sim-node01" in hosts and "sim-node32" in hosts
    assert {h["gpufleet_sim_scenario"] for h in hosts.values()} == {"healthy_h100"}
    assert "gpufleet_sim" in inv["gpufleet_nodes"]["children"]
    assert (tmp_path / "a" / "group_vars").resolve() == (REPO / "inventories" / "sim" / "group_vars").resolve()
    _res, mix = _make_inventory(tmp_path / "b", "--nodes", "100", "--prefix", "n")
    mix = mix["gpufleet_sim"]["hosts"]
    assert len(mix) == 100 and "n001" in mix and mix["n003"]["gpufleet_sim_scenario"] == "riser_xid79"
    bad, _inv = _make_inventory(tmp_path / "c", "--nodes", "2", "--scenario", "nope")
    assert bad.returncode == 2 and "unknown scenario" in bad.stderr


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-inventory").exists(), reason="needs the project venv")
def test_generated_inventory_renders_the_environment(tmp_path):
    res, _inv = _make_inventory(tmp_path / "inv", "--nodes", "3")
    assert res.returncode == 0, res.stderr
    play = tmp_path / "play.yml"
    play.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.copy:\n"
                    "        content: \"{{ gpufleet_environment | to_json }}\"\n"
                    "        dest: \"%s/{{ inventory_hostname }}.json\"\n" % tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFLEET_SIM_STATE_ROOT", "GPUFLEET_SIM_TIME_SCALE")}
    env["GPUFLEET_SIM_STATE_ROOT"] = str(tmp_path / "st")
    res = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(tmp_path / "inv"), str(play)],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rendered = json.loads((tmp_path / "sim-node02.json").read_text())
    assert rendered["GPUFLEET_SIM_STATE"] == str(tmp_path / "st" / "sim-node02")
    assert rendered["GPUFLEET_SIM_SCENARIO"] == str(SIM / "scenarios" / "healthy_h100.json")
    assert rendered["PATH"].startswith(str(BIN) + ":") and rendered["GPUFLEET_SIM_TIME_SCALE"] == "0.01"


def _render_environment(inventory, cwd, *args, state_root=None):
    """gpufleet_environment of sim-node02 as a play sees it, run from `cwd` (ansible-playbook's stdout on failure)."""
    play = cwd / "play.yml"
    play.write_text("- hosts: sim-node02\n  gather_facts: false\n  tasks:\n    - ansible.builtin.copy:\n"
                    "        content: \"{{ gpufleet_environment | to_json }}\"\n"
                    "        dest: \"%s/env.json\"\n" % cwd)
    env = {k: v for k, v in os.environ.items() if k not in ("GPUFLEET_SIM_STATE_ROOT", "GPUFLEET_SIM_TIME_SCALE")}
    if state_root:
        env["GPUFLEET_SIM_STATE_ROOT"] = str(state_root)
    res = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(play)] +
                         list(args), capture_output=True, text=True, env=env, cwd=str(cwd), timeout=120)
    return json.loads((cwd / "env.json").read_text()) if res.returncode == 0 else res.stdout + res.stderr


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(), reason="needs the project venv")
def test_the_sim_state_goes_under_the_runs_reports_directory_not_into_the_collection(tmp_path):
    # In place, as from an installed collection: nothing is written beside the inventory.
    rendered = _render_environment(REPO / "inventories" / "sim", tmp_path)
    assert rendered["GPUFLEET_SIM_STATE"] == str(tmp_path / "reports" / "sim-state" / "sim-node02"), rendered
    assert rendered["PATH"].startswith(str(BIN) + ":")
    rendered = _render_environment(REPO / "inventories" / "sim", tmp_path, "-e",
                                   "gpufleet_report_dir=%s" % (tmp_path / "site-reports"))
    assert rendered["GPUFLEET_SIM_STATE"] == str(tmp_path / "site-reports" / "sim-state" / "sim-node02")
    rendered = _render_environment(REPO / "inventories" / "sim", tmp_path, state_root=tmp_path / "st")
    assert rendered["GPUFLEET_SIM_STATE"] == str(tmp_path / "st" / "sim-node02")


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-playbook").exists(), reason="needs the project venv")
def test_a_copied_sim_inventory_says_where_the_stand_ins_are_not(tmp_path):
    copy = tmp_path / "my-sim"
    shutil.copytree(REPO / "inventories" / "sim", copy)
    out = _render_environment(copy, tmp_path)
    assert isinstance(out, str), "a copy elsewhere found stand-ins: %s" % out
    assert "simulated fleet's stand-in tools are not in" in out and "in place" in out, out[-2000:]


def test_stand_ins_work_installed_elsewhere_behind_links(sim, tmp_path):
    # The test fleet's .deb puts the package in /usr/lib/gpufleet-sim with links in /usr/bin.
    lib = tmp_path / "usr" / "lib" / "gpufleet-sim"
    shutil.copytree(str(SIM), str(lib), ignore=shutil.ignore_patterns("__pycache__"))
    usr_bin = tmp_path / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    os.symlink(str(lib / "bin" / "nvidia-smi"), str(usr_bin / "nvidia-smi"))
    env = sim.env("psu_rail_b")
    env["PATH"] = str(usr_bin) + os.pathsep + "/usr/bin:/bin"
    env["PYTHONPATH"] = ""
    res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, env=env)
    assert res.returncode == 0 and res.stdout.count("NVIDIA GeForce RTX 5090") == 8
