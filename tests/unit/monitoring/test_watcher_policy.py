"""One XID policy for the watcher and the report: the gpu_monitoring role gives the watcher the inventory's
gpufleet_xid_severity_overrides (the fleet report's variable), and the severity label of every event is the one the
report's XID judge fails (critical) or warns (warning, unknown) about. On main the role read another variable
(gpu_monitoring_severity_overrides), so a site's override changed the report but never the watcher or the alerts."""

import json
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_xid
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import XidScanner
from watchlib import WatcherProc, syslog_line, total

ROLE = Path(__file__).resolve().parents[3] / "roles" / "gpu_monitoring"
BODY = "(0x004f8000 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
LINES = [
    "NVRM: Xid (PCI:0000:18:00): 145, RLW_REMAP  Nonfatal   XC0 i0 Link 05 " + BODY,
    "NVRM: Xid (PCI:0000:2a:00): 145, RLW_REMAP  Fatal   XC0 i0 Link 07 " + BODY,
    "NVRM: Xid (PCI:0000:3a:00): 13, pid=42, name=python3, Graphics SM Warp Exception",
    "NVRM: Xid (PCI:0000:5d:00): 92, pid='<unknown>', name=<unknown>, High single-bit ECC error rate",
    "NVRM: Xid (PCI:0000:9a:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked for remapping",
]
SITE = {"13": "critical", "63": "warning"}


def _trusted(value):
    """A role file's strings are templates to Ansible (ansible-core >= 2.19 marks them so when it loads a role)."""
    try:
        from ansible.template import trust_as_template
    except ImportError:  # ansible-core < 2.19 templates every string
        return value
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return trust_as_template(value) if isinstance(value, str) else value


def role_config(inventory):
    """The watcher's configuration as the role writes it (vars/main.yml over defaults/main.yml and the inventory)."""
    loader = DataLoader()
    variables = _trusted(dict(loader.load_from_file(str(ROLE / "defaults" / "main.yml"))))
    variables.update(_trusted(loader.load_from_file(str(ROLE / "vars" / "main.yml"))))
    variables.update(inventory)
    return Templar(loader=loader, variables=variables).template(variables["_gpu_monitoring_config"])


@pytest.mark.parametrize("inventory", [{}, {"gpufleet_xid_severity_overrides": SITE}], ids=["catalog", "site"])
def test_the_watcher_labels_each_xid_with_the_report_s_severity(tmp_path, inventory):
    cfg = role_config(inventory)
    assert cfg["severity_overrides"] == inventory.get("gpufleet_xid_severity_overrides", {})
    log = tmp_path / "kern.log"
    log.write_text("")
    watcher = WatcherProc(tmp_path / "w", source="file", log_file=str(log),
                          severity_overrides=cfg["severity_overrides"]).start()
    try:
        with open(log, "a") as fh:
            fh.write("".join(syslog_line(line) + "\n" for line in LINES))
        metrics = watcher.wait_for(lambda m: total(m, "gpufleet_xid_events_total") == len(LINES), what="5 events")
    finally:
        watcher.stop()
    labels = {(dict(ls)["pci"], dict(ls)["xid"]): dict(ls)["severity"] for (name, ls), v in metrics.items()
              if name == "gpufleet_xid_last_event_timestamp_seconds"}
    # the report's judge on the same lines, with the same inventory
    scanner = XidScanner(severity_overrides=inventory.get("gpufleet_xid_severity_overrides"))
    for line in LINES:
        scanner.feed_line(line)
    events = scanner.result()["events"]
    t = dict(judge_xid.complete({}), **inventory)
    findings, _ = judge_xid.judge(events, [], t, "node01", {})
    report = {(f["pci"], int(e["xid"])): f["severity"] for f in findings for e in events if e["pci"] == f["pci"]}
    page = {key: severity for key, severity in labels.items() if severity == "critical"}
    assert {(pci, int(x)) for pci, x in page} == {k for k, v in report.items() if v == "fail"}, (labels, report)
    assert {(pci, int(x)) for (pci, x), s in labels.items() if s in ("warning", "unknown")} == \
        {k for k, v in report.items() if v == "warn"}, (labels, report)
    assert labels[("0000:18:00", "145")] == "warning" and labels[("0000:2a:00", "145")] == "critical"
    assert labels[("0000:3a:00", "13")] == ("critical" if inventory else "warning")


@pytest.mark.parametrize("rate", [None, 400], ids=["unset", "ndr"])
def test_the_role_s_expected_infiniband_rate_reaches_the_health_collector(tmp_path, rate):
    from ansible_collections.kentino.gpufleet.plugins.module_utils.xid_watcher import load_config

    cfg = role_config({} if rate is None else {"gpu_monitoring_ib_expected_rate_gbps": rate})
    path = tmp_path / "monitoring.json"
    path.write_text(json.dumps(cfg))
    assert load_config(str(path))["ib_expected_rate_gbps"] == rate
