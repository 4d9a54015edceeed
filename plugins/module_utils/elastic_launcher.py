# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""gpufleet-elastic: the launcher the elastic training service runs on each node (stdlib only: the node's Python).

    gpufleet-elastic run      --config /etc/gpufleet/elastic/<job>.json   (the service's ExecStart)
    gpufleet-elastic gate     --config ...   run the health gate only; exit 0 pass, 11 refused
    gpufleet-elastic status   --config ...   JSON: state, last gate, newest complete checkpoint, workers, drain
    gpufleet-elastic drain    --config ... [--wait-checkpoint-s N] [--reason TEXT]
    gpufleet-elastic undrain  --config ...

One attempt = the health gate (elastic_gate: a node that fails it stays out of the rendezvous and says why in the
journal) + torchrun with a c10d rendezvous, --nnodes MIN:MAX, --max-restarts and --monitor-interval. torchrun
restarts a failed worker group in place; the worker wrapper (elastic_worker) delays each of those restarts with
backoff and jitter and hands the entrypoint the newest complete checkpoint. When torchrun itself fails before its
workers used their restarts (the rendezvous or the agent failed), the launcher waits a backoff with jitter, runs the
gate again and rejoins, up to max_attempts.

Exit codes (the unit's SuccessExitStatus / RestartPreventExitStatus follow them):
    0   the job finished: every worker exited 0
    2   the configuration is unusable (nothing started)
    10  out of restarts: the workers failed with no restart left (or the agent failed max_attempts times)
    11  refused: the health gate kept this node out of the job
    12  stopped on request: drained (gpufleet-elastic drain) or stopped (SIGTERM, systemctl stop)
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import glob
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils import elastic_gate, gpufleet_ckpt
from ansible_collections.kentino.gpufleet.plugins.module_utils.elastic_worker import backoff_delay
from ansible_collections.kentino.gpufleet.plugins.module_utils.prom_textfile import MetricFamily, atomic_write, render

EXIT_FINISHED = 0
EXIT_CONFIG = 2
EXIT_OUT_OF_RESTARTS = 10
EXIT_REFUSED = 11
EXIT_STOPPED = 12
STATES = ("gate", "running", "backoff", "finished", "refused", "out_of_restarts", "stopped", "failed")
_ENDPOINT_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}$")
_JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# syslog priorities journald reads from a "<N>" line prefix on a service's stderr
_PRIORITY = {"err": 3, "warning": 4, "notice": 5, "info": 6}


class ConfigError(Exception):
    pass


DEFAULTS = {
    "args": [], "entrypoint_python": True, "nproc_per_node": 1, "min_nodes": 1, "max_nodes": 1, "rdzv_conf": {},
    "local_addr": None, "max_restarts": 3, "monitor_interval_s": 5, "max_attempts": 3, "metrics_dir": None,
    "environment": {}, "stop_timeout_s": 60, "host": None,
    "backoff": {"base_s": 10.0, "max_s": 300.0, "jitter": 0.5},
    "gate": {"enabled": True, "checks": list(elastic_gate.CHECKS), "nvidia_smi": "nvidia-smi",
             "journalctl": "journalctl", "dmesg": "dmesg", "timeout_s": 60, "thresholds": {},
             "refuse_on": ["fail", "error"], "checkpoint_size_gb": None, "keep": 1, "mounts_file": "/proc/mounts"},
}


_INT_KEYS = ("nproc_per_node", "min_nodes", "max_nodes", "max_restarts", "max_attempts")
_NUM_KEYS = ("monitor_interval_s", "stop_timeout_s")


def _number(value, integer=False):
    if isinstance(value, str) and re.match(r"^-?[0-9]+(\.[0-9]+)?$", value.strip()):
        number = float(value)
        return int(number) if integer and number == int(number) else number
    return value


def _need(cond, message):
    if not cond:
        raise ConfigError(message)


def _is_int(value, low=0):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_num(value, low=0.0):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= low


def validate(raw):
    """The launcher configuration with defaults filled in; ConfigError naming the key and the fix otherwise."""
    _need(isinstance(raw, dict), "the configuration must be a JSON object")
    cfg = dict(DEFAULTS)
    cfg.update(raw)
    cfg["backoff"] = dict(DEFAULTS["backoff"], **(raw.get("backoff") or {}))
    cfg["gate"] = dict(DEFAULTS["gate"], **(raw.get("gate") or {}))
    # Numbers written as text (a templated configuration) are read as numbers.
    for section, keys in ((cfg, _INT_KEYS), (cfg, _NUM_KEYS), (cfg["backoff"], ("base_s", "max_s", "jitter")),
                          (cfg["gate"], ("timeout_s", "keep", "checkpoint_size_gb"))):
        for key in keys:
            section[key] = _number(section.get(key), integer=keys is _INT_KEYS or key in ("timeout_s", "keep"))
    for key in ("job", "torchrun", "entrypoint", "worker", "rdzv_endpoint", "state_dir", "checkpoint_dir"):
        _need(isinstance(cfg.get(key), str) and cfg[key], "%s is missing or not a string" % key)
    _need(_JOB_RE.match(cfg["job"]), "job %r: use letters, digits, . _ - (the rendezvous id and unit name)" % cfg["job"])
    _need(_ENDPOINT_RE.match(cfg["rdzv_endpoint"]), "rdzv_endpoint %r must be HOST:PORT" % cfg["rdzv_endpoint"])
    for key in ("entrypoint", "worker", "state_dir", "checkpoint_dir"):
        _need(cfg[key].startswith("/"), "%s %r must be an absolute path" % (key, cfg[key]))
    _need(cfg["nproc_per_node"] == "gpu" or _is_int(cfg["nproc_per_node"], 1),
          "nproc_per_node must be an integer >= 1 or \"gpu\", got %r" % (cfg["nproc_per_node"],))
    _need(_is_int(cfg["min_nodes"], 1) and _is_int(cfg["max_nodes"], 1) and cfg["min_nodes"] <= cfg["max_nodes"],
          "min_nodes/max_nodes must be integers with 1 <= min <= max, got %r:%r" % (cfg["min_nodes"], cfg["max_nodes"]))
    _need(_is_int(cfg["max_restarts"]), "max_restarts must be an integer >= 0")
    _need(_is_int(cfg["max_attempts"], 1), "max_attempts must be an integer >= 1")
    _need(_is_num(cfg["monitor_interval_s"]) and cfg["monitor_interval_s"] > 0, "monitor_interval_s must be > 0")
    _need(_is_num(cfg["stop_timeout_s"]), "stop_timeout_s must be a number >= 0")
    b = cfg["backoff"]
    _need(_is_num(b["base_s"]) and _is_num(b["max_s"]) and _is_num(b["jitter"]) and b["jitter"] <= 1,
          "backoff needs base_s >= 0, max_s >= 0 and jitter in [0, 1], got %r" % (b,))
    _need(isinstance(cfg["args"], list) and all(isinstance(a, str) for a in cfg["args"]), "args must be strings")
    for key in ("rdzv_conf", "environment"):
        _need(isinstance(cfg[key], dict), "%s must be a mapping" % key)
    g = cfg["gate"]
    unknown = [c for c in g["checks"] if c not in elastic_gate.CHECKS]
    _need(not unknown, "gate.checks: unknown %s (known: %s)" % (unknown, ", ".join(elastic_gate.CHECKS)))
    _need(set(g["refuse_on"]) <= {"warn", "error", "fail"}, "gate.refuse_on takes warn, error, fail")
    return cfg


def load_config(path):
    try:
        with open(path) as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError("cannot read %s: %s" % (path, exc)) from exc
    return validate(raw)


def torchrun_argv(cfg):
    argv = [cfg["torchrun"], "--nnodes=%d:%d" % (cfg["min_nodes"], cfg["max_nodes"]),
            "--nproc-per-node=%s" % cfg["nproc_per_node"], "--max-restarts=%d" % cfg["max_restarts"],
            "--monitor-interval=%s" % cfg["monitor_interval_s"], "--rdzv-backend=c10d",
            "--rdzv-endpoint=%s" % cfg["rdzv_endpoint"], "--rdzv-id=%s" % cfg["job"]]
    if cfg["rdzv_conf"]:
        argv.append("--rdzv-conf=" + ",".join("%s=%s" % kv for kv in sorted(cfg["rdzv_conf"].items())))
    if cfg["local_addr"]:
        argv.append("--local-addr=%s" % cfg["local_addr"])
    return argv + [cfg["worker"], cfg["entrypoint"]] + list(cfg["args"])


def worker_environment(cfg, base=None):
    env = dict(os.environ if base is None else base)
    # torch >= 2.5 shares the rendezvous' TCPStore with the workers' process group, and after a restart the ranks of
    # agents that restarted for different reasons (a failure, a membership change) read each other's stale keys:
    # init_process_group hangs (pytorch/pytorch#135712). A store per round avoids it; the job may still say "0".
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    env.update((str(k), str(v)) for k, v in cfg["environment"].items())
    env.update({
        "GPUFLEET_JOB": cfg["job"], "GPUFLEET_ELASTIC_STATE_DIR": cfg["state_dir"],
        gpufleet_ckpt.ENV_DIR: cfg["checkpoint_dir"],
        "GPUFLEET_BACKOFF_BASE_S": str(cfg["backoff"]["base_s"]), "GPUFLEET_BACKOFF_MAX_S": str(cfg["backoff"]["max_s"]),
        "GPUFLEET_BACKOFF_JITTER": str(cfg["backoff"]["jitter"]),
        "GPUFLEET_ENTRYPOINT_PYTHON": "1" if cfg["entrypoint_python"] else "0",
    })
    if cfg["metrics_dir"]:
        env["GPUFLEET_TRAINING_METRICS_DIR"] = cfg["metrics_dir"]
    return env


def drain_file(cfg):
    return os.path.join(cfg["state_dir"], "drain")


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


class Launcher:
    def __init__(self, cfg, stderr=None, popen=subprocess.Popen, gate=elastic_gate.evaluate, clock=time.time,
                 rng=None, poll_s=0.5):
        self.cfg = cfg
        self.host = cfg["host"] or socket.gethostname()
        self.stderr = stderr or sys.stderr
        self.popen, self.gate, self.clock = popen, gate, clock
        self.rng = rng or random.Random()
        self.poll_s = poll_s
        self.stop_reason = None
        self.proc = None
        self.attempt = 0
        self.journal = bool(os.environ.get("JOURNAL_STREAM"))

    # ---- output ------------------------------------------------------------------------------------------------
    def log(self, message, level="info"):
        prefix = "<%d>" % _PRIORITY[level] if self.journal else ""
        for line in str(message).splitlines() or [""]:
            self.stderr.write("%sgpufleet-elastic[%s]: %s\n" % (prefix, self.cfg["job"], line))
        self.stderr.flush()

    def state(self, name, **extra):
        doc = {"job": self.cfg["job"], "host": self.host, "state": name, "attempt": self.attempt,
               "since": self.clock(), "pid": os.getpid()}
        doc.update(extra)
        try:
            os.makedirs(self.cfg["state_dir"], exist_ok=True)
            atomic_write(os.path.join(self.cfg["state_dir"], "launcher.json"), json.dumps(doc, sort_keys=True))
        except OSError as exc:
            self.log("cannot write the state file under %s: %s" % (self.cfg["state_dir"], exc), "warning")
        self._metrics(name)

    def _metrics(self, name):
        directory = self.cfg["metrics_dir"]
        if not directory:
            return
        labels = {"training_job": self.cfg["job"]}
        fam = MetricFamily("gpufleet_elastic_state", "gauge", "The elastic launcher's state (1 = current)")
        for state in STATES:
            fam.add(1 if state == name else 0, state=state, **labels)
        fams = [fam, MetricFamily("gpufleet_elastic_attempt", "gauge", "Launch attempts of this service run").add(
            self.attempt, **labels), MetricFamily("gpufleet_elastic_state_timestamp_seconds", "gauge",
                                                  "When the launcher entered its state").add(self.clock(), **labels)]
        try:
            atomic_write(os.path.join(directory, "gpufleet_elastic_%s.prom" % self.cfg["job"]), render(fams))
        except OSError as exc:
            self.log("cannot write the launcher metrics under %s: %s" % (directory, exc), "warning")

    def clear_rank_metrics(self):
        """Empty the ranks' files: series of a job that is not running here would look stalled forever."""
        directory = self.cfg["metrics_dir"]
        if not directory:
            return
        for path in glob.glob(os.path.join(directory, "gpufleet_training_%s_local*.prom" % self.cfg["job"])):
            try:
                atomic_write(path, "")
            except OSError as exc:
                self.log("cannot clear %s: %s" % (path, exc), "warning")

    # ---- signals and waiting -------------------------------------------------------------------------------------
    def _on_signal(self, signum, _frame):
        # Only noted here: the wait loop sends torchrun ONE SIGTERM (a second one would cut its shutdown short).
        self.stop_reason = self.stop_reason or "signal %d" % signum

    def install_signals(self):
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def sleep(self, seconds):
        """Sleep, returning False early when asked to stop or drain."""
        deadline = self.clock() + seconds
        while self.clock() < deadline:
            if self.stop_reason or os.path.exists(drain_file(self.cfg)):
                return False
            time.sleep(min(self.poll_s, max(deadline - self.clock(), 0)))
        return True

    def drain_due(self):
        """A drain request whose wait for a fresh checkpoint is over (or that does not wait): stop now."""
        marker = read_json(drain_file(self.cfg))
        if marker is None and not os.path.exists(drain_file(self.cfg)):
            return False
        marker = marker or {}
        requested = float(marker.get("requested") or 0)
        wait_s = float(marker.get("wait_checkpoint_s") or 0)
        if wait_s <= 0 or self.clock() - requested >= wait_s:
            return True
        ckpt = gpufleet_ckpt.latest(self.cfg["checkpoint_dir"])
        return bool(ckpt and float(ckpt.manifest.get("created") or 0) > requested)

    # ---- one attempt ---------------------------------------------------------------------------------------------
    def run_gate(self):
        gcfg = dict(self.cfg["gate"], checkpoint_dir=self.cfg["checkpoint_dir"], drain_file=drain_file(self.cfg))
        self.state("gate")
        result = self.gate(gcfg, self.host)
        try:
            atomic_write(os.path.join(self.cfg["state_dir"], "gate.json"), json.dumps(result, sort_keys=True))
        except OSError:
            pass
        for f in result["findings"]:
            level = "err" if f in result["refusing"] else "warning"
            self.log("gate: %s %s: %s -> %s" % (f["severity"].upper(), f["code"], f["message"], f["action"]), level)
            for line in f["evidence"][:5]:
                self.log("gate:   evidence: %s" % line, level)
        return result

    def run_torchrun(self):
        self.clear_worker_records()
        argv = torchrun_argv(self.cfg)
        self.log("attempt %d: %s" % (self.attempt, " ".join(argv)))
        self.state("running", argv=argv)
        try:
            self.proc = self.popen(argv, env=worker_environment(self.cfg))
        except OSError as exc:
            self.log("cannot start %s: %s (fix elastic_training_torchrun)" % (argv[0], exc), "err")
            return None
        stopping_since = None
        draining = False
        while True:
            rc = self.proc.poll()
            if rc is not None:
                return rc
            if not draining and stopping_since is None and os.path.exists(drain_file(self.cfg)):
                draining = True  # said once: the drain waits for the job's next checkpoint (or stops now)
                marker = read_json(drain_file(self.cfg)) or {}
                wait_s = marker.get("wait_checkpoint_s") or 0
                self.log("drain requested%s: stopping torchrun %s" % (
                    " (%s)" % marker["reason"] if marker.get("reason") else "",
                    "after the job's next checkpoint (at most %s s)" % wait_s if wait_s else "now"), "notice")
                self.state("running", argv=argv, draining=True)
            if stopping_since is None and (self.stop_reason or self.drain_due()):
                self.stop_reason = self.stop_reason or "drained"
                self.log("stopping torchrun (%s)" % self.stop_reason, "notice")
                stopping_since = self.clock()
                self.proc.send_signal(signal.SIGTERM)
            elif stopping_since is not None and self.clock() - stopping_since > self.cfg["stop_timeout_s"]:
                self.log("torchrun did not stop within %s s: killing it" % self.cfg["stop_timeout_s"], "warning")
                self.proc.kill()
                stopping_since = float("inf")
            time.sleep(self.poll_s)

    def clear_worker_records(self):
        for path in glob.glob(os.path.join(self.cfg["state_dir"], "workers", "local*.json")):
            try:
                os.unlink(path)
            except OSError:
                pass

    def restarts_used(self):
        counts = [r.get("restart_count") for r in
                  (read_json(p) for p in glob.glob(os.path.join(self.cfg["state_dir"], "workers", "local*.json")))
                  if isinstance(r, dict) and isinstance(r.get("restart_count"), int)]
        return max(counts) if counts else None

    def finish(self, code, state, message, level="info", clear=False):
        self.log(message, level)
        if clear:
            self.clear_rank_metrics()
        self.state(state, exit_code=code, message=message)
        return code

    def run(self):
        self.install_signals()
        b = self.cfg["backoff"]
        while True:
            self.attempt += 1
            if self.attempt > 1:
                delay = backoff_delay(self.attempt - 1, b["base_s"], b["max_s"], b["jitter"], self.rng)
                self.log("rejoining in %.1f s (attempt %d of %d)" % (delay, self.attempt, self.cfg["max_attempts"]))
                self.state("backoff", delay_s=round(delay, 3))
                if not self.sleep(delay) and self.stop_reason:
                    return self.finish(EXIT_STOPPED, "stopped", "stopped during the backoff (%s)" % self.stop_reason,
                                       clear=True)
            if self.cfg["gate"]["enabled"]:
                result = self.run_gate()
                if result["verdict"] != "pass":
                    codes = sorted(set(f["code"] for f in result["refusing"]))
                    if codes == ["NODE_DRAINED"]:
                        return self.finish(EXIT_STOPPED, "stopped", "drained: not joining the job", "notice", True)
                    return self.finish(EXIT_REFUSED, "refused", "refused by the health gate (%s): %s stays out of the "
                                       "rendezvous; fix the finding(s) above, then restart the service" % (
                                           ", ".join(codes), self.host), "err", True)
            elif os.path.exists(drain_file(self.cfg)):
                return self.finish(EXIT_STOPPED, "stopped", "drained: not joining the job", "notice", True)
            rc = self.run_torchrun()
            self.proc = None
            if self.stop_reason:
                return self.finish(EXIT_STOPPED, "stopped", "stopped on request (%s); torchrun exited %s" % (
                    self.stop_reason, rc), "notice", True)
            if rc == 0:
                return self.finish(EXIT_FINISHED, "finished", "the job finished: every worker exited 0", clear=True)
            used = self.restarts_used()
            if rc is not None and used is not None and used >= self.cfg["max_restarts"]:
                return self.finish(EXIT_OUT_OF_RESTARTS, "out_of_restarts", "out of restarts: the workers failed "
                                   "after %d of %d restarts (torchrun exit %s); a human is needed: read the workers' "
                                   "errors above" % (used, self.cfg["max_restarts"], rc), "err")
            if self.attempt >= self.cfg["max_attempts"]:
                return self.finish(EXIT_OUT_OF_RESTARTS, "out_of_restarts", "out of attempts: torchrun failed %d "
                                   "time(s) before its workers used their restarts (rendezvous endpoint %s "
                                   "unreachable? agent error above)" % (self.attempt, self.cfg["rdzv_endpoint"]),
                                   "err")
            self.log("torchrun exited %s with %s of %d restarts used: the rendezvous or the agent failed" % (
                rc, used if used is not None else "no worker started,", self.cfg["max_restarts"]), "warning")


def status(cfg):
    ckpt = gpufleet_ckpt.latest(cfg["checkpoint_dir"])
    workers = [read_json(p) for p in sorted(glob.glob(os.path.join(cfg["state_dir"], "workers", "local*.json")))]
    gate = read_json(os.path.join(cfg["state_dir"], "gate.json")) or {}
    return {
        "job": cfg["job"],
        "launcher": read_json(os.path.join(cfg["state_dir"], "launcher.json")),
        "drain": read_json(drain_file(cfg)) if os.path.exists(drain_file(cfg)) else None,
        "checkpoint": {"step": ckpt.step, "path": ckpt.path, "created": ckpt.manifest.get("created")} if ckpt else None,
        "gate": {"verdict": gate.get("verdict"), "refusing": [f.get("message") for f in gate.get("refusing") or []]},
        "workers": [w for w in workers if w],
    }


def main(argv=None, stdout=None):
    parser = argparse.ArgumentParser(prog="gpufleet-elastic", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("run", "gate", "status", "drain", "undrain"))
    parser.add_argument("--config", required=True)
    parser.add_argument("--wait-checkpoint-s", type=float, default=0.0,
                        help="drain: let the job write one more checkpoint first (at most this long)")
    parser.add_argument("--reason", default="")
    args = parser.parse_args(argv)
    out = stdout or sys.stdout
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        sys.stderr.write("gpufleet-elastic: %s: %s\n" % (args.config, exc))
        return EXIT_CONFIG
    if args.command == "run":
        return Launcher(cfg).run()
    if args.command == "gate":
        gcfg = dict(cfg["gate"], checkpoint_dir=cfg["checkpoint_dir"], drain_file=drain_file(cfg))
        result = elastic_gate.evaluate(gcfg, cfg["host"] or socket.gethostname())
        out.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
        return EXIT_FINISHED if result["verdict"] == "pass" else EXIT_REFUSED
    if args.command == "status":
        out.write(json.dumps(status(cfg), indent=2, sort_keys=True) + "\n")
        return 0
    path = drain_file(cfg)
    if args.command == "drain":
        os.makedirs(cfg["state_dir"], exist_ok=True)
        atomic_write(path, json.dumps({"requested": time.time(), "wait_checkpoint_s": args.wait_checkpoint_s,
                                       "reason": args.reason}))
        out.write("drain requested: %s\n" % path)
        return 0
    try:
        os.unlink(path)
        out.write("undrained: %s removed\n" % path)
    except FileNotFoundError:
        out.write("not drained\n")
    return 0
