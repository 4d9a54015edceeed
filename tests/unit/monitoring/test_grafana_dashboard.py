"""The fleet dashboard: generated with grafana-foundation-sdk (--check), importable as is, every query valid PromQL
on metrics the collection (or dcgm-exporter) exports."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "monitoring" / "grafana" / "gpufleet-fleet.json"
GEN = REPO / "hack" / "gen_grafana_dashboard.py"

sdk = pytest.importorskip("grafana_foundation_sdk", reason="pip install grafana-foundation-sdk (dev dependency)")


def panels():
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p.get("type") != "row"]


def exprs():
    return [t["expr"] for p in panels() for t in p.get("targets", [])]


def test_the_shipped_dashboard_is_generated():
    res = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_it_reads_back_into_the_sdk_model_and_is_importable():
    from grafana_foundation_sdk.models.dashboard import Dashboard
    data = json.loads(DASHBOARD.read_text())
    model = Dashboard.from_json(data)
    assert model.uid == "gpufleet-fleet" and model.title.startswith("GPU fleet health")
    # Import as is: no numeric id (Grafana assigns one), a data source variable, every panel bound to it.
    assert "id" not in data or data["id"] is None
    assert [v["name"] for v in data["templating"]["list"]] == ["datasource", "node"]
    ids = [p["id"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["gridPos"]["w"] > 0 and panel["gridPos"]["h"] > 0
        assert panel.get("targets"), panel["title"]


def test_it_shows_what_the_brief_asks_for():
    titles = " | ".join(p["title"] for p in panels())
    for needle in ("Lost GPUs", "XID events by severity", "GPU temperature", "ECC", "Checkpoint", "NVMe wear"):
        assert needle in titles, needle
    text = "\n".join(exprs())
    for metric in ("gpufleet_gpu_lost", "gpufleet_xid_events_total", "DCGM_FI_DEV_GPU_TEMP",
                   "gpufleet_gpu_ecc_errors_total", "gpufleet_checkpoint_free_bytes", "gpufleet_nvme_percent_used"):
        assert metric in text, metric


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: apt-get install prometheus")
def test_every_query_is_valid_promql(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "gpufleet:dashboard_query_%d" % i, "expr": re.sub(r"\$\{?node\}?", ".*", e)}
        for i, e in enumerate(exprs())]}]}
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules))
    res = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_gpufleet_metric_it_queries_is_exported():
    node_side = "".join((REPO / "plugins" / "module_utils" / n).read_text() for n in ("xid_watcher.py", "node_health.py"))
    queried = set(re.findall(r"\b(gpufleet_[a-z_]+)", "\n".join(exprs())))
    missing = sorted(m for m in queried if '"%s"' % m not in node_side)
    assert not missing, missing


# node_exporter (the gpufleet textfiles) and dcgm-exporter are scraped on one host at two ports (host:9100,
# host:9400, monitoring/prometheus/scrape-gpufleet.yml): the node selector is the host, matched with any port.
NODE_MATCHER = 'instance=~"${node}(:[0-9]+)?"'


def test_every_series_of_every_panel_follows_the_node_selector():
    unfiltered = []
    for panel in panels():
        for target in panel["targets"]:
            for metric, labels in re.findall(r"\b(gpufleet_[a-z_]+|DCGM_FI_[A-Z_]+)(\{(?:[^{}]|\$\{\w+\})*\})?",
                                             target["expr"]):
                if NODE_MATCHER not in labels:
                    unfiltered.append("%s: %s%s" % (panel["title"], metric, labels))
    assert not unfiltered, "series that ignore the Node selector:\n" + "\n".join(unfiltered)


def test_the_node_selector_lists_hosts_from_either_exporter():
    variable = json.loads(DASHBOARD.read_text())["templating"]["list"][1]
    assert variable["label"] == "Node" and variable["multi"] and variable["includeAll"]
    pattern = re.compile(variable["regex"].strip("/"))
    for instance, host in (("gpu-node-01:9100", "gpu-node-01"), ("gpu-node-01", "gpu-node-01"),
                           ("10.0.0.7:9100", "10.0.0.7"), ("[fd00::7]:9100", "[fd00::7]")):
        assert pattern.match(instance).group(1) == host
    matcher = re.compile(NODE_MATCHER.split('"')[1].replace("${node}", re.escape("gpu-node-01")) + r"\Z")
    assert matcher.match("gpu-node-01:9100") and matcher.match("gpu-node-01:9400")
    assert not matcher.match("gpu-node-011:9400")
