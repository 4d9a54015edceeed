"""The elastic_training role for real on a test-fleet node (systemd-nspawn, systemd, SSH): check mode on a fresh node,
converge, idempotence, the molecule scenario's verify, the unit, its environment and drop-ins, `systemctl` showing it
enabled and running; then the operations through playbooks/elastic_training.yml - status, drain (the launcher stops
torchrun, exit 12, the node stays out across a start), undrain, stop - and a node refused by its health gate (exit 11,
which systemd does not restart).

The node has no GPU and no torch: torchrun is the molecule prepare's stand-in that records how the launcher started
it and runs until stopped (the launcher with the real torchrun is tested in tests/unit/elastic). Its own 1-node
fleet (prefix gpel). Run: `flock /tmp/gpufleet-fleet.lock pytest -q -m fleet tests/fleet/test_elastic_training.py`.
"""

import json
import os
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

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(1500)]

FLEET_DIR = Path(os.environ.get("GPUFLEET_ELASTIC_FLEET_DIR", "/var/tmp/gpufleet-elastic-fleet"))
SCENARIO = REPO / "roles" / "elastic_training" / "molecule" / "default"
UNIT = "gpufleet-elastic-llm.service"
# What the stand-in torchrun records, in the job's state directory (the unit's /tmp and /var/tmp are private).
STANDIN = "/var/lib/gpufleet-elastic/llm/torchrun"
# The molecule scenario's job, for the operations playbook (the job name picks the service).
JOB = {"elastic_training_job": "llm", "elastic_training_entrypoint": "/opt/train/train.py",
       "elastic_training_torchrun": "/opt/train/bin/torchrun", "elastic_training_user": "trainer",
       "elastic_training_group": "trainer"}


@pytest.fixture(scope="module")
def efleet(fleet_base):
    base = fleet_base
    fleet = harness.Fleet(dir=FLEET_DIR, nodes_wanted=1, prefix="gpel", subnet="10.213.14")
    if fleet.state_path.exists():
        harness.Fleet.from_state(FLEET_DIR).down()
    shutil.rmtree(fleet.apt_dir, ignore_errors=True)
    aptrepo.build_repo(fleet.apt_dir, harness.DEFAULT_CACHE, base=base, sim=False, only=())
    fleet.up(base=base)
    fleet.write_inventory(groups=("gpufleet_testfleet", "gpufleet_nodes"))
    yield fleet
    problems = fleet.down()
    assert not problems and not fleet.leftovers(), problems + fleet.leftovers()


