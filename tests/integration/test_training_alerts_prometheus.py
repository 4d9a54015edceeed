"""The training alerts end to end, with the real parts a site runs: ranks write their files with gpufleet_metrics,
Debian's prometheus-node-exporter serves them from its textfile directory, and a real Prometheus scrapes it and
evaluates the shipped rule file. A rank whose loss went NaN fires TrainingLossNaN, a rank whose last step was ten
minutes ago fires TrainingStalled, and the healthy rank fires nothing (the promtool unit tests cover every rule's
edges; this checks that the helper's series, the exporter and the rules fit together)."""

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import gpufleet_metrics as gm

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "prometheus" / "gpufleet-training-alerts.yml"
NODE_EXPORTER = shutil.which("prometheus-node-exporter")
PROMETHEUS = shutil.which("prometheus")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, path, **params):
    with urllib.request.urlopen(url + path + ("?" + urllib.parse.urlencode(params) if params else ""),
                                timeout=5) as resp:
        return json.loads(resp.read())["data"]


def write_ranks(textfiles):
    """Three ranks of job e2e, as a training loop leaves them: rank 0 healthy, rank 1 with a NaN loss, rank 2 whose
    last step finished ten minutes ago (its clock is the real one, shifted: the same file a hung rank leaves)."""
    now = time.time()
    for rank, losses, shift in ((0, [2.0, 1.9, 1.8], 0.0), (1, [2.0, 1.9, float("nan")], 0.0),
                                (2, [2.0, 1.9, 1.85], -600.0)):
        metrics = gm.TrainingMetrics(str(textfiles), job="e2e", rank=rank, local_rank=rank, world_size=3,
                                     min_interval_s=0, clock=lambda s=shift: now + s,
                                     memory=lambda: {"memory": "cpu", "allocated": 1 << 30, "max_reserved": 1 << 30})
        for step, loss in enumerate(losses, 1):
            metrics.step(step, loss, step_time_s=0.1)
        assert metrics.write_errors == 0, metrics.last_error


@pytest.fixture
def prometheus(tmp_path):
    if not (NODE_EXPORTER and PROMETHEUS):
        pytest.fail("this test needs Debian's prometheus and prometheus-node-exporter: run hack/system-deps as root")
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    exporter_port, prom_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [%s]\nscrape_configs:\n"
                      "  - job_name: node\n    static_configs: [{targets: ['127.0.0.1:%d']}]\n" % (RULES, exporter_port))
    logs = open(tmp_path / "daemons.log", "wb")
    procs = [subprocess.Popen([NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
                               "--collector.textfile.directory=%s" % textfiles,
                               "--web.listen-address=127.0.0.1:%d" % exporter_port], stdout=logs,
                              stderr=subprocess.STDOUT),
             subprocess.Popen([PROMETHEUS, "--config.file=%s" % config, "--storage.tsdb.path=%s" % (tmp_path / "tsdb"),
                               "--web.listen-address=127.0.0.1:%d" % prom_port], stdout=logs,
                              stderr=subprocess.STDOUT)]
    try:
        yield textfiles, "http://127.0.0.1:%d" % prom_port, tmp_path / "daemons.log"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        logs.close()


def alerts(url):
    try:
        return get(url, "/api/v1/alerts")["alerts"]
    except OSError:
        return []  # not listening yet


def test_nan_and_stalled_ranks_fire_and_the_healthy_rank_does_not(prometheus):
    textfiles, url, log = prometheus
    write_ranks(textfiles)
    wanted = {("TrainingLossNaN", "1"), ("TrainingStalled", "2")}
    deadline = time.monotonic() + 120
    firing = set()
    while time.monotonic() < deadline:
        current = alerts(url)
        firing = {(a["labels"]["alertname"], a["labels"].get("rank")) for a in current if a["state"] == "firing"}
        if wanted <= firing:
            break
        time.sleep(0.5)
    assert wanted <= firing, "firing: %s\nalerts: %s\nlog tail: %s" % (
        firing, json.dumps(current)[:2000], log.read_text()[-2000:])
    # a few more evaluations: nothing else fires or is pending, and nothing at all for the healthy rank
    time.sleep(3)
    seen = {(a["labels"]["alertname"], a["labels"].get("rank"), a["state"]) for a in alerts(url)}
    assert {(name, rank) for name, rank, _state in seen} == wanted, seen
    series = get(url, "/api/v1/query", query='gpufleet_training_step{training_job="e2e"}')["result"]
    assert sorted((s["metric"]["rank"], s["value"][1]) for s in series) == [("0", "3"), ("1", "3"), ("2", "3")]
