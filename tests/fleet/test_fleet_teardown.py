"""Teardown leaves nothing behind: no namespaces, veths, bridge, mounts or processes, whatever state `up` died in.

Each test brings up its own 2-node fleet (prefix gpfz, subnet 10.213.9) next to the session fleet.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import harness
import pytest
from fleet_ansible import ANSIBLE_BIN, REPO, ansible_env

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(240)]

CLI = REPO / "hack" / "testfleet"
PREFIX, SUBNET = "gpfz", "10.213.9"


@pytest.fixture
def fleet_dir(fleet_base):
    d = Path(os.environ.get("GPUFLEET_PYTEST_TEARDOWN_DIR", "/var/tmp/gpufleet-pytest-teardown"))
    if (d / "state.json").exists():
        harness.Fleet.from_state(d).down()
    shutil.rmtree(d, ignore_errors=True)
    yield d
    if (d / "state.json").exists():  # whatever the test did, do not leak into the next one
        harness.Fleet.from_state(d).down(purge=True)


def cli(*args, timeout=180):
    return subprocess.run([sys.executable, str(CLI), *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, GPUFLEET_TESTFLEET_QUIET="1"))


def host_leftovers(fleet_dir):
    """Independent of harness.leftovers(): what `ip`, /proc/mounts and ps say about anything named after the fleet."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += ["netns " + line for line in netns.splitlines() if line.startswith(PREFIX + "-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += ["link " + line.split(":")[1].strip() for line in links.splitlines() if ": %s-" % PREFIX in line]
    with open("/proc/mounts") as fh:
        found += ["mount " + line.split()[1] for line in fh if str(fleet_dir) in line]
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
    found += ["process " + line.strip() for line in ps.splitlines()
              if str(fleet_dir) in line and not line.split()[1].startswith("Z") and "ps -eo" not in line]
    return found


def test_cli_up_then_down_from_the_state_file_alone(fleet_dir):
    up = cli("up", "2", "--dir", str(fleet_dir), "--prefix", PREFIX, "--subnet", SUBNET, "--empty-repo")
    assert up.returncode == 0, up.stdout + up.stderr
    print(" ".join(line.strip() for line in up.stdout.splitlines() if " in " in line))
    # Ansible leaves ControlMaster processes behind: teardown must end those too.
    ping = subprocess.run([str(ANSIBLE_BIN / "ansible"), "-i", str(fleet_dir / "inventory.yml"), "all",
                           "-m", "ansible.builtin.ping"], capture_output=True, text=True, env=ansible_env(),
                          cwd=str(REPO), timeout=120)
    assert ping.returncode == 0, ping.stdout[-2000:]
    ps = subprocess.run(["ps", "-ww", "-eo", "args="], capture_output=True, text=True).stdout
    assert any("[mux]" in line for line in ps.splitlines() if str(fleet_dir) in line), ps
    assert host_leftovers(fleet_dir), "the fleet should be visible before down"
    down = cli("down", "--dir", str(fleet_dir))  # a different process: only state.json to go by
    assert down.returncode == 0, down.stdout + down.stderr
    print(down.stdout.strip())
    assert host_leftovers(fleet_dir) == []
    assert harness.Fleet.from_state(fleet_dir).leftovers() == []
    again = cli("down", "--dir", str(fleet_dir))
    assert again.returncode == 0, "down must be idempotent: " + again.stderr


def test_up_that_times_out_says_where_it_stuck_and_cleans_up_after_itself(fleet_dir, fleet_base):
    """A boot timeout far too short for sshd: `up` fails naming the node, the stage and its console log, and leaves
    nothing behind."""
    f = harness.Fleet(dir=fleet_dir, nodes_wanted=2, prefix=PREFIX, subnet=SUBNET, boot_timeout_s=0.3)
    with pytest.raises(harness.FleetError) as err:
        f.up(base=fleet_base, down_at_exit=False)
    message = str(err.value)
    assert "%s-node0: not ready within" % PREFIX in message and "stuck at:" in message, message
    assert "console.log" in message, message
    assert host_leftovers(fleet_dir) == []
    assert f.leftovers() == []


def test_up_killed_mid_boot_is_cleaned_by_down(fleet_dir):
    """SIGKILL the `up` process once a node is booting: no finalizer runs, the state file must be enough."""
    proc = subprocess.Popen([sys.executable, str(CLI), "up", "2", "--dir", str(fleet_dir), "--prefix", PREFIX,
                             "--subnet", SUBNET, "--empty-repo"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = fleet_dir / "state.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if any(n.get("nspawn_pid") for n in json.loads(state.read_text())["nodes"]):
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    else:
        proc.kill()
        pytest.fail("up never recorded a booting node in %s" % state)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1)  # let the orphaned containers get going: down must catch them however far they got
    assert host_leftovers(fleet_dir), "expected a half-made fleet to clean"
    down = cli("down", "--dir", str(fleet_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert host_leftovers(fleet_dir) == []


def test_a_boot_the_state_file_does_not_name_is_cleaned_by_down(fleet_dir):
    """`up` killed between starting a node's boot and saving its PID, on a machine so busy that the container has
    not started when `down` runs (CI saw the boot loop and systemd-nspawn left). Each boot holds itself before
    systemd-nspawn (GPUFLEET_TESTFLEET_HOLD_BOOT), whatever the load, and the state file is made to name no PID:
    `down` must still end every boot of the fleet."""
    proc = subprocess.Popen([sys.executable, str(CLI), "up", "2", "--dir", str(fleet_dir), "--prefix", PREFIX,
                             "--subnet", SUBNET, "--empty-repo"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, GPUFLEET_TESTFLEET_HOLD_BOOT="1"))
    state = fleet_dir / "state.json"

    def held():
        return [pid for pid, cmd in harness.processes_with("gpufleet-held-boot").items()
                if str(fleet_dir) in cmd and (harness._status_field(pid, "State") or "?")[0] == "T"]

    deadline = time.monotonic() + 120
    while len(held()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert len(held()) == 2, "up did not start both boots"
    data = json.loads(state.read_text())
    assert [harness.container_pid1(n["netns"]) for n in data["nodes"]] == [None, None]
    for node in data["nodes"]:
        node["nspawn_pid"] = node["pid1"] = None
    state.write_text(json.dumps(data))
    down = cli("down", "--dir", str(fleet_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert host_leftovers(fleet_dir) == []
