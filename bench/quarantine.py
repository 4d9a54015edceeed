#!/usr/bin/env python3
"""How long an XID 79 takes to drain its node in Slurm through the alert path, with the real parts.

Each trial writes an XID 79 line ("GPU has fallen off the bus") to a simulated node's kernel log and times it until
`scontrol show node` says DRAIN with gpufleet's reason for that GPU (`gpufleet: XID_79 <gpu>`), through: the XID
watcher (the role's entry script, following the node's journal with the simulator's journalctl) -> its textfile ->
Debian's prometheus-node-exporter -> Prometheus (1 s scrape and evaluation, the shipped alert rules) -> Debian's
prometheus-alertmanager (docs/lifecycle.md's route, 1 s group_wait) -> ansible-rulebook with the shipped rulebook ->
the lifecycle playbook's quarantine (RMA bundle, history, drain). The parts are the ones the integration test starts
(tests/helpers/alert_path.py).

Every --job-every'th trial runs with a job on the node (the simulated Slurm's `gpufleet-sim slurm --jobs 1`): the drain
leaves it running (DRAINING), and a lifecycle row `repairing` while it runs counts in repairs_during_jobs. A node seen
resumed after its drain and before this script releases it counts in wrong_resumes. Between trials the node is
released as an operator does after a fix by hand: the history's quarantined -> validating -> healthy as
operator:bench, then `scontrol update nodename=N state=resume`. An alert keeps firing for an hour after its XID, so
each trial uses a GPU no earlier trial used: ceil(trials / 8) nodes, one trial at a time. The lemon rule is off
(gpufleet_lemon_quarantines=0): the same node is quarantined again within minutes on purpose.

The Slurm end: with --slurm sim (default) the simulator's scontrol (sim/bin first on PATH), a job being its
`gpufleet-sim slurm --jobs 1`. With --slurm real a real Slurm started as tests/helpers/real_slurm.py does (Debian's
slurmctld, one slurmd per bench node, munge; root): the bench nodes are its nodes with 8 GPU gres each, the playbook
drains them with the real scontrol (gpufleet_slurm_bin_dir, SLURM_CONF), a job trial's job is a real `sbatch` job
(`sleep`, one CPU and one GPU) that Slurm runs on the node, so the drain leaves it DRAINING (MIXED+DRAIN) until the
bench cancels the job; the node is then resumed once it settled. With --slurm path the PATH's own scontrol is read
(a Slurm of your own; job trials are not built for it: --job-every 0).

The node end: with --nodes sim (default) simulated nodes, their watchers and node_exporters run here. With --nodes
fleet (root) test-fleet nodes (tests/fleet: systemd-nspawn containers over SSH, ceil(trials / 8) of them): the
gpu_monitoring and gpufleet_node_exporter roles install the watcher and Debian's node_exporter on each node under its
own systemd, Prometheus scrapes the node's address, and the lifecycle playbook reaches the node over SSH (its RMA
bundle runs the simulator's nvidia-bug-report.sh and nvidia-smi there, package gpufleet-sim). The XID line is a journal
entry written on the node with `logger` (a container cannot write its kernel log; the watcher follows that entry's
SYSLOG_IDENTIFIER instead of _TRANSPORT=kernel, real journald otherwise).

Last line: `quarantine p95_s=<s> wrong_resumes=<n> repairs_during_jobs=<n>`. Goal: p95 <= 60 s, both counts 0.

Usage: bench/quarantine.py [--trials 20] [--job-every 5] [--trial-timeout 180] [--slurm sim|real|path]
                           [--nodes sim|fleet]
"""

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle  # noqa: E402
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, default_path  # noqa: E402
from helpers import real_slurm  # noqa: E402
from helpers.alert_path import SIM, AlertPath, FleetNode, Missing, scontrol_node  # noqa: E402

GPUS = 8
FLEET_DIR = Path(os.environ.get("GPUFLEET_BENCH_QUARANTINE_FLEET_DIR", "/var/tmp/gpufleet-bench-quarantine"))
STAGES = ("textfile", "prometheus", "alertmanager", "playbook")


