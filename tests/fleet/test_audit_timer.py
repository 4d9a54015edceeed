"""The nightly audit timer (role kentino.gpufleet.audit_timer) for real on a test-fleet node: systemd, a system user,
the units. Check mode on the fresh node changes nothing, converge is idempotent, the molecule verify.yml (schedule,
the service run as the audit's user with the extra-vars file, exit 2 of a failing gate counted as a completed audit)
passes, and bad input is refused before anything changes.

The node has no Ansible: the scenario's converge.yml points the unit at a stand-in ansible-playbook that records its
arguments (the unit's contract); the playbook itself is tested on the simulated fleet (tests/integration).
Its own 1-node fleet (prefix gpat). Run: `flock /tmp/gpufleet-fleet.lock pytest -q -m fleet tests/fleet/test_audit_timer.py`.
"""

import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import aptrepo  # noqa: E402
import harness  # noqa: E402
from fleet_ansible import PlaybookRun  # noqa: E402

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(900)]
FLEET_DIR = Path(os.environ.get("GPUFLEET_AUDIT_TIMER_FLEET_DIR", "/var/tmp/gpufleet-audit-timer-fleet"))
SCENARIO = REPO / "roles" / "audit_timer" / "molecule" / "default"


@pytest.fixture(scope="module")
def afleet(fleet_base):
    base = fleet_base
    fleet = harness.Fleet(dir=FLEET_DIR, nodes_wanted=1, prefix="gpat", subnet="10.213.13")
    if fleet.state_path.exists():
        harness.Fleet.from_state(FLEET_DIR).down()
    shutil.rmtree(fleet.apt_dir, ignore_errors=True)
    aptrepo.build_repo(fleet.apt_dir, harness.DEFAULT_CACHE, base=base, sim=False, only=(), debian=())
    fleet.up(base=base)
    fleet.write_inventory(groups=("gpufleet_testfleet",))
    yield fleet
    problems = fleet.down()
    assert not problems and not fleet.leftovers(), problems + fleet.leftovers()


def play(fleet, tmp_path, playbook, *args, timeout=600):
    run = PlaybookRun(fleet, playbook, list(args), None, tmp_path).wait(timeout)
    return run, run.recap.get(fleet.nodes[0].name, {})


def sh(fleet, cmd, check=True):
    return fleet.ssh(fleet.nodes[0].name, cmd, timeout=60, check=check)


def test_bad_input_is_refused_before_anything_changes(afleet, tmp_path):
    run, recap = play(afleet, tmp_path, SCENARIO / "converge.yml", "-e", '{"audit_timer_on_calendar": "every night"}')
    assert run.proc.returncode != 0 and recap.get("failed") == 1, run.output[-3000:]
    assert 'audit_timer_on_calendar "every night" is not a systemd calendar expression' in " ".join(run.output.split())
    assert sh(afleet, "test -e /etc/systemd/system/gpufleet-audit.service", check=False).returncode == 1
    run, _recap = play(afleet, tmp_path, SCENARIO / "converge.yml", "-e", '{"audit_timer_inventory": "fleet.yml"}')
    assert run.proc.returncode != 0 and "audit_timer_inventory and the other paths must be absolute" in " ".join(
        run.output.split()) and "fleet.yml" in run.output, run.output[-3000:]


def test_check_mode_converge_idempotence_and_verify(afleet, tmp_path):
    run, recap = play(afleet, tmp_path, SCENARIO / "converge.yml", "--check")
    assert run.proc.returncode == 0 and recap["failed"] == 0, run.output[-3000:]
    assert sh(afleet, "test -e /etc/systemd/system/gpufleet-audit.timer", check=False).returncode == 1
    run, recap = play(afleet, tmp_path, SCENARIO / "converge.yml")
    assert run.proc.returncode == 0 and recap["changed"] > 0, run.output[-3000:]
    run, recap = play(afleet, tmp_path, SCENARIO / "converge.yml")
    assert run.proc.returncode == 0 and recap["changed"] == 0, "not idempotent:\n" + run.output[-3000:]
    run, recap = play(afleet, tmp_path, SCENARIO / "verify.yml")
    assert run.proc.returncode == 0, run.output[-4000:]
    assert "gpufleet-audit.timer" in sh(afleet, "systemctl list-timers --all --no-pager").stdout
    assert sh(afleet, "systemd-analyze verify /etc/systemd/system/gpufleet-audit.service "
                      "/etc/systemd/system/gpufleet-audit.timer 2>&1", check=False).stdout.strip() == ""
