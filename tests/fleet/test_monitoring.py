"""Continuous monitoring end to end on a real node: the gpu_monitoring role over SSH (check mode, converge,
idempotence), node_exporter, the XID watcher following the node's real journald, and a real Prometheus on the
controller with the shipped rules (regenerated for a 2 s scrape interval).

The nodes are systemd-nspawn containers: no /dev/kmsg write reaches their kernel log, so the watcher follows journal
entries the test writes with `logger -t gpufleet-e2e` (journal match SYSLOG_IDENTIFIER=gpufleet-e2e instead of
_TRANSPORT=kernel): real journald, real `journalctl -f`, real cursors; only the transport differs.

Its own 1-node fleet (prefix gpmo), so the other fleet tests never meet a node_exporter or a watcher they did not
install. Run: `flock /tmp/gpufleet-fleet.lock pytest -q -m fleet tests/fleet/test_monitoring.py` as root.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import aptrepo  # noqa: E402
import harness  # noqa: E402
from fleet_ansible import PlaybookRun  # noqa: E402

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(900)]

FLEET_DIR = Path(os.environ.get("GPUFLEET_MONITORING_FLEET_DIR", "/var/tmp/gpufleet-monitoring-fleet"))
PROM_PORT = 19090
SCRAPE_S = 2
XID79 = "NVRM: Xid (PCI:0000:c1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."

PLAY = """
- name: node_exporter and the XID watcher
  hosts: gpufleet_testfleet
  gather_facts: true
  vars:
    gpu_monitoring_journal_matches: [SYSLOG_IDENTIFIER=gpufleet-e2e]
    gpu_monitoring_heartbeat_seconds: 1
    gpu_monitoring_nvidia_smi: ""
    gpu_monitoring_health_interval: 30s
  tasks:
    - name: node_exporter
      ansible.builtin.import_role:
        name: kentino.gpufleet.gpufleet_node_exporter
    - name: gpu_monitoring
      ansible.builtin.import_role:
        name: kentino.gpufleet.gpu_monitoring
