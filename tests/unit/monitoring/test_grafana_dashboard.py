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
    assert [v["name"] for v in data["templating"]["list"]] == ["datasource", "instance"]
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
        {"record": "gpufleet:dashboard_query_%d" % i, "expr": re.sub(r"\$\{?instance\}?", ".*", e)}
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
