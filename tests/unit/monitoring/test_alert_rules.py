"""The shipped alert rules: generated from the catalog (--check), valid for promtool, and each alert fires on its
condition and stays silent just below it (promtool test rules, Debian's prometheus package: /usr/bin/promtool)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "monitoring" / "prometheus" / "gpufleet-alerts.yml"
SCRAPE = REPO / "monitoring" / "prometheus" / "scrape-gpufleet.yml"
GEN = REPO / "hack" / "gen_alert_rules.py"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: apt-get install prometheus")

NODE = {"instance": "n1:9100", "job": "gpufleet-node"}
PCI = "0000:c1:00"
INFO = 'gpufleet_gpu_info{instance="n1:9100",job="gpufleet-node",pci="0000:c1:00",gpu="3",uuid="GPU-abc",name="RTX 5090"}'


def series(name, labels=None, values=""):
    labels = dict(NODE, **(labels or {}))
    return {"series": "%s{%s}" % (name, ",".join('%s="%s"' % kv for kv in sorted(labels.items()))), "values": values}


def alert(name, at, *labelsets):
    return {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": dict(ls)} for ls in labelsets]}


def silent(name, at):
    return {"eval_time": at, "alertname": name, "exp_alerts": []}


def run_promtool(tmp_path, rules_text, tests, interval="1m"):
    rules = tmp_path / "rules.yml"
    rules.write_text(rules_text)
    spec = {"rule_files": [str(rules)], "evaluation_interval": interval, "tests": tests}
    path = tmp_path / "tests.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    res = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]


def without_annotations():
    """The rules with their annotations removed: the firing tests compare labels; the annotation templates are
    checked by promtool check rules and by test_summaries_name_host_and_gpu."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return yaml.safe_dump(doc, sort_keys=False)


def test_the_shipped_rules_are_generated_from_the_catalog():
    res = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_the_xid_alerts_select_on_the_watcher_s_severity_never_on_codes(tmp_path):
    """The watcher writes the XID policy's severity; the alerts read it (on main they matched a regex of the catalog's
    critical codes, so a Nonfatal XID 145 paged while the report warned, and a site's override changed the report
    only)."""
    doc = yaml.safe_load(RULES.read_text())
    xid_rules = [r for r in doc["groups"][0]["rules"] if r["alert"] in ("GpuXidCritical", "GpuXidWarning")
                 and r["labels"].get("cause") in ("critical_code", "warning_code")]
    assert {r["alert"]: r["labels"]["severity"] for r in xid_rules} == {"GpuXidCritical": "critical",
                                                                      "GpuXidWarning": "warning"}
    for rule in xid_rules:
        assert 'severity=~"' in rule["expr"] and "xid=~" not in rule["expr"], rule["expr"]
    # a drift is caught: an edited rules file differs from the generated one
    out = tmp_path / "rules.yml"
    assert subprocess.run([sys.executable, str(GEN), "--output", str(out)]).returncode == 0
    out.write_text(out.read_text().replace('severity=~"critical"', 'severity=~"critical|warning"'))
    assert subprocess.run([sys.executable, str(GEN), "--check", "--output", str(out)]).returncode == 1


@needs_promtool
def test_promtool_check_rules_is_clean():
    res = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert res.returncode == 0 and "SUCCESS: 25 rules found" in res.stdout, res.stdout + res.stderr


@needs_promtool
def test_every_alert_has_severity_summary_and_runbook_section():
    doc = yaml.safe_load(RULES.read_text())
    monitoring_md = (REPO / "docs" / "monitoring.md").read_text()
    names = set()
    for rule in doc["groups"][0]["rules"]:
        names.add(rule["alert"])
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert "{{ $labels.instance }}" in rule["annotations"]["summary"] or "Hostname" in rule["annotations"]["summary"]
        anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor == rule["alert"].lower()
        assert "\n### %s\n" % rule["alert"] in monitoring_md, "docs/monitoring.md has no section for %s" % rule["alert"]
    assert names == {"GpuXidCritical", "GpuXidWarning", "GpuLost", "GpuTemperatureHigh", "GpuEccVolatileIncreasing",
                     "GpuEccRateAccelerating", "GpuThermalViolation", "GpuRowRemapFailure", "GpuRemapBanksExhausting",
                     "NvmeWearHigh", "CheckpointStorageReadOnly", "CheckpointStorageFull", "GpufleetWatcherStale",
                     "NodeExporterTextfileError", "FabricManagerDown", "GpuFabricIncomplete", "GpuNvlinkDown",
                     "GpuNvlinkErrorsRising", "InfinibandPortDown", "InfinibandPortRateLow", "InfinibandPortFlapping",
                     "InfinibandErrorsRising"}


