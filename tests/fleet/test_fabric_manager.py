"""kentino.gpufleet.fabric_manager for real, on test-fleet nodes (systemd, apt, SSH), with stand-in NVIDIA packages.

Its own 2-node fleet (prefix gpff). The stand-in fabric manager (tests/fleet/packages/nvidia-fabricmanager-570) runs
only with a driver of its own version and the stand-in nvidia-smi reports the GPUs' fabric state Completed only while
it runs, so the role's verification can fail. A test-fleet node has no NVSwitch (the host's sysfs): node0 is forced to
one (the molecule scenario's converge.yml), node1 keeps the detection and then takes the refusals.

Run: `flock /tmp/gpufleet-fleet.lock pytest -q -m fleet tests/fleet/test_fabric_manager.py` as root.
"""

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import aptrepo  # noqa: E402
import harness  # noqa: E402
from fleet_ansible import PlaybookRun  # noqa: E402

FLEET_DIR = Path(os.environ.get("GPUFLEET_FM_FLEET_DIR", "/var/tmp/gpufleet-fm-fleet"))
CONVERGE = REPO / "roles/fabric_manager/molecule/default/converge.yml"
VERIFY = REPO / "roles/fabric_manager/molecule/default/verify.yml"
# The specs this module needs: the branch-570 driver stand-ins and the fabric manager's.
SPECS = ("nvidia-open-570", "nvidia-driver-pinning-570", "nvidia-smi", "nvidia-persistenced",
         "nvidia-fabricmanager-570", "nvidia-fabricmanager-570@570.148.08", "libnvidia-nscq-570")

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def ffleet(fleet_base):
    started = time.monotonic()
    base = fleet_base
    fleet = harness.Fleet(dir=FLEET_DIR, nodes_wanted=2, prefix="gpff", subnet="10.213.12")
    if fleet.state_path.exists():
        harness.Fleet.from_state(FLEET_DIR).down()
    shutil.rmtree(fleet.apt_dir, ignore_errors=True)
    aptrepo.build_repo(fleet.apt_dir, harness.DEFAULT_CACHE, base=base, sim=False, only=SPECS)
    fleet.up(base=base)
    fleet.write_inventory(groups=("gpufleet_testfleet", "gpufleet_nodes"))
    print("fabric manager fleet up in %.1f s" % (time.monotonic() - started))
    yield fleet
    problems = fleet.down()
    assert not problems and not fleet.leftovers(), problems + fleet.leftovers()