@pytest.fixture(scope="module")
def run(efleet, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic")

    def _run(playbook, *extra, timeout=600):
        started = time.monotonic()
        r = PlaybookRun(efleet, playbook, list(extra), None, tmp).wait(timeout)
        print("%-50s %5.1f s rc=%s %s" % (" ".join([Path(str(playbook)).name] + list(extra))[:50],
                                          time.monotonic() - started, r.proc.returncode, r.recap))
        return r
    _run.tmp = tmp
    return _run


def sh(fleet, cmd, check=True):
    return fleet.ssh(fleet.nodes[0].name, cmd, timeout=60, check=check)


def unit(fleet, *props):
    out = sh(fleet, "systemctl show %s %s" % (UNIT, " ".join("-p " + p for p in props))).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_unit(fleet, predicate, what, timeout=90):
    deadline = time.monotonic() + timeout
    state = {}
    while time.monotonic() < deadline:
        state = unit(fleet, "ActiveState", "SubState", "ExecMainStatus", "NRestarts", "Result")
        if predicate(state):
            return state
        time.sleep(0.5)
    raise AssertionError("%s not seen within %s s: %s\n%s" % (what, timeout, state, journal(fleet)[-3000:]))


def journal(fleet):
    return sh(fleet, "journalctl -u %s --no-pager -o cat" % UNIT, check=False).stdout


def flat(text):
    """Ansible's YAML output with its line folding and quoting undone."""
    return " ".join(text.replace("'", "").split())


def job_file(run, **extra):
    path = run.tmp / "job.json"
    path.write_text(json.dumps(dict(JOB, **extra)))
    return "@%s" % path


def test_check_mode_converge_idempotence_and_the_unit(efleet, run):
    node = efleet.nodes[0].name
    prep = run(SCENARIO / "prepare.yml")
    assert prep.proc.returncode == 0, prep.output[-3000:]
    snapshot = "ls /etc/systemd/system /var/lib; ls -d /usr/lib/gpufleet-elastic /etc/gpufleet 2>/dev/null || true"
    before = sh(efleet, snapshot).stdout

    check = run(SCENARIO / "converge.yml", "--check")
    assert check.proc.returncode == 0 and check.recap[node]["failed"] == 0, check.output[-4000:]
    assert check.recap[node]["changed"] > 0  # it said what it would change
    assert sh(efleet, snapshot).stdout == before  # and changed nothing

    first = run(SCENARIO / "converge.yml")
    assert first.proc.returncode == 0, first.output[-4000:]
    again = run(SCENARIO / "converge.yml")
    changed = [line for _, line in again.lines if line.startswith("changed:")]
    assert again.proc.returncode == 0 and again.recap[node]["changed"] == 0, "not idempotent: %s\n%s" % (
        changed, again.output[-3000:])
    check = run(SCENARIO / "converge.yml", "--check")
    assert check.proc.returncode == 0 and check.recap[node]["changed"] == 0, check.output[-3000:]
    verify = run(SCENARIO / "verify.yml")
    assert verify.proc.returncode == 0, verify.output[-3000:]

    assert sh(efleet, "systemctl is-enabled %s" % UNIT).stdout.strip() == "enabled"
    assert sh(efleet, "systemctl is-active %s" % UNIT).stdout.strip() == "active"
    text = sh(efleet, "cat /etc/systemd/system/%s" % UNIT).stdout
    for line in ("ExecStart=/usr/bin/python3 /usr/lib/gpufleet-elastic/bin/gpufleet-elastic run --config "
                 "/etc/gpufleet/elastic/llm.json", "User=trainer", "KillMode=mixed", "SuccessExitStatus=12",
                 "RestartPreventExitStatus=2 10 11", "Restart=on-failure", "EnvironmentFile=-/etc/environment",
                 "WantedBy=multi-user.target"):
        assert "\n%s\n" % line in text, line
    dropins = sh(efleet, "cat /etc/systemd/system/%s.d/10-gpufleet-environment.conf "
                         "/etc/systemd/system/%s.d/50-overrides.conf" % (UNIT, UNIT)).stdout
    assert 'Environment="GPUFLEET_TEST=50%%"' in dropins and 'Environment="NCCL_DEBUG=WARN"' in dropins
    assert "\n[Service]\nNice=5\n" in dropins
    config = json.loads(sh(efleet, "cat /etc/gpufleet/elastic/llm.json").stdout)
    assert (config["nproc_per_node"], config["min_nodes"], config["max_nodes"]) == (2, 1, 4)
    assert config["gate"]["checks"] == ["xid", "storage"] and config["host"] == node
    owners = sh(efleet, "stat -c '%U %a %n' /srv/ckpt-elastic /var/lib/gpufleet-elastic/llm "
                        "/var/lib/gpufleet-elastic/metrics").stdout.split("\n")
    assert owners[:3] == ["trainer 750 /srv/ckpt-elastic", "trainer 750 /var/lib/gpufleet-elastic/llm",
                          "trainer 755 /var/lib/gpufleet-elastic/metrics"]
    log = journal(efleet)
    assert "gpufleet-elastic[llm]: attempt 1:" in log, log[-3000:]
    # the launcher's metrics reach the textfile directory through the link
    prom = sh(efleet, "cat /var/lib/prometheus/node-exporter/gpufleet_elastic_llm.prom").stdout
    assert 'gpufleet_elastic_state{state="running",training_job="llm"} 1' in prom


def test_status_drain_start_undrain_stop_through_the_playbook(efleet, run):
    playbook = REPO / "playbooks" / "elastic_training.yml"
    status = run(playbook, "-e", job_file(run), "-e", "elastic_training_action=status")
    assert status.proc.returncode == 0, status.output[-3000:]
    shown = flat(status.output)
    assert "launcher: running" in shown and "service: active/running (enabled), 0 restart(s) by systemd " in shown, \
        status.output[-3000:]

    drain = run(playbook, "-e", job_file(run, elastic_training_drain_reason="riser swap"), "-e",
                "elastic_training_action=drain")
    assert drain.proc.returncode == 0, drain.output[-3000:]
    state = unit(efleet, "ActiveState", "ExecMainStatus", "Result")
    assert (state["ActiveState"], state["ExecMainStatus"], state["Result"]) == ("inactive", "12", "success"), state
    assert sh(efleet, "cat %s.stopped" % STANDIN).stdout.strip() == "stopped"  # torchrun got SIGTERM
    assert "stopping torchrun (drained)" in journal(efleet)

    status = run(playbook, "-e", job_file(run), "-e", "elastic_training_action=status")
    shown = flat(status.output)
    assert "last exit 12: stopped or drained on request" in shown and "drained: True (riser swap)" in shown, shown[-3000:]

    # started while drained: the gate keeps it out, exit 12, no torchrun
    sh(efleet, "rm -f %s.argv" % STANDIN)
    start = run(playbook, "-e", job_file(run), "-e", "elastic_training_action=start")
    assert start.proc.returncode == 0, start.output[-3000:]
    wait_unit(efleet, lambda s: s["ActiveState"] == "inactive" and s["ExecMainStatus"] == "12", "the drained exit")
    assert "gate: FAIL NODE_DRAINED" in journal(efleet) and "drained: not joining the job" in journal(efleet)
    assert sh(efleet, "test -e %s.argv" % STANDIN, check=False).returncode == 1

    undrain = run(playbook, "-e", job_file(run), "-e", "elastic_training_action=undrain")
    assert undrain.proc.returncode == 0, undrain.output[-3000:]
    wait_unit(efleet, lambda s: s["ActiveState"] == "active", "the job running again")
    deadline = time.monotonic() + 60
    while sh(efleet, "test -e %s.argv" % STANDIN, check=False).returncode and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "--rdzv-id=llm" in sh(efleet, "cat %s.argv" % STANDIN).stdout

    stop = run(playbook, "-e", job_file(run), "-e", "elastic_training_action=stop")
    assert stop.proc.returncode == 0, stop.output[-3000:]
    state = unit(efleet, "ActiveState", "ExecMainStatus")
    assert (state["ActiveState"], state["ExecMainStatus"]) == ("inactive", "12"), state


def test_a_node_refused_by_its_gate_exits_11_and_stays_down(efleet, run):
    # No nvidia-smi on this node: the gpus check cannot run, which keeps the node out (error refuses by default).
    r = run(SCENARIO / "converge.yml", "-e", '{"elastic_training_gate_checks": ["gpus", "storage"], '
                                           '"elastic_training_restart_on_change": true, "elastic_training_restart_sec": 2}')
    assert r.proc.returncode == 0, r.output[-3000:]
    # systemd decides at the exit: a unit it will restart waits in SubState auto-restart; "failed" is final
    # (RestartPreventExitStatus=11), so no waiting out RestartSec is needed to know it stays down.
    state = wait_unit(efleet, lambda s: s["ExecMainStatus"] == "11" and s["SubState"] in ("failed", "auto-restart"),
                      "the refusal")
    assert (state["ActiveState"], state["SubState"], state["ExecMainStatus"], state["NRestarts"]) == (
        "failed", "failed", "11", "0"), state
    log = journal(efleet)
    assert "gate: ERROR GPU_FACTS_UNREADABLE" in log and "refused by the health gate (GPU_FACTS_UNREADABLE)" in log, \
        log[-3000:]
    prom = sh(efleet, "cat /var/lib/prometheus/node-exporter/gpufleet_elastic_llm.prom").stdout
    assert 'gpufleet_elastic_state{state="refused",training_job="llm"} 1' in prom
    # back to the scenario's gate: converging starts the job again
    r = run(SCENARIO / "converge.yml")
    assert r.proc.returncode == 0, r.output[-3000:]
    wait_unit(efleet, lambda s: s["ActiveState"] == "active", "the job running again")
