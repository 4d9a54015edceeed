#!/usr/bin/env python3
"""Generate monitoring/grafana/gpufleet-fleet.json, the fleet dashboard, with grafana-foundation-sdk.

Per-node GPU health (lost GPUs, visible vs expected, the watcher's heartbeat), XIDs over time by severity,
temperatures and thermal throttling (dcgm-exporter), ECC and row remaps, checkpoint storage and NVMe wear. The JSON
is importable as is (Dashboards > New > Import); the data source is a variable, so it binds to any Prometheus.
tests/unit/monitoring/test_grafana_dashboard.py fails when the shipped file is out of date.

Usage:  hack/gen_grafana_dashboard.py           rewrite the shipped file
        hack/gen_grafana_dashboard.py --check   exit 1 when it differs from what would be generated
"""

import argparse
import json
import sys
from pathlib import Path

from generated import docs_base_url, write_or_check  # noqa: E402 (hack/ is on sys.path: run as a script)
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as prom_m

REPO = Path(__file__).resolve().parents[1]
OUT_PATH = REPO / "monitoring" / "grafana" / "gpufleet-fleet.json"
UID = "gpufleet-fleet"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
# node_exporter (the gpufleet textfiles) and dcgm-exporter run on one host at two ports (host:9100, host:9400 in
# monitoring/prometheus/scrape-gpufleet.yml): the Node variable is the host part of `instance`, matched with any port,
# so the DCGM panels follow the selection as the gpufleet ones do.
NODE = 'instance=~"${node}(:[0-9]+)?"'
HOST_OF_INSTANCE = r"/^(.*?)(?::[0-9]+)?$/"


def query(expr, legend=None, instant=False):
    q = prometheus.Dataquery().expr(expr).datasource(DS)
    if legend:
        q = q.legend_format(legend)
    if instant:
        q = q.instant().format(prom_m.PromQueryFormat.TABLE)
    return q


def thresholds(*steps):
    """steps: (value or None, colour); the first has None (the base)."""
    return dash.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in steps])


def ts(title, *queries, unit=None, height=8, span=12, stack=False, description=None):
    panel = timeseries.Panel().title(title).datasource(DS).height(height).span(span).fill_opacity(10).line_width(1)
    for q in queries:
        panel = panel.with_target(q)
    if unit:
        panel = panel.unit(unit)
    if stack:
        panel = panel.stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL)).draw_style(
            common.GraphDrawStyle.BARS)
    if description:
        panel = panel.description(description)
    return panel


def single(title, q, height=4, span=4, unit=None, steps=((None, "green"),), description=None):
    panel = stat.Panel().title(title).datasource(DS).height(height).span(span).with_target(q).thresholds(
        thresholds(*steps))
    if unit:
        panel = panel.unit(unit)
    if description:
        panel = panel.description(description)
    return panel


