"""The alert path with its real parts, for the integration test, a fleet test and bench/quarantine.py: per simulated
node the XID watcher (the role's entry script, following the node's kernel log through the simulator's journalctl)
and Debian's prometheus-node-exporter serving its textfile directory, or test-fleet nodes whose own systemd runs both
(FleetNode); one Prometheus scraping them every second and evaluating the shipped alert rules; Debian's
prometheus-alertmanager routing GpuXidCritical as docs/lifecycle.md says (its route and receiver are read from that
page); ansible-rulebook (PyPI, Java 17 from Debian) running the shipped rulebook, whose playbook quarantines the node
in the simulated fleet's Slurm. Everything here runs as this user on 127.0.0.1 (Prometheus scrapes a fleet node at its
address) and is stopped by close()."""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SIM = REPO / "sim"
WATCHER = REPO / "roles" / "gpu_monitoring" / "files" / "gpufleet-xid-watcher"
RULES = REPO / "monitoring" / "prometheus" / "gpufleet-alerts.yml"
RULEBOOK = "kentino.gpufleet.gpufleet_quarantine"
JDK_PACKAGE = "openjdk-17-jre-headless"
DAEMONS = {"prometheus": "prometheus", "prometheus-node-exporter": "prometheus-node-exporter",
           "prometheus-alertmanager": "prometheus-alertmanager"}

if str(SIM) not in sys.path:
    sys.path.insert(0, str(SIM))
from gpufleet_sim.state import Node  # noqa: E402


class Missing(RuntimeError):
    """A part of the path is not installed: the message says what to install."""


def java_home():
    """JAVA_HOME of Debian's Java 17, from the package's own file list (ansible-rulebook's drools needs it)."""
    proc = subprocess.run(["dpkg-query", "-L", JDK_PACKAGE], capture_output=True, text=True)
    javas = [line for line in proc.stdout.splitlines() if line.endswith("/bin/java")] if proc.returncode == 0 else []
    if not javas:
        raise Missing("ansible-rulebook needs Java 17: %s is not installed (run hack/system-deps as root)" % JDK_PACKAGE)
    return str(Path(javas[0]).parents[1])


