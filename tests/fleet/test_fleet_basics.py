"""The fleet itself: real SSH, real systemd as PID 1, real apt from the local repository, isolated network."""

import json
import os
import subprocess

import aptrepo
import pytest
from fleet_ansible import ANSIBLE_BIN, REPO, ansible_env

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(300)]


def test_ansible_ping_and_setup_over_ssh_on_every_node(fleet, tmp_path):
    tree = tmp_path / "facts"
    proc = subprocess.run([str(ANSIBLE_BIN / "ansible"), "-i", str(fleet.inventory_path), "all",
                           "-m", "ansible.builtin.setup", "--tree", str(tree)],
                          capture_output=True, text=True, env=ansible_env(), cwd=str(REPO), timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    machine_ids = set()
    for node in fleet.nodes:
        facts = json.loads((tree / node.name).read_text())["ansible_facts"]
        assert facts["ansible_hostname"] == node.name
        assert facts["ansible_service_mgr"] == "systemd"
        assert facts["ansible_distribution"] == "Debian" and facts["ansible_distribution_major_version"] == "12"
        assert node.ip in facts["ansible_all_ipv4_addresses"]
        machine_ids.add(facts["ansible_machine_id"])
    assert len(machine_ids) == len(fleet.nodes), "nodes must have distinct machine-ids"
    ping = subprocess.run([str(ANSIBLE_BIN / "ansible"), "-i", str(fleet.inventory_path), "all", "-m",
                           "ansible.builtin.ping", "-o"], capture_output=True, text=True, env=ansible_env(),
                          cwd=str(REPO), timeout=120)
    assert ping.returncode == 0, ping.stdout[-3000:]
    assert sorted(line.split()[0] for line in ping.stdout.splitlines() if "SUCCESS" in line) == \
        sorted(n.name for n in fleet.nodes)
    # ControlMaster sockets land in the fleet dir, where teardown finds them.
    assert list(fleet.control_dir.iterdir()), "no ssh ControlPath socket in %s" % fleet.control_dir



def test_module_runs_on_the_nodes_reuse_their_compiled_payload_code(fleet):
    """The nodes share the simulator's module code cache (harness.MODULE_CODE_CACHE): a payload compiled by one
    node's module run is read, not compiled, by the next, on any node; a failing module still names its own payload."""
    import harness

    # Other fleets share the directory: emptying it only makes their next runs compile again.
    for entry in harness.MODULE_CODE_CACHE.iterdir():
        entry.unlink(missing_ok=True)
    run = subprocess.run([str(ANSIBLE_BIN / "ansible"), "-i", str(fleet.inventory_path), fleet.nodes[0].name, "-m",
                          "ansible.builtin.ping"], capture_output=True, text=True, env=ansible_env(), cwd=str(REPO),
                         timeout=120)
    assert run.returncode == 0, run.stdout[-3000:]
    entries = {p.name: p.stat().st_mtime_ns for p in harness.MODULE_CODE_CACHE.iterdir()}
    assert any(name.endswith(".cpython-311") for name in entries), entries  # the nodes' Debian Python
    again = subprocess.run([str(ANSIBLE_BIN / "ansible"), "-i", str(fleet.inventory_path), "all", "-m",
                            "ansible.builtin.ping"], capture_output=True, text=True, env=ansible_env(),
                           cwd=str(REPO), timeout=120)
    assert again.returncode == 0, again.stdout[-3000:]
    now = {p.name: p.stat().st_mtime_ns for p in harness.MODULE_CODE_CACHE.iterdir()}
    assert {name: now.get(name) for name in entries} == entries  # read by every node, not written again
    name = next(iter(entries))
    fleet.ssh(fleet.nodes[-1].name, "test -s %s/%s" % (harness.MODULE_CODE_MOUNT, name), timeout=30)


def test_systemd_is_pid1_and_the_system_is_running(fleet):
    for node in fleet.nodes:
        assert fleet.ssh(node.name, "cat /proc/1/comm").stdout.strip() == "systemd"
        state = fleet.ssh(node.name, "timeout 60 systemctl is-system-running --wait", check=False, timeout=90)
        assert state.stdout.strip() in ("running", "degraded"), (node.name, state.stdout, state.stderr)
        if state.stdout.strip() == "degraded":  # say which unit, so a harness regression is easy to see
            failed = fleet.ssh(node.name, "systemctl --failed --no-legend --plain").stdout
            print("%s degraded: %s" % (node.name, failed))
        assert fleet.ssh(node.name, "systemctl is-active ssh").stdout.strip() == "active"


def test_network_stays_inside_the_fleet(fleet):
    node = fleet.nodes[0]
    routes = fleet.ssh(node.name, "ip -4 route show").stdout.strip().splitlines()
    assert routes == ["%s.0/24 dev eth0 proto kernel scope link src %s" % (fleet.subnet, node.ip)], routes
    assert fleet.ssh(node.name, "ip -4 route show default").stdout.strip() == ""
    # Nodes reach each other and the controller over the bridge.
    other = fleet.nodes[1]
    probe = "python3 -c 'import socket; socket.create_connection((\"%s\", 22), 3).recv(7)' && echo reached"
    assert fleet.ssh(node.name, probe % other.ip).stdout.strip() == "reached"
    # ... and nothing else: an address outside the fleet's /24 has no route.
    out = fleet.ssh(node.name, probe % "192.0.2.1", check=False)
    assert out.returncode != 0 and "unreachable" in out.stderr.lower(), out.stderr


def _apt_play(packages):
    return """
    - name: Install from the fleet's local apt repository
      hosts: all
      gather_facts: false
      tasks:
        - name: Install the packages
          ansible.builtin.apt:
            name: %s
            update_cache: true
          register: installed
        - name: Show the result
          ansible.builtin.debug:
            msg: "changed={{ installed.changed }}"
    """ % json.dumps(list(packages))


def test_sim_tools_and_standin_package_install_with_real_apt(fleet, playbook, tmp_path):
    if fleet.repo_info["sim"] is None:
        pytest.fail("sim/ is missing from the repo: the simulator package could not be built")
    first = playbook(_apt_play(["gpufleet-sim", "gpufleet-testfleet-probe"]))
    assert first.proc.returncode == 0, first.output[-4000:]
    assert all(r["changed"] >= 1 and r["failed"] == 0 for r in first.recap.values()), first.recap
    again = playbook(_apt_play(["gpufleet-sim", "gpufleet-testfleet-probe"]))
    assert again.proc.returncode == 0 and all(r["changed"] == 0 for r in again.recap.values()), again.recap

    scenario_dir = REPO / "sim" / "scenarios"
    scenario = sorted(scenario_dir.glob("*.json"))[0]
    node = fleet.nodes[0]
    # Same scenario and node name on the node (installed package) and here (repo checkout): same answer.
    env = "GPUFLEET_SIM_SCENARIO=/usr/lib/gpufleet-sim/scenarios/%s GPUFLEET_SIM_STATE=/tmp/sim-state " \
          "GPUFLEET_SIM_NODE=%s" % (scenario.name, node.name)
    on_node = fleet.ssh(node.name, "mkdir -p /tmp/sim-state && %s nvidia-smi -L" % env)
    local_env = dict(os.environ, GPUFLEET_SIM_SCENARIO=str(scenario), GPUFLEET_SIM_STATE=str(tmp_path / "sim"),
                     GPUFLEET_SIM_NODE=node.name)
    local = subprocess.run([str(REPO / "sim" / "bin" / "nvidia-smi"), "-L"], capture_output=True, text=True,
                           env=local_env, timeout=60)
    assert local.returncode == 0 and on_node.stdout == local.stdout and "GPU 0:" in local.stdout
    # Links into /usr/bin for every stand-in except tools the node's own packages ship (journalctl, dmesg ...).
    manifest = fleet.repo_info["sim"]
    linked = fleet.ssh(node.name, "for t in %s; do readlink /usr/bin/$t; done" % " ".join(manifest["links"]))
    assert linked.stdout.split() == ["/usr/lib/gpufleet-sim/bin/%s" % t for t in manifest["links"]]
    for tool in manifest["not_linked"]:
        owner = fleet.ssh(node.name, "dpkg -S $(command -v %s)" % tool, check=False).stdout
        assert "gpufleet-sim" not in owner
    assert fleet.ssh(node.name, "systemctl is-active gpufleet-probe").stdout.strip() == "active"


def test_real_debian_package_installs_from_the_local_repo(fleet, playbook):
    assert any(p.startswith("prometheus-node-exporter_") for p in fleet.repo_info["packages"])
    run = playbook(_apt_play(["prometheus-node-exporter"]).replace("hosts: all", "hosts: %s" % fleet.nodes[1].name))
    assert run.proc.returncode == 0, run.output[-4000:]
    node = fleet.nodes[1]
    metrics = fleet.ssh(node.name, "for i in $(seq 50); do python3 -c \"import urllib.request; "
                                   "print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())\" "
                                   "2>/dev/null && break; sleep 0.2; done")
    assert "node_exporter_build_info" in metrics.stdout
    assert fleet.ssh(node.name, "systemctl is-active prometheus-node-exporter").stdout.strip() == "active"


def test_sim_links_give_way_to_a_vendor_package_owning_the_same_path(fleet, tmp_path):
    """gpufleet-sim and a stand-in vendor package that ships the same /usr/bin tool install in either order."""
    tool = fleet.repo_info["sim"]["links"][0]
    spec = tmp_path / "gpufleet-testfleet-owner"
    spec.mkdir()
    (spec / tool).write_text("#!/bin/sh\necho vendor-%s\n" % tool)
    (spec / tool).chmod(0o755)
    (spec / "control").write_text(
        "Section: misc\nPriority: optional\nStandards-Version: 4.6.2\nPackage: gpufleet-testfleet-owner\n"
        "Version: 1.0\nMaintainer: kentino.gpufleet <gpufleet@localhost>\nArchitecture: all\n"
        "Files: %s /usr/bin/\nDescription: owns /usr/bin/%s like a vendor package\n test only\n" % (tool, tool))
    aptrepo.add_debs(fleet.apt_dir, aptrepo.build_spec(spec, tmp_path / "cache"))
    aptrepo.index_repo(fleet.apt_dir)
    apt = "DEBIAN_FRONTEND=noninteractive apt-get -q -y"
    sim_first, vendor_first = fleet.nodes[2].name, fleet.nodes[3].name
    fleet.ssh(sim_first, "apt-get -q update && %s install gpufleet-sim && %s install gpufleet-testfleet-owner"
              % (apt, apt), timeout=180)
    fleet.ssh(vendor_first, "apt-get -q update && %s install gpufleet-testfleet-owner && %s install gpufleet-sim"
              % (apt, apt), timeout=180)
    for node in (sim_first, vendor_first):
        assert fleet.ssh(node, tool).stdout.strip() == "vendor-" + tool
        assert fleet.ssh(node, "dpkg -S /usr/bin/%s" % tool).stdout.startswith("gpufleet-testfleet-owner:")
    fleet.ssh(vendor_first, "%s purge gpufleet-sim" % apt)
    assert fleet.ssh(vendor_first, tool).stdout.strip() == "vendor-" + tool  # prerm removes only its own links
    fleet.ssh(sim_first, "%s purge gpufleet-testfleet-owner" % apt)