@needs_promtool
def test_the_scrape_config_is_valid_and_matches_the_rules(tmp_path):
    scrape = yaml.safe_load(SCRAPE.read_text())
    jobs = {j["job_name"]: j for j in scrape["scrape_configs"]}
    assert jobs["gpufleet-node"]["scrape_interval"] == "30s"  # GpufleetWatcherStale: 3 x 30 s
    assert 'up{job="gpufleet-node"}' in RULES.read_text() and "> 90\n" in RULES.read_text()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "30s"}, "rule_files": [str(RULES)],
                                      "scrape_configs": scrape["scrape_configs"]}))
    res = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def xid_ts(xid, at_s, n=80, severity="critical"):
    return series("gpufleet_xid_last_event_timestamp_seconds", {"pci": PCI, "xid": str(xid), "severity": severity},
                  "%dx%d" % (at_s, n))


@needs_promtool
def test_the_xid_page_carries_its_newest_event_time_while_it_fires(tmp_path):
    """A second XID 79 on the same GPU 20 minutes in keeps the alert (and Alertmanager's startsAt) as it was: only
    last_event_epoch moves, and the lifecycle reads it to tell a new fault from a repeat of the handled one."""
    doc = yaml.safe_load(RULES.read_text())
    ann = next(r["annotations"] for r in doc["groups"][0]["rules"] if r["labels"].get("cause") == "critical_code")
    labels = dict(NODE, severity="critical", cause="critical_code", pci=PCI, xid="79", gpu="3", uuid="GPU-abc")

    def page(at, last_event):
        annotations = {"summary": "n1:9100: XID 79 on GPU 3 (0000:c1:00) 5m 0s ago", "description": ann["description"],
                       "runbook_url": ann["runbook_url"], "last_event_epoch": last_event}
        return {"eval_time": at, "alertname": "GpuXidCritical",
                "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}]}
    run_promtool(tmp_path, RULES.read_text(), [
        {"interval": "1m", "input_series": [series("gpufleet_xid_last_event_timestamp_seconds",
                                                   {"pci": PCI, "xid": "79", "severity": "critical"}, "300x19 1500x40"),
                                            {"series": INFO, "values": "1x60"}],
         "alert_rule_test": [page("10m", "300.000"), page("30m", "1500.000")]}])


@needs_promtool
def test_gpu_xid_critical_and_warning_follow_the_watcher_s_severity(tmp_path):
    labels = dict(NODE, severity="critical", cause="critical_code", pci=PCI, xid="79", gpu="3", uuid="GPU-abc")
    ticket = dict(NODE, severity="warning", cause="warning_code", pci=PCI, gpu="3", uuid="GPU-abc")
    run_promtool(tmp_path, without_annotations(), [
        {"interval": "1m", "input_series": [xid_ts(79, 300), {"series": INFO, "values": "1x80"}],
         "alert_rule_test": [alert("GpuXidCritical", "10m", labels),
                             alert("GpuXidCritical", "64m", labels),  # 3540 s after the event
                             silent("GpuXidCritical", "65m"),       # 3600 s: no longer within the hour
                             silent("GpuXidWarning", "10m")]},
        # what the policy rates warning (an XID 13, XID 92 alone, a Nonfatal XID 145) or unknown: a ticket, no page
        {"interval": "1m", "input_series": [xid_ts(13, 300, severity="warning"), xid_ts(92, 300, severity="warning"),
                                            xid_ts(145, 300, severity="warning"), xid_ts(999, 300, severity="unknown"),
                                            {"series": INFO, "values": "1x80"}],
         "alert_rule_test": [silent("GpuXidCritical", "10m"),
                             alert("GpuXidWarning", "10m", *[dict(ticket, xid=x) for x in ("13", "145", "92", "999")])]},
        # the same code rated critical (a Fatal 145, or a site's override): the page
        {"interval": "1m", "input_series": [xid_ts(145, 300), {"series": INFO, "values": "1x80"}],
         "alert_rule_test": [alert("GpuXidCritical", "10m", dict(labels, xid="145")), silent("GpuXidWarning", "10m")]},
        # info: neither
        {"interval": "1m", "input_series": [xid_ts(45, 300, severity="info"), {"series": INFO, "values": "1x80"}],
         "alert_rule_test": [silent("GpuXidCritical", "10m"), silent("GpuXidWarning", "10m")]},
        # a GPU nvidia-smi never listed: still pages, without the index
        {"interval": "1m", "input_series": [xid_ts(48, 300)],
         "alert_rule_test": [alert("GpuXidCritical", "10m", dict(NODE, severity="critical", cause="critical_code",
                                                                  pci=PCI, xid="48"))]},
    ])


def month_of_xid92(daily_from_day=21, hourly_from_hour=27 * 24):
    """Hourly samples over 30 days of the slow leak: one XID 92 a week, then one a day, then one an hour.
    Returns (counter values, last-event timestamps) as promtool value strings."""
    count, last, counts, lasts = 0, 0, [], []
    for hour in range(30 * 24):
        if hour >= hourly_from_hour:
            event = True
        elif hour >= daily_from_day * 24:
            event = hour % 24 == 3
        else:
            event = hour % (7 * 24) == 3
        if event:
            count += 1
            last = hour * 3600
        counts.append(str(count))
        lasts.append(str(last))
    return " ".join(counts), " ".join(lasts)


@needs_promtool
def test_xid_92_rising_rate_and_ecc_acceleration_over_a_month(tmp_path):
    counts, lasts = month_of_xid92()
    labels92 = {"pci": PCI, "xid": "92"}
    inputs = [series("gpufleet_xid_events_total", dict(labels92, gpu="3", uuid="GPU-abc", severity="warning"), counts),
              series("gpufleet_xid_last_event_timestamp_seconds", dict(labels92, severity="warning"), lasts),
              {"series": INFO, "values": "1x720"}]
    accel = {"instance": "n1:9100", "pci": PCI, "severity": "warning"}
    page = dict(NODE, severity="critical", cause="xid92_rising", pci=PCI, xid="92", gpu="3", uuid="GPU-abc")
    run_promtool(tmp_path, without_annotations(), [{"interval": "1h", "input_series": inputs, "alert_rule_test": [
        # weeks 1-3, one a week: neither
        silent("GpuEccRateAccelerating", "%dh" % (14 * 24 + 10)),
        silent("GpuXidCritical", "%dh" % (14 * 24 + 10)),
        # one a day for two days: too few to tell from the weekly ones
        silent("GpuEccRateAccelerating", "%dh" % (22 * 24 + 10)),
        # one a day for three days, after one a week: the ticket, not yet the page
        alert("GpuEccRateAccelerating", "%dh" % (23 * 24 + 10), accel),
        silent("GpuXidCritical", "%dh" % (23 * 24 + 10)),
        # hourly: the page (two hours in: still below three in 6 h)
        silent("GpuXidCritical", "%dh" % (27 * 24 + 1)),
        alert("GpuXidCritical", "%dh" % (27 * 24 + 8), page),
        alert("GpuEccRateAccelerating", "%dh" % (27 * 24 + 8), accel),
    ]}], interval="1h")


@needs_promtool
def test_ecc_acceleration_stays_silent_when_the_week_before_was_as_busy(tmp_path):
    # 5 corrected errors a day for two weeks: a steady rate, not an acceleration (min 10/day is not reached either)
    steady = " ".join(str((h // 24) * 12) for h in range(14 * 24))
    inputs = [series("gpufleet_gpu_ecc_errors_total", {"pci": PCI, "gpu": "3", "type": "corrected", "scope": "aggregate"},
                     steady)]
    run_promtool(tmp_path, without_annotations(), [{"interval": "1h", "input_series": inputs, "alert_rule_test": [
        silent("GpuEccRateAccelerating", "%dh" % (13 * 24 + 12))]}], interval="1h")
    jump = " ".join(str((h // 24) * 12 if h < 12 * 24 else 12 * 12 + (h - 12 * 24) * 5) for h in range(14 * 24))
    inputs = [series("gpufleet_gpu_ecc_errors_total", {"pci": PCI, "gpu": "3", "type": "corrected", "scope": "aggregate"},
                     jump)]
    run_promtool(tmp_path, without_annotations(), [{"interval": "1h", "input_series": inputs, "alert_rule_test": [
        alert("GpuEccRateAccelerating", "%dh" % (13 * 24 + 12), {"instance": "n1:9100", "pci": PCI,
                                                               "severity": "warning"})]}], interval="1h")


@needs_promtool
def test_gpu_lost(tmp_path):
    lost = dict(NODE, severity="critical", cause="fallen_off_bus", pci=PCI, gpu="3", uuid="GPU-abc")
    count = dict(NODE, severity="critical", cause="gpu_count")
    run_promtool(tmp_path, without_annotations(), [
        {"interval": "1m", "input_series": [series("gpufleet_gpu_lost", {"pci": PCI}, "0x3 1x5"),
                                            {"series": INFO, "values": "1x10"}],
         "alert_rule_test": [silent("GpuLost", "2m"), alert("GpuLost", "4m", lost)]},
        {"interval": "1m", "input_series": [series("gpufleet_gpus_visible", values="8x3 7x10"),
                                            series("gpufleet_gpus_expected", values="8x14")],
         "alert_rule_test": [silent("GpuLost", "3m"), silent("GpuLost", "4m"), alert("GpuLost", "6m", count)]},
    ])


@needs_promtool
def test_fabric_manager_fabric_and_nvlink_alerts(tmp_path):
    g = {"pci": PCI, "gpu": "3"}
    per_gpu = dict(NODE, severity="warning", pci=PCI, gpu="3", uuid="GPU-abc")
    fm = dict(NODE, severity="critical", service="nvidia-fabricmanager")
    run_promtool(tmp_path, without_annotations(), [
        # The fabric manager stops: one critical alert; the links it takes down do not page separately.
        {"interval": "1m", "input_series": [
            series("gpufleet_fabric_manager_active", {"service": "nvidia-fabricmanager"}, "1x3 0x10"),
            series("gpufleet_gpu_fabric_complete", dict(g, state="completed"), "1x3 _x10"),
            series("gpufleet_gpu_fabric_complete", dict(g, state="in_progress"), "_x3 0x10"),
            series("gpufleet_nvlink_link_up", dict(g, link="0"), "1x3 0x10"),
            {"series": INFO, "values": "1x14"}],
         "alert_rule_test": [silent("FabricManagerDown", "4m"), alert("FabricManagerDown", "6m", fm),
                             silent("GpuNvlinkDown", "12m"), silent("GpuFabricIncomplete", "12m")]},
        # A GPU without a fabric manager unit at all, but with a fabric state: the fabric manager is missing.
        {"interval": "1m", "input_series": [series("gpufleet_gpu_fabric_complete", dict(g, state="in_progress"),
                                                   "0x10")],
         "alert_rule_test": [alert("FabricManagerDown", "3m", {"instance": "n1:9100", "severity": "critical"})]},
        # The fabric manager runs, one GPU does not register.
        {"interval": "1m", "input_series": [
            series("gpufleet_fabric_manager_active", {"service": "nvidia-fabricmanager"}, "1x12"),
            series("gpufleet_gpu_fabric_complete", dict(g, state="in_progress"), "0x12"),
            {"series": INFO, "values": "1x12"}],
         "alert_rule_test": [silent("GpuFabricIncomplete", "3m"),
                             alert("GpuFabricIncomplete", "6m", dict(per_gpu, severity="critical",
                                                                     state="in_progress"))]},
        # Two links of GPU 3 go down with the fabric manager running: one alert for the GPU, value 2.
        {"interval": "1m", "input_series": [
            series("gpufleet_fabric_manager_active", {"service": "nvidia-fabricmanager"}, "1x12"),
            series("gpufleet_nvlink_link_up", dict(g, link="0"), "1x12"),
            series("gpufleet_nvlink_link_up", dict(g, link="5"), "1x2 0x10"),
            series("gpufleet_nvlink_link_up", dict(g, link="11"), "1x2 0x10"),
            {"series": INFO, "values": "1x12"}],
         "alert_rule_test": [silent("GpuNvlinkDown", "5m"),
                             {"eval_time": "8m", "alertname": "GpuNvlinkDown", "exp_alerts": [
                                 {"exp_labels": {"instance": "n1:9100", "severity": "warning", "pci": PCI, "gpu": "3",
                                                 "uuid": "GPU-abc"}}]}]},
        # Replays: any; CRC: from 100 per second; 50 per second stays silent.
        {"interval": "1m", "input_series": [
            series("gpufleet_nvlink_errors_total", dict(g, link="3", type="replay"), "0x5 4x10"),
            series("gpufleet_nvlink_errors_total", dict(g, link="4", type="crc"), "0+3000x15"),
            series("gpufleet_nvlink_errors_total", dict(g, link="5", type="crc"), "0+9000x15"),
            {"series": INFO, "values": "1x15"}],
         "alert_rule_test": [{"eval_time": "10m", "alertname": "GpuNvlinkErrorsRising", "exp_alerts": [
             {"exp_labels": dict(per_gpu, link="3", type="replay")},
             {"exp_labels": dict(per_gpu, link="5", type="crc")}]}]},
    ])


DCGM = {"gpu": "0", "UUID": "GPU-h100", "pci_bus_id": "00000000:3B:00.0", "device": "nvidia0", "modelName": "NVIDIA H100"}


def dcgm(name, values, host_label="Hostname"):
    labels = dict(DCGM, **{host_label: "gpu-node-01"})
    return series(name, dict(labels, instance="n1:9400", job="gpufleet-dcgm"), values)


def dcgm_labels(host_label="Hostname", **extra):
    return dict(DCGM, instance="n1:9400", job="gpufleet-dcgm", **{host_label: "gpu-node-01"}, **extra)


@needs_promtool
def test_gpu_temperature_high(tmp_path):
    run_promtool(tmp_path, without_annotations(), [
        {"interval": "1m", "input_series": [dcgm("DCGM_FI_DEV_GPU_TEMP", "86x10")],
         "alert_rule_test": [silent("GpuTemperatureHigh", "4m"),
                             alert("GpuTemperatureHigh", "5m", dcgm_labels(severity="critical"))]},
        {"interval": "1m", "input_series": [dcgm("DCGM_FI_DEV_GPU_TEMP", "85x10", host_label="hostname")],
         "alert_rule_test": [silent("GpuTemperatureHigh", "10m")]},
    ])


@needs_promtool
def test_summaries_name_host_and_gpu(tmp_path):
    """Full annotations for GpuLost and GpuTemperatureHigh with both dcgm-exporter host label spellings."""
    doc = yaml.safe_load(RULES.read_text())
    ann = {}
    for rule in doc["groups"][0]["rules"]:
        ann.setdefault(rule["alert"], rule["annotations"])
    runbook = ann["GpuLost"]["runbook_url"].split("#")[0]

    def expect(name, summary):
        return {"summary": summary, "description": ann[name]["description"], "runbook_url": runbook + "#" + name.lower()}

    lost = dict(NODE, severity="critical", cause="fallen_off_bus", pci=PCI, gpu="3", uuid="GPU-abc")
    tests = [
        {"interval": "1m", "input_series": [series("gpufleet_gpu_lost", {"pci": PCI}, "1x5"),
                                            {"series": INFO, "values": "1x5"}],
         "alert_rule_test": [{"eval_time": "1m", "alertname": "GpuLost", "exp_alerts": [
             {"exp_labels": lost, "exp_annotations": expect("GpuLost", "n1:9100: GPU 3 (0000:c1:00) fell off the bus")}]}]},
    ]
    for host_label in ("Hostname", "hostname"):
        tests.append({"interval": "1m", "input_series": [dcgm("DCGM_FI_DEV_GPU_TEMP", "91x10", host_label)],
                      "alert_rule_test": [{"eval_time": "6m", "alertname": "GpuTemperatureHigh", "exp_alerts": [
                          {"exp_labels": dcgm_labels(host_label, severity="critical"),
                           "exp_annotations": expect("GpuTemperatureHigh", "gpu-node-01: GPU 0 (00000000:3B:00.0, "
                                                     "NVIDIA H100) at 91 C for 5 minutes")}]}]})
    run_promtool(tmp_path, RULES.read_text(), tests)


@needs_promtool
def test_ecc_volatile_thermal_and_remap_alerts(tmp_path):
    g = {"pci": PCI, "gpu": "3"}
    run_promtool(tmp_path, without_annotations(), [
        {"interval": "1m", "input_series": [dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0x10 1x30"),
                                            series("gpufleet_gpu_ecc_errors_total", dict(g, type="corrected",
                                                                                         scope="volatile"), "7x40")],
         "alert_rule_test": [silent("GpuEccVolatileIncreasing", "9m"),
                             alert("GpuEccVolatileIncreasing", "20m", dcgm_labels(severity="warning"))]},
        {"interval": "1m", "input_series": [dcgm("DCGM_FI_DEV_THERMAL_VIOLATION", "5000x5 5000+1000x10"),
                                            series("gpufleet_gpu_throttle_reason_active",
                                                   dict(g, reason="hw_thermal_slowdown"), "0x20"),
                                            series("gpufleet_gpu_throttle_reason_active",
                                                   dict(g, reason="sw_power_cap"), "1x20")],
         "alert_rule_test": [silent("GpuThermalViolation", "5m"),
                             alert("GpuThermalViolation", "10m", dcgm_labels(severity="warning"))]},
        {"interval": "1m", "input_series": [series("gpufleet_gpu_throttle_reason_active",
                                                   dict(g, reason="sw_thermal_slowdown"), "1x10")],
         "alert_rule_test": [silent("GpuThermalViolation", "1m"),
                             alert("GpuThermalViolation", "3m", dict(NODE, **g, reason="sw_thermal_slowdown",
                                                                      severity="warning"))]},
        {"interval": "1m", "input_series": [series("gpufleet_gpu_remapped_rows_failure", g, "0x2 1x3"),
                                            series("gpufleet_gpu_remap_banks", dict(g, availability="none"), "0x2 1x3"),
                                            series("gpufleet_gpu_remap_banks", dict(g, availability="low"), "412x5")],
         "alert_rule_test": [silent("GpuRowRemapFailure", "2m"), silent("GpuRemapBanksExhausting", "2m"),
                             alert("GpuRowRemapFailure", "3m", dict(NODE, **g, severity="critical")),
                             alert("GpuRemapBanksExhausting", "3m", dict(NODE, **g, availability="none",
                                                                          severity="warning"))]},
        {"interval": "1m", "input_series": [dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1x3")],
         "alert_rule_test": [alert("GpuRowRemapFailure", "1m", dcgm_labels(severity="critical"))]},
    ])


@needs_promtool
def test_storage_alerts(tmp_path):
    p = {"path": "/mnt/nvme/ckpt"}
    ro = dict(p, device="/dev/nvme1n1p1", mountpoint="/mnt/nvme")
    run_promtool(tmp_path, without_annotations(), [
        {"interval": "1m", "input_series": [series("gpufleet_nvme_percent_used", {"device": "/dev/nvme0"}, "79x2 80x3"),
                                            series("gpufleet_nvme_critical_warning",
                                                   {"device": "/dev/nvme1", "flag": "spare_below_threshold"}, "0x2 1x3"),
                                            series("gpufleet_nvme_critical_warning",
                                                   {"device": "/dev/nvme1", "flag": "read_only"}, "0x2 1x3"),
                                            series("gpufleet_checkpoint_read_only", ro, "0x2 1x3")],
         "alert_rule_test": [
             silent("NvmeWearHigh", "2m"), silent("CheckpointStorageReadOnly", "2m"),
             alert("NvmeWearHigh", "3m", dict(NODE, device="/dev/nvme0", severity="warning"),
                   dict(NODE, device="/dev/nvme1", flag="spare_below_threshold", severity="warning")),
             alert("CheckpointStorageReadOnly", "3m", dict(NODE, **ro, severity="critical"),
                   dict(NODE, device="/dev/nvme1", flag="read_only", severity="critical"))]},
        {"interval": "1m", "input_series": [
            series("gpufleet_checkpoint_free_bytes", p, "5000x3 4000x10"),
            series("gpufleet_checkpoint_size_bytes", p, "100000x13"),
            series("gpufleet_checkpoint_free_inodes", p, "50x13"),
            series("gpufleet_checkpoint_inodes", p, "1000x13")],
         "alert_rule_test": [silent("CheckpointStorageFull", "3m"), silent("CheckpointStorageFull", "7m"),
                             alert("CheckpointStorageFull", "9m", dict(NODE, **p, severity="critical"))]},
        {"interval": "1m", "input_series": [
            series("gpufleet_checkpoint_free_bytes", p, "50000x13"), series("gpufleet_checkpoint_size_bytes", p, "100000x13"),
            series("gpufleet_checkpoint_free_inodes", p, "49x13"), series("gpufleet_checkpoint_inodes", p, "1000x13")],
         "alert_rule_test": [alert("CheckpointStorageFull", "6m", dict(NODE, **p, severity="critical"))]},
    ])


@needs_promtool
def test_watcher_stale_and_textfile_error(tmp_path):
    run_promtool(tmp_path, without_annotations(), [
        # the watcher updates every minute until 10m, then stops (value = its last write time)
        {"interval": "1m", "input_series": [series("gpufleet_watcher_last_update_timestamp_seconds",
                                                   values="0+60x10 600x10"),
                                            series("up", values="1x20")],
         "alert_rule_test": [silent("GpufleetWatcherStale", "11m"),   # 60 s without an update: < 3 x 30 s
                             alert("GpufleetWatcherStale", "12m", dict(NODE, severity="warning", cause="no_update"))]},
        # node_exporter answers but serves no watcher metrics
        {"interval": "1m", "input_series": [series("up", {"instance": "n2:9100"}, "1x10")],
         "alert_rule_test": [silent("GpufleetWatcherStale", "4m"),
                             alert("GpufleetWatcherStale", "6m", dict(NODE, instance="n2:9100", severity="warning",
                                                                      cause="no_metrics"))]},
        {"interval": "1m", "input_series": [series("node_textfile_scrape_error", values="0x3 1x5"),
                                            series("node_textfile_scrape_error", {"instance": "n3:9100"}, "0x8")],
         "alert_rule_test": [silent("NodeExporterTextfileError", "4m"),
                             alert("NodeExporterTextfileError", "6m", dict(NODE, severity="warning"))]},
    ])


@needs_promtool
def test_infiniband_port_down_rate_low_flapping_and_errors(tmp_path):
    port = {"hca": "mlx5_0", "port": "1"}
    labels = dict(NODE, **port)
    run_promtool(tmp_path, without_annotations(), [
        # Down for 2 minutes pages; up again is silent.
        {"interval": "1m", "input_series": [
            series("gpufleet_ib_port_up", dict(port, state="ACTIVE", phys_state="LinkUp"), "1x3 _x10"),
            series("gpufleet_ib_port_up", dict(port, state="DOWN", phys_state="Polling"), "_x3 0x10")],
         "alert_rule_test": [silent("InfinibandPortDown", "3m"), silent("InfinibandPortDown", "4m"),
                             alert("InfinibandPortDown", "7m", dict(labels, severity="critical", state="DOWN",
                                                                      phys_state="Polling"))]},
        # Trained at 200 of 400 Gb/s; a port at its rate is silent.
        {"interval": "1m", "input_series": [
            series("gpufleet_ib_port_rate_gbps", port, "200x10"),
            series("gpufleet_ib_port_expected_rate_gbps", port, "400x10"),
            series("gpufleet_ib_port_rate_gbps", {"hca": "mlx5_1", "port": "1"}, "400x10"),
            series("gpufleet_ib_port_expected_rate_gbps", {"hca": "mlx5_1", "port": "1"}, "400x10")],
         # on(): the alert keeps the port's identity, not the scrape job.
         "alert_rule_test": [silent("InfinibandPortRateLow", "3m"),
                             alert("InfinibandPortRateLow", "8m", {"instance": "n1:9100", "severity": "warning",
                                                                   **port})]},
        # The health timer reads every 5 minutes (the shipped rules' default). mlx5_0 goes down twice between two
        # reads: it pages. mlx5_2 goes down once in each of two intervals, and mlx5_1's counter is reset by a reboot:
        # neither pages.
        {"interval": "5m", "input_series": [
            series("gpufleet_ib_port_link_downed_total", port, "0 0 2 2 2 2"),
            series("gpufleet_ib_port_link_downed_total", {"hca": "mlx5_2", "port": "1"}, "0 1 2 2 2 2"),
            series("gpufleet_ib_port_link_downed_total", {"hca": "mlx5_1", "port": "1"}, "7 0 0 0 0 0")],
         "alert_rule_test": [silent("InfinibandPortFlapping", "5m"),
                             alert("InfinibandPortFlapping", "10m", dict(labels, severity="critical")),
                             silent("InfinibandPortFlapping", "20m")]},
        # Symbol errors rising warn; a counter that stands still is silent.
        {"interval": "1m", "input_series": [
            series("gpufleet_ib_port_errors_total", dict(port, counter="symbol_error"), "3x5 3+2x10"),
            series("gpufleet_ib_port_errors_total", dict(port, counter="port_rcv_errors"), "5x15")],
         "alert_rule_test": [silent("InfinibandErrorsRising", "4m"),
                             alert("InfinibandErrorsRising", "10m", dict(labels, severity="warning",
                                                                         counter="symbol_error"))]},
    ])