def build():
    d = (dash.Dashboard("GPU fleet health (kentino.gpufleet)")
         .uid(UID)
         .tags(["gpufleet", "gpu", "nvidia"])
         .description("Per-node GPU health from the gpufleet XID watcher and health collector (node_exporter "
                      "textfiles) and dcgm-exporter. Alerts and runbooks: docs/monitoring.md.")
         .refresh("30s")
         .time("now-24h", "now")
         .timezone("browser")
         .editable()
         .with_variable(dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
         .with_variable(dash.QueryVariable("node").label("Node").datasource(DS)
                        .query("label_values(gpufleet_watcher_up, instance)").regex(HOST_OF_INSTANCE)
                        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                        .multi(True).include_all(True).all_value(".*")
                        .current(dm.VariableOption(selected=True, text="All", value="$__all")))
         .link(dash.DashboardLink("Runbooks (docs/monitoring.md)").type(dm.DashboardLinkType.LINK)
               .url(docs_base_url() + "/monitoring.md").target_blank(True)))

    d = d.with_row(dash.Row("Fleet now"))
    d = d.with_panel(single("Lost GPUs", query("sum(gpufleet_gpu_lost{%s}) or vector(0)" % NODE),
                            steps=((None, "green"), (1, "red")),
                            description="GPUs that fell off the bus in this boot (XID 79, the driver's message, or "
                                        "nvidia-smi)."))
    d = d.with_panel(single("GPUs missing (expected - visible)",
                            query("sum(gpufleet_gpus_expected{%s} - gpufleet_gpus_visible{%s}) or vector(0)"
                                  % (NODE, NODE)), steps=((None, "green"), (1, "red"))))
    d = d.with_panel(single("Critical XIDs, last 24 h",
                            query('sum(increase(gpufleet_xid_events_total{%s,severity="critical"}[24h])) or vector(0)'
                                  % NODE), steps=((None, "green"), (1, "orange"), (5, "red"))))
    d = d.with_panel(single("Watchers stale",
                            query("count(time() - gpufleet_watcher_last_update_timestamp_seconds{%s} > 90) or vector(0)"
                                  % NODE), steps=((None, "green"), (1, "orange")),
                            description="Nodes whose XID watcher has not written for 90 s (three 30 s scrapes)."))
    d = d.with_panel(single("Hottest GPU", query("max(DCGM_FI_DEV_GPU_TEMP{%s})" % NODE), unit="celsius",
                            steps=((None, "green"), (80, "orange"), (85, "red"))))
    d = d.with_panel(single("Fullest checkpoint filesystem",
                            query("max(1 - gpufleet_checkpoint_free_bytes{%s} / gpufleet_checkpoint_size_bytes{%s})"
                                  % (NODE, NODE)), unit="percentunit",
                            steps=((None, "green"), (0.85, "orange"), (0.95, "red"))))

    d = d.with_row(dash.Row("Per node"))
    d = d.with_panel(
        table.Panel().title("GPUs per node").datasource(DS).height(8).span(24)
        .with_target(query("gpufleet_gpus_visible{%s}" % NODE, instant=True).ref_id("visible"))
        .with_target(query("gpufleet_gpus_expected{%s}" % NODE, instant=True).ref_id("expected"))
        .with_target(query("sum by (instance) (gpufleet_gpu_lost{%s})" % NODE, instant=True).ref_id("lost"))
        .with_target(query('sum by (instance) (increase(gpufleet_xid_events_total{%s}[24h]))' % NODE,
                           instant=True).ref_id("xids_24h"))
        .with_target(query("time() - gpufleet_watcher_last_update_timestamp_seconds{%s}" % NODE,
                           instant=True).ref_id("heartbeat_age_s"))
        .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True, "job": True, "__name__": True},
            "renameByName": {"Value #visible": "visible", "Value #expected": "expected", "Value #lost": "lost",
                             "Value #xids_24h": "XIDs 24 h", "Value #heartbeat_age_s": "watcher age (s)"}})))

    d = d.with_row(dash.Row("XIDs"))
    d = d.with_panel(ts("XID events by severity (per 5 min)",
                        query('sum by (severity) (increase(gpufleet_xid_events_total{%s}[5m]))' % NODE,
                              "{{severity}}"), stack=True, span=12))
    d = d.with_panel(ts("XID events by node, GPU and code (per 5 min)",
                        query('sum by (instance, gpu, pci, xid) (increase(gpufleet_xid_events_total{%s}[5m])) > 0'
                              % NODE, "{{instance}} GPU {{gpu}} ({{pci}}) XID {{xid}}"), stack=True, span=12))
    d = d.with_panel(ts("XID 92 (single-bit ECC) per day: the slow leak",
                        query('sum by (instance, pci) (increase(gpufleet_xid_events_total{%s,xid="92"}[1d]))' % NODE,
                              "{{instance}} {{pci}}"), span=12))
    d = d.with_panel(ts("Kernel log read by the XID watcher (bytes per second)",
                        query("sum by (instance) (rate(gpufleet_watcher_bytes_read_total{%s}[5m]))" % NODE,
                              "{{instance}}"), unit="Bps", span=12))
    d = d.with_panel(ts("Kernel log lines the XID watcher could not read (per second)",
                        query("sum by (instance) (rate(gpufleet_watcher_lines_unparsed_total{%s}[5m]))" % NODE,
                              "{{instance}} unparsed"), unit="ops", span=12))

    d = d.with_row(dash.Row("Temperature and throttling"))
    d = d.with_panel(ts("GPU temperature (dcgm-exporter)",
                        query("DCGM_FI_DEV_GPU_TEMP{%s}" % NODE, "{{Hostname}}{{hostname}} GPU {{gpu}}"), unit="celsius"))
    d = d.with_panel(ts("Thermal violation (dcgm-exporter) and thermal slowdown",
                        query("rate(DCGM_FI_DEV_THERMAL_VIOLATION{%s}[5m]) / 1e6" % NODE,
                              "{{Hostname}}{{hostname}} GPU {{gpu}} violation"),
                        query('gpufleet_gpu_throttle_reason_active{%s,reason=~".*thermal.*"} == 1' % NODE,
                              "{{instance}} GPU {{gpu}} {{reason}}"), unit="percentunit"))

    d = d.with_row(dash.Row("ECC and memory"))
    d = d.with_panel(ts("Corrected ECC errors per hour",
                        query('sum by (instance, gpu) (increase(gpufleet_gpu_ecc_errors_total{%s,type="corrected",'
                              'scope="aggregate"}[1h]))' % NODE, "{{instance}} GPU {{gpu}}"),
                        query("increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{%s}[1h])" % NODE,
                              "{{Hostname}}{{hostname}} GPU {{gpu}} (dcgm)"), span=8))
    d = d.with_panel(ts("Uncorrected ECC errors",
                        query('gpufleet_gpu_ecc_errors_total{%s,type="uncorrected",scope="aggregate"}' % NODE,
                              "{{instance}} GPU {{gpu}}"),
                        query("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{%s}" % NODE, "{{Hostname}}{{hostname}} GPU {{gpu}} (dcgm)"), span=8))
    d = d.with_panel(ts("Row remaps and banks without a spare row",
                        query("gpufleet_gpu_remapped_rows{%s}" % NODE, "{{instance}} GPU {{gpu}} {{cause}}"),
                        query('gpufleet_gpu_remap_banks{%s,availability="none"}' % NODE,
                              "{{instance}} GPU {{gpu}} banks without spare"),
                        query("sum by (instance, gpu) (gpufleet_gpu_retired_pages{%s})" % NODE,
                              "{{instance}} GPU {{gpu}} retired pages"), span=8))

    d = d.with_row(dash.Row("Checkpoint storage"))
    d = d.with_panel(ts("Checkpoint filesystem free",
                        query("gpufleet_checkpoint_free_bytes{%s} / gpufleet_checkpoint_size_bytes{%s}" % (NODE, NODE),
                              "{{instance}} {{path}} space"),
                        query("gpufleet_checkpoint_free_inodes{%s} / gpufleet_checkpoint_inodes{%s}" % (NODE, NODE),
                              "{{instance}} {{path}} inodes"), unit="percentunit", span=8))
    d = d.with_panel(ts("NVMe wear (percent of rated endurance used)",
                        query("gpufleet_nvme_percent_used{%s}" % NODE, "{{instance}} {{device}}"), unit="percent",
                        span=8))
    d = d.with_panel(ts("Read-only checkpoint mounts and NVMe critical warnings",
                        query("gpufleet_checkpoint_read_only{%s} == 1" % NODE, "{{instance}} {{path}} read-only"),
                        query("gpufleet_nvme_critical_warning{%s} == 1" % NODE, "{{instance}} {{device}} {{flag}}"),
                        span=8))
    return d.build()


def render():
    model = build()
    for number, panel in enumerate(model.panels or [], 1):  # stable ids: links like ?viewPanel=N keep working
        panel.id_val = number
    return json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the shipped file is out of date")
    parser.add_argument("--output", type=Path, default=OUT_PATH)
    args = parser.parse_args(argv)
    return write_or_check(args.output, render(), args.check, "gen_grafana_dashboard.py")


if __name__ == "__main__":
    sys.exit(main())