"""


@pytest.fixture(scope="module")
def mfleet(fleet_base):
    if not shutil.which("prometheus"):
        pytest.fail("the monitoring fleet test needs /usr/bin/prometheus: apt-get install prometheus")
    base = fleet_base
    fleet = harness.Fleet(dir=FLEET_DIR, nodes_wanted=1, prefix="gpmo", subnet="10.213.11")
    if fleet.state_path.exists():
        harness.Fleet.from_state(FLEET_DIR).down()
    shutil.rmtree(fleet.apt_dir, ignore_errors=True)
    aptrepo.build_repo(fleet.apt_dir, harness.DEFAULT_CACHE, base=base, sim=False, only=(),
                       debian=aptrepo.DEBIAN_PACKAGES)
    fleet.up(base=base)
    fleet.write_inventory(groups=("gpufleet_testfleet", "gpufleet_nodes"))
    fleet.ssh(fleet.nodes[0].name, "apt-get update -q")
    yield fleet
    problems = fleet.down()
    assert not problems and not fleet.leftovers(), problems + fleet.leftovers()


def play(fleet, tmp_path, *args, timeout=600):
    run = PlaybookRun(fleet, PLAY, list(args), None, tmp_path).wait(timeout)
    return run, run.recap.get(fleet.nodes[0].name, {})


class Prometheus:
    def __init__(self, fleet, tmp_path):
        self.url = "http://%s.1:%d" % (fleet.subnet, PROM_PORT)
        rules = tmp_path / "rules.yml"
        subprocess.run([sys.executable, str(REPO / "hack" / "gen_alert_rules.py"), "--scrape-interval",
                        "%ds" % SCRAPE_S, "--output", str(rules)], check=True)
        config = tmp_path / "prometheus.yml"
        config.write_text(textwrap.dedent("""\
            global: {scrape_interval: %ds, evaluation_interval: 1s}
            rule_files: [%s]
            scrape_configs:
              - job_name: gpufleet-node
                static_configs: [{targets: ["%s:9100"]}]
            """ % (SCRAPE_S, rules, fleet.nodes[0].ip)))
        self.log = open(tmp_path / "prometheus.log", "wb")
        self.diagnose = lambda: ""
        self.proc = subprocess.Popen(["prometheus", "--config.file=%s" % config,
                                      "--storage.tsdb.path=%s" % (tmp_path / "tsdb"),
                                      "--web.listen-address=%s.1:%d" % (fleet.subnet, PROM_PORT)],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def get(self, path, **params):
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())["data"]

    def query(self, expr):
        try:
            return self.get("/api/v1/query", query=expr)["result"]
        except OSError:
            return []

    def firing(self, name):
        try:
            alerts = self.get("/api/v1/alerts")["alerts"]
        except OSError:
            return []
        return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"]

    def wait(self, what, predicate, timeout=90):
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            value = predicate()
            if value:
                return value, time.monotonic() - started
            time.sleep(0.25)
        raise AssertionError("%s not seen within %s s; Prometheus alerts: %s\nnode:\n%s" % (
            what, timeout, json.dumps(self.get("/api/v1/alerts"))[:3000], self.diagnose()))

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def test_role_check_mode_converge_and_idempotence(mfleet, tmp_path):
    node = mfleet.nodes[0].name
    before = mfleet.ssh(node, "ls /etc/systemd/system; getent passwd gpufleet-monitor || true").stdout
    check, recap = play(mfleet, tmp_path, "--check")
    assert check.proc.returncode == 0 and recap["failed"] == 0, check.output[-4000:]
    assert recap["changed"] > 0
    assert mfleet.ssh(node, "ls /etc/systemd/system; getent passwd gpufleet-monitor || true").stdout == before
    first, recap = play(mfleet, tmp_path)
    assert first.proc.returncode == 0, first.output[-4000:]
    again, recap = play(mfleet, tmp_path)
    changed = [line for _, line in again.lines if line.startswith("changed:")]
    assert again.proc.returncode == 0 and recap["changed"] == 0, "not idempotent: %s\n%s" % (changed, again.output[-3000:])
    check_again, recap = play(mfleet, tmp_path, "--check")
    assert check_again.proc.returncode == 0 and recap["changed"] == 0, check_again.output[-3000:]
    verify = PlaybookRun(mfleet, REPO / "roles/gpu_monitoring/molecule/default/verify.yml", [], None, tmp_path).wait(300)
    assert verify.proc.returncode == 0, verify.output[-3000:]
    groups = mfleet.ssh(node, "id -nG gpufleet-monitor").stdout.split()
    assert sorted(groups) == ["gpufleet-monitor", "systemd-journal"]


def test_an_xid_79_fires_gpu_lost_and_a_killed_watcher_fires_stale(mfleet, tmp_path):
    node = mfleet.nodes[0].name
    if mfleet.ssh(node, "systemctl is-active gpufleet-xid-watcher", check=False).stdout.strip() != "active":
        run, _recap = play(mfleet, tmp_path)
        assert run.proc.returncode == 0, run.output[-4000:]
    prom = Prometheus(mfleet, tmp_path)
    prom.diagnose = lambda: mfleet.ssh(node, "; ".join([
        "systemctl status --no-pager gpufleet-xid-watcher | head -20",
        "journalctl --no-pager -u gpufleet-xid-watcher | tail -20",
        "journalctl --no-pager -o json SYSLOG_IDENTIFIER=gpufleet-e2e | tail -3",
        "cat /var/lib/gpufleet-monitoring/state/xid-watcher.status.json",
        "head -c 1500 /var/lib/prometheus/node-exporter/gpufleet_xid.prom"]), check=False).stdout
    try:
        prom.wait("the watcher's metrics in Prometheus", lambda: prom.query("gpufleet_watcher_up == 1"))
        assert not prom.firing("GpuLost")
        mfleet.ssh(node, "logger -t gpufleet-e2e %s" % json.dumps(XID79))
        alerts, seconds = prom.wait("GpuLost firing", lambda: prom.firing("GpuLost"))
        print("GpuLost firing %.1f s after the XID line (scrape %d s, evaluation 1 s)" % (seconds, SCRAPE_S))
        assert alerts[0]["labels"]["pci"] == "0000:c1:00" and alerts[0]["labels"]["severity"] == "critical"
        assert "fell off the bus" in alerts[0]["annotations"]["summary"]
        # The same scrape, but a rule evaluated before the scrape landed sees it one evaluation later: wait for it.
        critical, _seconds = prom.wait("GpuXidCritical firing", lambda: prom.firing("GpuXidCritical"))
        assert critical[0]["labels"]["xid"] == "79"
        count = 'gpufleet_xid_events_total{xid="79"}'
        assert [r["value"][1] for r in prom.query(count)] == ["1"]

        # A restart counts nothing twice (the journal cursor and the counters are saved together).
        mfleet.ssh(node, "systemctl restart gpufleet-xid-watcher")
        restarted = mfleet.ssh(node, "systemctl show -p ExecMainStartTimestampMonotonic gpufleet-xid-watcher").stdout
        prom.wait("the restarted watcher's heartbeat", lambda: prom.query(
            "time() - gpufleet_watcher_start_time_seconds < 30 and gpufleet_watcher_up == 1"))
        time.sleep(3 * SCRAPE_S)
        assert [r["value"][1] for r in prom.query(count)] == ["1"], restarted
        mfleet.ssh(node, "logger -t gpufleet-e2e %s" % json.dumps("NVRM: Xid (PCI:0000:21:00): 48, pid=1, name=x, DBE"))
        prom.wait("the next event counted once", lambda: prom.query('gpufleet_xid_events_total{xid="48"} == 1'))
        assert [r["value"][1] for r in prom.query(count)] == ["1"]

        # Killed: no more heartbeats, the stale alert fires after three scrape intervals.
        assert not prom.firing("GpufleetWatcherStale")
        # The watcher itself (its journalctl child follows it out): a signal to every process of the unit failed once
        # with EIO on a journalctl that was exiting.
        mfleet.ssh(node, "systemctl kill --kill-whom=main gpufleet-xid-watcher")
        _alerts, seconds = prom.wait("GpufleetWatcherStale firing", lambda: prom.firing("GpufleetWatcherStale"))
        print("GpufleetWatcherStale firing %.1f s after systemctl kill" % seconds)
        assert mfleet.ssh(node, "systemctl is-active gpufleet-xid-watcher", check=False).stdout.strip() != "active"
    finally:
        prom.stop()
        mfleet.ssh(node, "systemctl start gpufleet-xid-watcher", check=False)