def executables():
    found = {name: shutil.which(name) for name in DAEMONS}
    found["ansible-rulebook"] = str(Path(sys.executable).with_name("ansible-rulebook"))
    missing = [name for name, path in found.items() if not path or not os.access(path, os.X_OK)]
    if missing:
        raise Missing("the alert path needs %s: Debian packages from hack/system-deps (as root), ansible-rulebook from "
                      "the dev extras (make venv)" % ", ".join(missing))
    return found


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alertmanager_config(url, group_wait_s=1):
    """docs/lifecycle.md's route and receiver (the yaml block that names gpufleet-eda), with this test's webhook URL
    and short timers; other alerts go to a receiver that sends nothing, as the page's people receiver would."""
    page = (REPO / "docs" / "lifecycle.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "gpufleet-eda" in b)
    doc = yaml.safe_load(block)
    (receiver,) = [r for r in doc["receivers"] if r["name"] == "gpufleet-eda"]
    receiver["webhook_configs"][0]["url"] = url
    doc["route"].update(receiver="people", group_wait="%ds" % group_wait_s, group_interval="1s", repeat_interval="1h")
    for route in doc["route"]["routes"]:
        route.update(group_wait="%ds" % group_wait_s, group_interval="1s")
    doc["receivers"].append({"name": "people"})
    return doc


class SimNode:
    """One simulated node's kernel log and its XID watcher's files."""

    def __init__(self, root, name, state_root):
        self.name = name
        self.exporter = None  # host:port, once start() spawned its node_exporter
        self.dir = root / name
        self.metrics = self.dir / "metrics"
        self.state = self.dir / "watcher-state"
        for d in (self.metrics, self.state):
            d.mkdir(parents=True, exist_ok=True)
        self.env = {"GPUFLEET_SIM_SCENARIO": str(SIM / "scenarios" / "healthy_h100.json"),
                    "GPUFLEET_SIM_STATE": str(state_root / name), "GPUFLEET_SIM_NODE": name}
        self.node = Node(env=self.env)
        # The watcher reads this boot's entries: the simulated boot, not this machine's.
        (self.dir / "boot_id").write_text(self.node.boot["id"] + "\n")

    def xid(self, gpu, code, body):
        """An XID line in the node's kernel log, as the driver logs it."""
        pci = self.node.gpus[gpu]["pci_xid"]
        self.node.append_kernel(["NVRM: Xid (PCI:%s): %d, pid='<unknown>', name=<unknown>, %s" % (pci, code, body)])

    def watcher_config(self):
        config = {"source": "journal", "journalctl": str(SIM / "bin" / "journalctl"),
                  "nvidia_smi": str(SIM / "bin" / "nvidia-smi"), "boot_id_file": str(self.dir / "boot_id"),
                  "metrics_directory": str(self.metrics), "state_directory": str(self.state)}
        path = self.dir / "monitoring.json"
        path.write_text(json.dumps(config))
        return path


class FleetNode:
    """A test-fleet node whose systemd runs the gpu_monitoring role's XID watcher and node_exporter (port 9100). A
    container's kernel log cannot be written, so its watcher follows journal entries with SYSLOG_IDENTIFIER=IDENT (the
    role's gpu_monitoring_journal_matches): real journald, real `journalctl -f`; only the transport differs."""

    IDENT = "gpufleet-xid-test"

    def __init__(self, fleet, name, scenario_state, scenario="healthy_h100"):
        self.name = name
        self.fleet = fleet
        self.exporter = "%s:9100" % fleet.node(name).ip
        # The node's GPUs are the scenario's (its simulator, package gpufleet-sim, serves the same PCI addresses).
        self.node = Node(env={"GPUFLEET_SIM_SCENARIO": str(SIM / "scenarios" / ("%s.json" % scenario)),
                              "GPUFLEET_SIM_STATE": str(scenario_state / name), "GPUFLEET_SIM_NODE": name})

    def xid(self, gpu, code, body):
        pci = self.node.gpus[gpu]["pci_xid"]
        line = "NVRM: Xid (PCI:%s): %d, pid='<unknown>', name=<unknown>, %s" % (pci, code, body)
        self.fleet.ssh(self.name, "logger -t %s %s" % (self.IDENT, shlex.quote(line)))


class AlertPath:
    """Start with start(); read with slurm_node() and playbook_runs(); stop with close() (also on a failed start).
    With `fleet` (a tests/fleet harness.Fleet whose nodes run the watcher and node_exporter), `nodes` are its nodes'
    names and the rulebook's playbook reaches them over SSH with the fleet's inventory and `inventory_vars`."""

    def __init__(self, root, nodes, inventory_vars=None, fleet=None):
        self.root = Path(root)
        self.bins = executables()
        self.java_home = java_home()
        self.state_root = self.root / "state"
        self.reports = self.root / "reports"
        self.fleet = fleet
        self.nodes = {name: FleetNode(fleet, name, self.root / "scenario") if fleet else
                      SimNode(self.root, name, self.state_root) for name in nodes}
        self.ports = {name: free_port() for name in list(nodes) + ["prometheus", "alertmanager", "eda"]}
        self.procs = []
        self.started = []  # every process start() made, for a caller to check that close() ended them
        self.log_path = self.root / "daemons.log"
        self.rulebook_log = self.root / "ansible-rulebook.log"
        self._write_inventory(inventory_vars or {})

    def _write_inventory(self, inventory_vars):
        inv = self.root / "inventory"
        inv.mkdir()
        if self.fleet:  # the fleet's hosts with their SSH variables
            hosts = yaml.safe_load(self.fleet.inventory_path.read_text())["all"]["hosts"]
            doc = {"all": {"vars": dict(inventory_vars, gpufleet_report_dir=str(self.reports))},
                   "gpufleet_nodes": {"hosts": {name: hosts[name] for name in self.nodes}}}
            (inv / "hosts.yml").write_text(yaml.safe_dump(doc))
            self.inventory = inv
            return
        # ansible-rulebook copies the inventory into a directory of its own for each run: the simulator's root,
        # which inventories/sim finds next to the inventory, is given here.
        hosts = {name: {"gpufleet_sim_scenario": "healthy_h100", "gpufleet_sim_root": str(SIM)} for name in self.nodes}
        doc = {"all": {"vars": dict(inventory_vars, gpufleet_report_dir=str(self.reports))},
               "gpufleet_nodes": {"children": {"gpufleet_sim": None}}, "gpufleet_sim": {"hosts": hosts}}
        (inv / "hosts.yml").write_text(yaml.safe_dump(doc))
        os.symlink(REPO / "inventories" / "sim" / "group_vars", inv / "group_vars")
        self.inventory = inv

    def _spawn(self, argv, log=None, env=None):
        out = open(log or self.log_path, "ab")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        out.close()
        self.procs.append(proc)
        self.started.append(proc)
        return proc

    def start(self, timeout_s=90):
        try:
            self._start(timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def _start(self, timeout_s):
        sim_env = dict(os.environ, GPUFLEET_LIB=str(REPO / "collections"), PYTHONDONTWRITEBYTECODE="1")
        targets = []
        for name, node in self.nodes.items():
            if not self.fleet:
                self._spawn([sys.executable, str(WATCHER), "--config", str(node.watcher_config())],
                            env=dict(sim_env, **node.env))
                node.exporter = "127.0.0.1:%d" % self.ports[name]
                self._spawn([self.bins["prometheus-node-exporter"], "--collector.disable-defaults",
                             "--collector.textfile", "--collector.textfile.directory=%s" % node.metrics,
                             "--web.listen-address=%s" % node.exporter])
            # instance: the node's name and the exporter's port, as a site's targets are (the rulebook strips it).
            targets.append({"targets": [node.exporter], "labels": {"instance": "%s:9100" % name}})
        prom = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(RULES)],
                "alerting": {"alertmanagers": [{"static_configs": [
                    {"targets": ["127.0.0.1:%d" % self.ports["alertmanager"]]}]}]},
                "scrape_configs": [{"job_name": "gpufleet-node", "static_configs": targets}]}
        (self.root / "prometheus.yml").write_text(yaml.safe_dump(prom))
        self._spawn([self.bins["prometheus"], "--config.file=%s" % (self.root / "prometheus.yml"),
                     "--storage.tsdb.path=%s" % (self.root / "tsdb"),
                     "--web.listen-address=127.0.0.1:%d" % self.ports["prometheus"]])
        am = alertmanager_config("http://127.0.0.1:%d/alerts" % self.ports["eda"])
        (self.root / "alertmanager.yml").write_text(yaml.safe_dump(am))
        self._spawn([self.bins["prometheus-alertmanager"], "--config.file=%s" % (self.root / "alertmanager.yml"),
                     "--storage.path=%s" % (self.root / "alertmanager"), "--cluster.listen-address=",
                     "--web.listen-address=127.0.0.1:%d" % self.ports["alertmanager"]])
        eda_env = dict(os.environ, JAVA_HOME=self.java_home, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
                       ANSIBLE_INJECT_FACT_VARS="false", GPUFLEET_SIM_STATE_ROOT=str(self.state_root),
                       GPUFLEET_EDA_HOST="127.0.0.1", GPUFLEET_EDA_PORT=str(self.ports["eda"]),
                       PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
        self._spawn([self.bins["ansible-rulebook"], "-i", str(self.inventory), "-r", RULEBOOK,
                     "-E", "GPUFLEET_EDA_PORT,GPUFLEET_EDA_HOST"], log=self.rulebook_log, env=eda_env)
        deadline = time.monotonic() + timeout_s
        # Ready: Prometheus has scraped every node's watcher, and the rulebook's webhook answers.
        while not (self._scraped() == set(self.nodes) and self._listening(self.ports["eda"])):
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError("the alert path did not come up in %ss (exited: %s)\n%s" % (
                    timeout_s, dead or "none", self.logs()))
            time.sleep(0.2)

    def _scraped(self):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/query?query=gpufleet_watcher_up" %
                                        self.ports["prometheus"], timeout=5) as resp:
                result = json.loads(resp.read())["data"]["result"]
        except OSError:
            return set()
        return {r["metric"]["instance"].split(":")[0] for r in result if r["value"][1] == "1"}

    @staticmethod
    def _listening(port):
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    def exporter_metrics(self, name):
        """What the node's node_exporter serves now ("" when it does not answer)."""
        try:
            with urllib.request.urlopen("http://%s/metrics" % self.nodes[name].exporter, timeout=5) as resp:
                return resp.read().decode(errors="replace")
        except OSError:
            return ""

    def playbook_runs(self):
        """How many playbook runs the rulebook has finished."""
        text = self.rulebook_log.read_text(errors="replace") if self.rulebook_log.exists() else ""
        return text.count("PLAY RECAP")

    def logs(self, tail=4000):
        parts = []
        for path in (self.log_path, self.rulebook_log):
            if path.exists():
                parts.append("--- %s\n%s" % (path.name, path.read_text(errors="replace")[-tail:]))
        return "\n".join(parts)

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # ansible-rulebook's playbook runs are in its session
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        self.procs = []


def scontrol_node(name, scontrol="scontrol", env=None):
    """`scontrol show node -o NAME` as {key: value} (Reason's value runs to the end of the line), or None."""
    proc = subprocess.run([scontrol, "show", "node", "-o", name], capture_output=True, text=True, env=env, timeout=30)
    if proc.returncode != 0:
        return None
    line = proc.stdout.strip()
    head, _, reason = line.partition(" Reason=")
    fields = dict(item.split("=", 1) for item in head.split() if "=" in item)
    fields["Reason"] = reason or None
    return fields