@pytest.fixture(scope="module")
def run(ffleet, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fabric-manager")

    def _run(playbook, *extra, limit=None, timeout=420):
        args = list(extra) + (["--limit", limit] if limit else [])
        started = time.monotonic()
        r = PlaybookRun(ffleet, playbook, args, None, tmp).wait(timeout)
        print("%-60s %5.1f s rc=%s %s" % (" ".join([Path(str(playbook)).name] + args)[:60],
                                          time.monotonic() - started, r.proc.returncode, r.recap))
        return r
    return _run


def node(fleet, i):
    return fleet.nodes[i].name


def sh(fleet, i, cmd, check=True):
    return fleet.ssh(node(fleet, i), cmd, timeout=60, check=check)


def installed(fleet, i):
    """{package: "version status"} of the fabric manager's packages dpkg has on node i."""
    out = sh(fleet, i, "dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n' 'nvidia-fabricmanager*' "
                       "'libnvidia-nscq*' 2>/dev/null || true").stdout
    return {f[0]: " ".join(f[1:]) for f in map(str.split, out.splitlines()) if len(f) == 3 and f[2][1] == "i"}


def flat(r):
    return " ".join(r.output.split())


def test_check_mode_on_a_fresh_node_changes_nothing(run, ffleet):
    sh(ffleet, 0, "apt-get update -q")
    before = sh(ffleet, 0, "dpkg -l | md5sum; ls /etc/systemd/system/multi-user.target.wants | md5sum").stdout
    r = run(CONVERGE, "--check", limit=node(ffleet, 0))
    assert r.proc.returncode == 0 and r.recap[node(ffleet, 0)]["failed"] == 0, r.output[-4000:]
    assert r.recap[node(ffleet, 0)]["changed"] > 0  # it reports the driver it would install
    assert sh(ffleet, 0, "dpkg -l | md5sum; ls /etc/systemd/system/multi-user.target.wants | md5sum").stdout == before


def test_converge_installs_at_the_drivers_version_holds_starts_and_verifies(run, ffleet):
    first = run(CONVERGE, limit=node(ffleet, 0))
    assert first.proc.returncode == 0, first.output[-4000:]
    assert "nvidia-fabricmanager-570 570.172.08 active, 2 GPU(s) registered with the NVLink fabric" in flat(first)
    # The driver's version, not the newest or an older one the repository also offers; held like the driver.
    assert installed(ffleet, 0) == {"nvidia-fabricmanager-570": "570.172.08-1 hi", "libnvidia-nscq-570": "570.172.08-1 hi"}
    again = run(CONVERGE, limit=node(ffleet, 0))
    changed = [line for _, line in again.lines if line.startswith("changed:")]
    assert again.proc.returncode == 0 and again.recap[node(ffleet, 0)]["changed"] == 0, changed
    check = run(CONVERGE, "--check", limit=node(ffleet, 0))
    assert check.proc.returncode == 0 and check.recap[node(ffleet, 0)]["changed"] == 0, check.output[-3000:]
    v = run(VERIFY, limit=node(ffleet, 0))
    assert v.proc.returncode == 0, v.output[-3000:]


def test_a_stopped_fabric_manager_leaves_the_gpus_unregistered_and_the_role_starts_it(run, ffleet):
    sh(ffleet, 0, "systemctl stop nvidia-fabricmanager")
    assert re.findall(r"State\s+: (\S.*)", sh(ffleet, 0, "nvidia-smi -q").stdout) == ["In Progress"] * 2
    # The verification can fail: without the service, the GPUs never register.
    # The role's preflight and verification only (nothing would start the service).
    failed = run(CONVERGE, "-e", '{"fabric_manager_verify_timeout": 5}', "--tags", "fabric_manager_verify",
                 limit=node(ffleet, 0))
    assert failed.proc.returncode != 0
    out = flat(failed)
    assert "nvidia-fabricmanager is inactive" in out and "0 in_progress none, 1 in_progress none" in out, out[-3000:]
    fixed = run(CONVERGE, limit=node(ffleet, 0))
    assert fixed.proc.returncode == 0 and fixed.recap[node(ffleet, 0)]["changed"] >= 1, fixed.output[-3000:]
    assert sh(ffleet, 0, "systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"


def test_a_node_without_nvswitch_installs_nothing_and_says_why(run, ffleet):
    sh(ffleet, 1, "apt-get update -q")
    r = run(CONVERGE, "-e", '{"fabric_manager_platform": "auto"}', limit=node(ffleet, 1))
    assert r.proc.returncode == 0, r.output[-4000:]
    assert ("not an NVSwitch machine (no NVIDIA PCI device of class 0680 and no NVLink 5 switch management "
            "bridge): the fabric manager is only for HGX/DGX baseboards with NVSwitches, nothing installed") in flat(r)
    assert installed(ffleet, 1) == {}
    assert sh(ffleet, 1, "systemctl cat nvidia-fabricmanager", check=False).returncode != 0


def test_a_version_other_than_the_drivers_is_refused_and_installs_nothing(run, ffleet):
    r = run(CONVERGE, "-e", '{"fabric_manager_version": "570.148.08"}', limit=node(ffleet, 1))
    assert r.proc.returncode != 0
    out = flat(r)
    assert ("fabric_manager_version 570.148.08 does not match the driver 570.172.08: the fabric manager checks the "
            "driver's version when it starts and exits on any other. The version that would match: 570.172.08") in out, \
        out[-3000:]
    assert installed(ffleet, 1) == {}


def test_a_repository_without_the_drivers_version_is_refused_with_what_it_has(run, ffleet):
    r = run(CONVERGE, "-e", '{"fabric_manager_driver_version": "570.86.15"}', limit=node(ffleet, 1))
    assert r.proc.returncode != 0
    out = flat(r)
    assert ("the configured repositories have no nvidia-fabricmanager-570 and libnvidia-nscq-570 at 570.86.15, the "
            "driver's version (found: nvidia-fabricmanager-570: 570.172.08-1, 570.148.08-1; libnvidia-nscq-570: "
            "570.172.08-1)") in out, out[-3000:]
    assert "Versions that would match: 570.86.15-*" in out
    assert installed(ffleet, 1) == {}
