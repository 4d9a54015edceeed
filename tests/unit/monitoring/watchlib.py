"""Run the XID watcher as the service runs it (its entry script, a real process, SIGTERM/SIGKILL) and read its
textfile with prometheus_client's parser (imported by name: conftest puts this directory on sys.path)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[3]
FILES = REPO / "roles" / "gpu_monitoring" / "files"
WATCHER = FILES / "gpufleet-xid-watcher"
HEALTH = FILES / "gpufleet-node-health"
SIM_BIN = REPO / "sim" / "bin"
LIB = REPO / "collections"

XID79 = "NVRM: Xid (PCI:0000:{bus}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def install_tree(dest):
    """The node layout the gpu_monitoring role installs: only the listed module_utils files, the package __init__.py
    files, the entry scripts in bin/. Returns the library root (what GPUFLEET_LIB would be, here unneeded)."""
    role_vars = yaml.safe_load((REPO / "roles" / "gpu_monitoring" / "vars" / "main.yml").read_text())
    dest = Path(dest)
    for pkg in role_vars["_gpu_monitoring_package_dirs"]:
        (dest / pkg).mkdir(parents=True, exist_ok=True)
        (dest / pkg / "__init__.py").write_text("")
    mu = dest / role_vars["_gpu_monitoring_module_utils_dir"]
    mu.mkdir(parents=True, exist_ok=True)
    for name in role_vars["_gpu_monitoring_module_utils"]:
        shutil.copy(REPO / "plugins" / "module_utils" / name, mu / name)
    (dest / "bin").mkdir(exist_ok=True)
    for script in (WATCHER, HEALTH):
        shutil.copy(script, dest / "bin" / script.name)
    for path in [dest] + [p for p in dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or path.parent.name == "bin" else 0o644)
    return dest


def syslog_line(message, uptime=1234.5):
    """A kern.log line of now (syslog prefix without a year, as rsyslog writes it)."""
    return "%s host kernel: [%12.6f] %s" % (time.strftime("%b %e %H:%M:%S"), uptime, message)


def read_metrics(path):
    """{(name, frozenset(labels.items())): value} of a textfile; {} when absent."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(metrics, name, **labels):
    """The value of the one sample of name whose labels include these; None when there is none."""
    hits = [v for (n, ls), v in metrics.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(hits) <= 1, "several samples of %s %s: %s" % (name, labels, hits)
    return hits[0] if hits else None


def total(metrics, name, **labels):
    return sum(v for (n, ls), v in metrics.items() if n == name and set(labels.items()) <= set(ls))


class WatcherProc:
    """One watcher process with a config in `root`; the metrics and state directories live there too."""

    def __init__(self, root, user=None, env=None, python=sys.executable, tree=None, **cfg):
        self.root = Path(root)
        self.metrics_dir = self.root / "metrics"
        self.state_dir = self.root / "state"
        for d in (self.metrics_dir, self.state_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.config = {"metrics_directory": str(self.metrics_dir), "state_directory": str(self.state_dir),
                       "nvidia_smi": "", "heartbeat_seconds": 1, "poll_seconds": 0.1}
        self.config.update(cfg)
        self.config_path = self.root / "monitoring.json"
        self.config_path.write_text(json.dumps(self.config))
        self.prom = self.metrics_dir / "gpufleet_xid.prom"
        self.log_path = self.root / "watcher.log"
        self.user = user
        self.python = python
        self.script = Path(tree) / "bin" / WATCHER.name if tree else WATCHER
        self.env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        if not tree:
            self.env["GPUFLEET_LIB"] = str(LIB)
        self.env.update(env or {})
        self.proc = None

    def start(self):
        self._log = open(self.log_path, "ab")
        kwargs = {"user": self.user} if self.user is not None else {}
        self.proc = subprocess.Popen([self.python, str(self.script), "--config", str(self.config_path)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=self.env, **kwargs)
        self.wait_for(lambda m: value(m, "gpufleet_watcher_up") == 1, what="the first textfile")
        return self

    def stop(self, sig=signal.SIGTERM):
        if self.proc is None:
            return None
        self.proc.send_signal(sig)
        rc = self.proc.wait(30)
        self.proc = None
        self._log.close()
        return rc

    def metrics(self):
        return read_metrics(self.prom)

    def wait_for(self, predicate, timeout=15.0, what="the condition"):
        deadline = time.monotonic() + timeout
        last = {}
        while time.monotonic() < deadline:
            last = self.metrics()
            if last and predicate(last):
                return last
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError("watcher: %s not reached in %ss; rc=%s; log:\n%s\nmetrics:\n%s" % (
            what, timeout, self.proc.poll() if self.proc else None, self.log()[-3000:],
            self.prom.read_text() if self.prom.exists() else "(no file)"))

    def log(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for_log(self, text, timeout=15.0):
        """The watcher's log once it holds `text` (it writes its log lines after the files they are about)."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline or (self.proc is not None and self.proc.poll() is not None):
                raise AssertionError("watcher: %r not in its log within %ss:\n%s" % (text, timeout, self.log()[-3000:]))
            time.sleep(0.05)
        return self.log()

    def state(self):
        return json.loads((self.state_dir / "xid-watcher.state.json").read_text())
