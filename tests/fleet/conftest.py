"""Session fixture for the real test fleet: 4 systemd-nspawn nodes over SSH, a local apt repo, Ansible runners.

Run with `pytest -q -m fleet tests/fleet` as root (needs debootstrap, systemd-container, dpkg-dev, apt-utils,
iproute2, openssh-client). Without `-m fleet` these tests are skipped with that reason, so a bare `pytest` stays fast.
"""

import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import aptrepo  # noqa: E402
import harness  # noqa: E402
from fleet_ansible import PlaybookRun, stop_live_runs  # noqa: E402
from helpers.schedule import longest_first  # noqa: E402

# Under pytest-xdist every worker that runs tests of the session fleet brings up its own (gw<N>: prefix gpft<N>,
# subnet 10.213.<40+N>), so the files that share it run at once on different workers.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_N = int(WORKER[2:]) if WORKER.startswith("gw") and WORKER[2:].isdigit() else None
FLEET_DIR = Path(os.environ.get("GPUFLEET_PYTEST_FLEET_DIR", "/var/tmp/gpufleet-pytest-fleet")
                 + ("" if _N is None else "-gw%d" % _N))
FLEET_PREFIX = os.environ.get("GPUFLEET_PYTEST_FLEET_PREFIX", "gpft") + ("" if _N is None else str(_N))
FLEET_SUBNET = os.environ.get("GPUFLEET_PYTEST_FLEET_SUBNET", "10.213.8" if _N is None else "10.213.%d" % (40 + _N))
FLEET_NODES = int(os.environ.get("GPUFLEET_PYTEST_FLEET_NODES", "4"))
# The longest groups (several minutes each on a 2-core machine beside the other suites), started first.
LONGEST = ("roles-node0", "roles-node1", "tests/fleet/test_fleet_burn_in.py", "tests/fleet/test_elastic_training.py",
           "tests/fleet/test_monitoring.py")
REQUIRED_TOOLS = ("debootstrap", "systemd-nspawn", "ip", "ssh", "ssh-keygen", "dpkg-deb", "apt-ftparchive", "mount")


# Before xdist reads the groups (its own hook of the same name turns them into node ids).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if "fleet" in (config.getoption("-m") or ""):
        # Under pytest-xdist (--dist loadgroup) a file is one group unless its tests name their own (test_roles.py
        # runs each node's story as a group): a file's module fleet is brought up once, on one worker.
        for item in items:
            if item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
        longest_first(items, LONGEST)
        return
    skip = pytest.mark.skip(reason="real test fleet: run as root with `pytest -m fleet tests/fleet`")
    for item in items:
        if item.get_closest_marker("fleet"):
            item.add_marker(skip)


def check_prerequisites():
    """Fail (never skip) with what to install when `-m fleet` was asked for on a machine that cannot run it."""
    if os.geteuid() != 0:
        pytest.fail("the test fleet needs root (network namespaces, overlayfs, systemd-nspawn)")
    missing = [t for t in REQUIRED_TOOLS if not shutil.which(t)]
    if missing:
        pytest.fail("missing %s: apt-get install debootstrap systemd-container dpkg-dev apt-utils iproute2 "
                    "openssh-client mount" % ", ".join(missing))


# Every fleet fixture starts from this one: the machine can run a fleet (else the test fails saying what to install),
# and the cached base.
@pytest.fixture(scope="session")
def fleet_base():
    check_prerequisites()
    return harness.ensure_base()


@pytest.fixture(scope="session")
def fleet(fleet_base):
    """4 nodes up for the whole session; torn down at the end (and at exit), asserting nothing is left behind."""
    f = harness.Fleet(dir=FLEET_DIR, nodes_wanted=FLEET_NODES, prefix=FLEET_PREFIX, subnet=FLEET_SUBNET)
    if f.state_path.exists():  # a previous run that crashed: clean it before anything else
        harness.Fleet.from_state(FLEET_DIR).down()
    shutil.rmtree(f.apt_dir, ignore_errors=True)
    # Only what these tests install: the role engineers' stand-ins are checked by test_every_package_spec_builds.
    f.repo_info = aptrepo.build_repo(f.apt_dir, harness.DEFAULT_CACHE, base=fleet_base, debian=aptrepo.DEBIAN_PACKAGES,
                                     only=("gpufleet-testfleet-probe",))
    f.up(base=fleet_base)
    f.write_inventory(groups=("gpufleet_testfleet", "gpufleet_nodes"))
    yield f
    stop_live_runs()
    problems = f.down()
    left = f.leftovers()
    assert not problems and not left, "test fleet teardown left: %s" % "; ".join(problems + left)


@pytest.fixture
def restore_nodes(fleet):
    """Tests that kill or cut a node list it here; it is booted/reconnected again afterwards for the next test."""
    touched = []
    yield touched
    for name in touched:
        fleet.restore_link(name)
        if harness.container_pid1(fleet.node(name).netns) is None or \
                fleet.ssh(name, "true", timeout=15, check=False).returncode != 0:
            fleet.restart_node(name)


@pytest.fixture
def playbook(fleet, tmp_path):
    def run(text_or_path, extra_args=(), env=None, timeout=300):
        return PlaybookRun(fleet, text_or_path, extra_args, env, tmp_path).wait(timeout)
    run.start = lambda text_or_path, extra_args=(), env=None: PlaybookRun(fleet, text_or_path, extra_args, env,
                                                                          tmp_path)
    return run