def api(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def stages_reached(stack, name, gpu, pci):
    """Which parts of the path hold the trial's XID now: the watcher's textfile (as node_exporter serves it), a firing
    alert in Prometheus, the alert in Alertmanager, a playbook run started by the rulebook."""
    text = stack.exporter_metrics(name)
    labels = {"alertname": "GpuXidCritical", "instance": "%s:9100" % name, "xid": "79", "gpu": str(gpu)}

    def ours(alert):
        return all(alert.get("labels", {}).get(k) == v for k, v in labels.items())

    firing = (api(stack.ports["prometheus"], "/api/v1/alerts") or {}).get("data", {}).get("alerts", [])
    routed = api(stack.ports["alertmanager"], "/api/v2/alerts") or []
    log = stack.rulebook_log.read_text(errors="replace") if stack.rulebook_log.exists() else ""
    counted = any(line.startswith("gpufleet_xid_events_total{") and 'pci="%s"' % pci in line and 'xid="79"' in line
                  for line in text.splitlines())
    return {"textfile": counted,
            "prometheus": any(ours(a) and a.get("state") == "firing" for a in firing),
            "alertmanager": any(ours(a) for a in routed),
            "playbook": log.count("PLAY [Check the request")}


def drained_by_gpufleet(node, gpu):
    return bool(node) and "DRAIN" in node["State"] and (node["Reason"] or "").startswith("gpufleet: XID_79 %d " % gpu)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--job-every", type=int, default=5, help="every Nth trial runs with a job on the node (0: none)")
    parser.add_argument("--trial-timeout", type=float, default=180.0)
    parser.add_argument("--slurm", choices=("sim", "real", "path"), default="sim")
    parser.add_argument("--nodes", choices=("sim", "fleet"), default="sim",
                        help="simulated nodes here, or test-fleet nodes (root) with the watcher under their systemd")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.job_every < 0:
        parser.error("--trials must be at least 1 and --job-every at least 0")
    if args.slurm == "path" and args.job_every:
        parser.error("--slurm path: job trials are not built for a Slurm of your own; pass --job-every 0")
    if args.slurm == "real" and real_slurm.unavailable():
        raise SystemExit("quarantine: --slurm real: %s" % real_slurm.unavailable())
    if args.nodes == "fleet" and os.geteuid() != 0:
        raise SystemExit("quarantine: --nodes fleet needs root (the test fleet's network namespaces and containers)")

    root = Path(tempfile.mkdtemp(prefix="gpufleet-bench-quarantine-"))
    count = math.ceil(args.trials / GPUS)
    fleet = None
    if args.nodes == "fleet":
        sys.path.insert(0, str(REPO / "tests" / "fleet"))
        import alert_nodes
        started = time.monotonic()
        fleet = alert_nodes.up(FLEET_DIR, count, "gpbq", "10.213.19", root, FleetNode.IDENT)
        print("test fleet up with the watcher and node_exporter in %.1f s: %s" % (
            time.monotonic() - started, fleet.inventory_path))
        nodes = [n.name for n in fleet.nodes]
    else:
        nodes = ["bq%02d" % (i + 1) for i in range(count)]
    slurm = real_slurm.RealSlurm(nodes=nodes, cpus=2, gpus=GPUS) if args.slurm == "real" else None
    started = time.monotonic()
    if slurm:
        slurm.start()
        # The rulebook's playbook runs (children of the alert path's ansible-rulebook) read this Slurm's conf too.
        os.environ["SLURM_CONF"] = str(slurm.conf)
    env = dict(os.environ)
    inventory_vars = dict(alert_nodes.inventory_vars() if fleet else {}, gpufleet_lemon_quarantines=0)
    if args.slurm == "sim":
        env["PATH"] = str(SIM / "bin") + os.pathsep + env["PATH"]
        # The simulated Slurm's state, here: the playbook's scontrol runs here too (delegated to localhost).
        os.environ["GPUFLEET_SIM_SLURM"] = env["GPUFLEET_SIM_SLURM"] = str(root / "state" / "slurm")
    scontrol = shutil.which("scontrol", path=env["PATH"])
    if not scontrol:
        raise SystemExit("quarantine: no scontrol on PATH")
    # The simulated nodes' PATH starts with the simulator's scontrol; a fleet node's PATH is the node's.
    if args.slurm != "sim" or fleet:
        inventory_vars["gpufleet_slurm_bin_dir"] = str(Path(scontrol).parent)
    try:
        stack = AlertPath(root, nodes, inventory_vars=inventory_vars, fleet=fleet)
        stack.start()
    except BaseException as exc:
        if slurm:
            slurm.close()
        if fleet:
            fleet.down()
        if isinstance(exc, Missing):
            raise SystemExit("quarantine: %s" % exc) from None
        raise
    print("alert path up in %.1f s: %d nodes (%s), Slurm end %s%s" % (
        time.monotonic() - started, len(nodes), ", ".join(nodes), scontrol,
        " (a real slurmctld and %d slurmd, %s)" % (len(nodes), slurm.conf) if slurm else ""))
    latencies, failures, timings = [], [], {}
    wrong_resumes = repairs_during_jobs = 0
    try:
        for trial in range(args.trials):
            name, gpu = nodes[trial % len(nodes)], trial // len(nodes)
            job = bool(args.job_every) and (trial + 1) % args.job_every == 0
            if job and slurm:
                job = slurm.sbatch_sleep(name, seconds=int(args.trial_timeout) + 60)  # its id, once it runs
            elif job:
                subprocess.run([str(SIM / "bin" / "gpufleet-sim"), "slurm", "--jobs", "1"], check=True,
                               stdout=subprocess.DEVNULL, env=dict(env, GPUFLEET_SIM_NODE=name,
                                                                   GPUFLEET_SIM_STATE=str(stack.state_root / name)))
            since = time.time()
            t0 = time.monotonic()
            stack.nodes[name].xid(gpu, 79, "GPU has fallen off the bus.")
            latency = None
            deadline = t0 + args.trial_timeout
            pci = stack.nodes[name].node.gpus[gpu]["pci_xid"]
            seen = {}
            while time.monotonic() < deadline:
                now = time.monotonic() - t0
                for stage, reached in stages_reached(stack, name, gpu, pci).items():
                    if stage not in seen and (reached > trial if stage == "playbook" else reached):
                        seen[stage] = now
                if drained_by_gpufleet(scontrol_node(name, scontrol, env), gpu):
                    latency = time.monotonic() - t0
                    break
                time.sleep(0.2)
            for stage in STAGES:
                timings.setdefault(stage, []).append(seen.get(stage, math.nan))
            # The playbook's run ends after the drain; the node stays drained all along.
            resumed = 0
            while latency is not None and stack.playbook_runs() < trial + 1 and time.monotonic() < deadline:
                resumed += not drained_by_gpufleet(scontrol_node(name, scontrol, env), gpu)
                time.sleep(0.2)
            node = scontrol_node(name, scontrol, env)
            resumed += latency is not None and not drained_by_gpufleet(node, gpu)
            wrong_resumes += bool(resumed)
            with History(default_path(stack.reports / "history"), readonly=True) as history:
                rows = [r for r in history.lifecycle_of(name) if r["ts"] >= since]
            repairs = sum(r["to_state"] == "repairing" for r in rows) if job else 0
            repairs_during_jobs += repairs
            state = node["State"] if node else "unknown"
            if latency is None:
                failures.append(trial)
            else:
                latencies.append(latency)
            print("trial %2d  %s GPU %d%s  %s  Slurm %s  lifecycle %s" % (
                trial + 1, name, gpu, " (job running)" if job else "",
                "drained in %.1f s" % latency if latency is not None else "NOT drained in %.0f s" % args.trial_timeout,
                state, " -> ".join(r["to_state"] for r in rows) or "-"))
            # Release, as an operator after a fix by hand, for the next trial.
            if job:
                if "ALLOCATED" not in state and "MIXED" not in state:
                    print("          the job was gone from the node while it drained: %s" % state)
                if not slurm:
                    subprocess.run([str(SIM / "bin" / "gpufleet-sim"), "slurm", "--jobs", "0"], check=True,
                                   stdout=subprocess.DEVNULL, env=dict(env, GPUFLEET_SIM_NODE=name,
                                                                       GPUFLEET_SIM_STATE=str(stack.state_root / name)))
            with History(default_path(stack.reports / "history")) as history:
                for to_state in ("validating", "healthy"):
                    lifecycle.transition(history, name, to_state, "bench: released after trial %d" % (trial + 1),
                                         "operator:bench")
            if slurm:  # the job cancelled, the node settled (no COMPLETING), then resumed
                slurm.reset(name)
            else:
                subprocess.run([scontrol, "update", "nodename=%s" % name, "state=resume"], check=True, env=env)
    finally:
        stack.close()
        if slurm:
            slurm.close()
        if fleet:
            problems = fleet.down()
            if problems:
                print("the test fleet's teardown: %s" % "; ".join(problems))
    measured = latencies + [math.inf] * len(failures)
    p95 = statistics.quantiles(measured, n=20, method="inclusive")[18] if len(measured) > 1 else measured[0]
    print("trials %d (%d with a job running), drained %d, not drained %d%s" % (
        args.trials, sum(bool(args.job_every) and (t + 1) % args.job_every == 0 for t in range(args.trials)),
        len(latencies), len(failures), (" (trials %s)" % ", ".join(str(t + 1) for t in failures)) if failures else ""))
    if latencies:
        print("XID 79 -> Slurm DRAIN with gpufleet's reason: min %.1f s, median %.1f s, p95 %.1f s, max %.1f s "
              "(goal: p95 <= 60 s)" % (min(latencies), statistics.median(latencies), p95, max(latencies)))
        print("median time from the XID line to: %s, drained %.1f s" % (", ".join(
            "%s %.1f s" % (stage, statistics.median(v for v in timings[stage] if not math.isnan(v)))
            for stage in STAGES if any(not math.isnan(v) for v in timings[stage])), statistics.median(latencies)))
    print("logs and history in %s" % root)
    print("quarantine p95_s=%.1f wrong_resumes=%d repairs_during_jobs=%d" % (p95, wrong_resumes, repairs_during_jobs))
    return 1 if failures or wrong_resumes or repairs_during_jobs else 0


if __name__ == "__main__":
    sys.exit(main())
