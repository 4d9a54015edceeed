#!/usr/bin/env python3
"""Take docs/img/monitoring.png: Prometheus's /alerts page with GpuLost and GpuXidCritical firing, for real.

Everything runs on this machine: the XID watcher (file source) follows a scratch kern.log, Debian's
prometheus-node-exporter serves its textfile, Debian's prometheus evaluates the shipped rules (regenerated for a 2 s
scrape), an XID 79 line is appended, and headless chromium photographs the alerts page once the alerts fire.
Needs: apt-get install prometheus prometheus-node-exporter chromium.   Usage: hack/screenshot_monitoring.py [out.png]
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "img" / "monitoring.png"
NE_PORT, PROM_PORT = 19101, 19091


def main():
    root = Path(tempfile.mkdtemp(prefix="gpufleet-shot-"))
    metrics = root / "metrics"
    textfile = root / "textfile"
    metrics.mkdir()
    textfile.mkdir()
    kern = root / "kern.log"
    kern.write_text("")
    (root / "monitoring.json").write_text(json.dumps({
        "source": "file", "log_file": str(kern), "metrics_directory": str(metrics),
        "state_directory": str(root / "state"), "nvidia_smi": "", "heartbeat_seconds": 1}))
    (textfile / "gpufleet_xid.prom").symlink_to(metrics / "gpufleet_xid.prom")  # what the role links
    rules = root / "rules.yml"
    subprocess.run([sys.executable, str(REPO / "hack" / "gen_alert_rules.py"), "--scrape-interval", "2s",
                    "--output", str(rules)], check=True)
    (root / "prometheus.yml").write_text(
        "global: {scrape_interval: 2s, evaluation_interval: 1s}\nrule_files: [%s]\nscrape_configs:\n"
        "  - job_name: gpufleet-node\n    static_configs: [{targets: ['gpu-node-01:%d']}]\n"
        "    relabel_configs: [{target_label: __address__, replacement: '127.0.0.1:%d'}]\n" % (rules, NE_PORT, NE_PORT))
    env = dict(os.environ, GPUFLEET_LIB=str(REPO / "collections"))
    procs = [
        subprocess.Popen([sys.executable, str(REPO / "roles/gpu_monitoring/files/gpufleet-xid-watcher"), "--config",
                          str(root / "monitoring.json")], env=env, stderr=subprocess.DEVNULL),
        subprocess.Popen(["prometheus-node-exporter", "--web.listen-address=127.0.0.1:%d" % NE_PORT,
                          "--collector.textfile.directory=%s" % textfile], stderr=subprocess.DEVNULL),
        subprocess.Popen(["prometheus", "--config.file=%s" % (root / "prometheus.yml"),
                          "--storage.tsdb.path=%s" % (root / "tsdb"),
                          "--web.listen-address=127.0.0.1:%d" % PROM_PORT], stderr=subprocess.DEVNULL),
    ]
    try:
        time.sleep(5)
        stamp = time.strftime("%b %e %H:%M:%S")
        with open(kern, "a") as fh:
            fh.write("%s gpu-node-01 kernel: [ 7201.000001] NVRM: GPU at PCI:0000:c1:00: "
                     "GPU-5a1c7e2b-3f4d-4e21-9c0a-6b7d8e9f0a1b\n" % stamp)
            fh.write("%s gpu-node-01 kernel: [ 7201.000002] NVRM: Xid (PCI:0000:c1:00): 79, pid='<unknown>', "
                     "name=<unknown>, GPU has fallen off the bus.\n" % stamp)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/alerts" % PROM_PORT) as resp:
                alerts = json.loads(resp.read())["data"]["alerts"]
            if {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"} >= {"GpuLost", "GpuXidCritical"}:
                break
            time.sleep(0.5)
        else:
            raise SystemExit("the alerts did not fire within 60 s")
        OUT.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--user-data-dir=%s" % (root / "chromium"), "--window-size=1400,1000",
                        "--virtual-time-budget=8000", "--screenshot=%s" % OUT,
                        "http://127.0.0.1:%d/classic/alerts" % PROM_PORT],  # Debian ships the classic UI
                       check=True, capture_output=True, timeout=120)
        print("wrote %s" % OUT)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
