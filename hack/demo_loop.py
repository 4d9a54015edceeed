#!/usr/bin/env python3
"""make demo-loop: the lifecycle loop on the simulated fleet, step by step, with a real Redfish BMC (sim/bmc:
sushy-tools' emulator) and the simulator's Slurm.

loop01: its riser drops GPU 3 under load (XID 79); the preflight with gpufleet_quarantine=critical fails it and
quarantines it (RMA bundle, history, Slurm drain); the repair power-cycles it through its BMC, the preflight
validates it and it returns to Slurm.
loop02: the same fault reported by an alert, repaired and returned; the fault comes back the same day: the second
quarantine in 7 days makes it a lemon, out for RMA with its evidence bundle.

usage: hack/demo_loop.py [--root DIR] [--shot PNG]
DIR (default reports/demo-loop) is removed and made anew. Prints what happens at each step; exits 1 when a step does
not end as the loop says it must. --shot photographs the transcript with headless chromium (docs/img/).
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, default_path  # noqa: E402

NODES = ("loop01", "loop02")
TRANSCRIPT = []


class Demo:
    def __init__(self, root):
        self.root = root
        self.seen = {n: 0 for n in NODES}
        self.failures = []

    def env(self):
        # JSON results: a task's message on one line, for the lines this demo shows
        return dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
                    ANSIBLE_CALLBACK_RESULT_FORMAT="json", GPUFLEET_SIM_STATE_ROOT=str(self.root / "state"), PATH="%s:%s" % (BIN, os.environ["PATH"]))

    def playbook(self, name, node, **extra):
        extra = dict(extra, gpufleet_report_dir=str(self.root / "reports"), gpufleet_hosts=node,
                     lifecycle_dcgm_level=1)
        proc = subprocess.run([str(BIN / "ansible-playbook"), "playbooks/%s.yml" % name, "-i", str(self.root / "inv"),
                               "-e", json.dumps(extra)], cwd=REPO, env=self.env(), capture_output=True, text=True,
                              timeout=900)
        return proc.returncode, proc.stdout + proc.stderr

    def sim(self, node, *argv):
        env = dict(self.env(), GPUFLEET_SIM_STATE=str(self.root / "state" / node), GPUFLEET_SIM_NODE=node,
                   GPUFLEET_SIM_SCENARIO="riser_xid79", GPUFLEET_SIM_TIME_SCALE="0.001")
        return subprocess.run([str(REPO / "sim" / "bin" / argv[0])] + list(argv[1:]), env=env, capture_output=True,
                              text=True, timeout=120)

    def fault(self, node):
        self.sim(node, "gpu_burn", "30")
        smi = self.sim(node, "nvidia-smi", "-L")
        lines = (smi.stdout + smi.stderr).strip().splitlines()
        say("fault", "%s: the riser drops GPU 3 under load; nvidia-smi -L exits %d: %s" % (
            node, smi.returncode, next((x for x in lines if "lost" in x), lines[-1])[:120]))

    def report(self, node, out, keys=("bmc_power_cycle:", "bundle ")):
        """The node's new lifecycle transitions, its Slurm state, and the playbook's lines about the rung."""
        with History(default_path(self.root / "reports" / "history"), readonly=True) as history:
            rows = history.lifecycle_of(node)
        for row in rows[self.seen[node]:]:
            say("history", "%s: %s -> %s by %s: %s" % (node, row["from_state"], row["to_state"], row["actor"],
                                                        row["reason"][:150]))
        self.seen[node] = len(rows)
        for line in out.splitlines():
            if line.strip().startswith('"msg": "') and any(k in line for k in keys):
                msg = json.loads("{%s}" % line.strip().rstrip(","))["msg"].replace(str(self.root) + "/", "")
                # the power cycle's steps on one line; the quarantine's parts one a line
                parts = [msg.replace("; ", ", ")] if msg.startswith("bmc_power_cycle") else re.split(r";?\s*\n\s*|; ", msg)
                for part in parts:
                    if part.strip(" ;"):
                        say("playbook", part.strip(" ;"))
        slurm = json.loads((self.root / "state" / "slurm" / ("%s.json" % node)).read_text())
        say("slurm", "%s: %s" % (node, "DRAIN, reason %r" % slurm["reason"] if slurm["drain"] else "in service"))
        return rows[-1]["to_state"] if rows else "healthy", slurm["drain"]

    def expect(self, what, got, want):
        if got != want:
            self.failures.append("%s: %r, expected %r" % (what, got, want))
            say("UNEXPECTED", self.failures[-1])


def say(step, text):
    TRANSCRIPT.append("%-10s %s" % (step, text))
    print(TRANSCRIPT[-1], flush=True)


def section(title):
    TRANSCRIPT.append("\n== %s ==" % title)
    print(TRANSCRIPT[-1], flush=True)


def photograph(out, workdir):
    sys.path.insert(0, str(REPO / "hack"))
    from html import escape

    from report_shot import photograph_report

    html = Path(workdir) / "transcript.html"
    html.write_text("<html><head><meta charset='utf-8'></head><body style='margin:0;background:#1e1e1e'><pre style="
                    "'color:#ddd;font:13px monospace;padding:12px;white-space:pre-wrap'>$ make demo-loop\n%s</pre>"
                    "</body></html>" % escape("\n".join(TRANSCRIPT)))
    return photograph_report(html, "#none", out, 19 * len("\n".join(TRANSCRIPT).splitlines()) + 80, workdir)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(REPO / "reports" / "demo-loop"))
    ap.add_argument("--shot", help="write a PNG of the transcript (headless chromium)")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(root / "inv"), "--nodes",
                    "2", "--scenario", "riser_xid79", "--prefix", "loop"], check=True, stdout=subprocess.DEVNULL)
    demo = Demo(root)
    port = free_port()
    bmc = subprocess.Popen([sys.executable, str(REPO / "sim" / "bmc"), "--dir", str(root / "bmc"), "--root",
                            str(root / "state"), "--nodes", ",".join(NODES), "--port", str(port), "--password",
                            "demo-bmc-pw"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           env=demo.env())
    try:
        ids = dict(bmc.stdout.readline().split()[1:] for _ in NODES)
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            if bmc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("sim/bmc did not start (exit %s): is sushy-tools installed? (make venv)" % bmc.poll())
            time.sleep(0.2)
        (root / "inv" / "host_vars").mkdir()
        for node in NODES:
            (root / "inv" / "host_vars" / ("%s.yml" % node)).write_text(json.dumps({
                "gpufleet_bmc_url": "https://127.0.0.1:%d" % port, "gpufleet_bmc_username": "admin",
                "gpufleet_bmc_password": "demo-bmc-pw", "gpufleet_bmc_system_id": ids[node],
                "gpufleet_bmc_ca_path": str(root / "bmc" / "bmc.crt"), "gpufleet_poll_interval_s": 1}))
        say("setup", "2 simulated nodes (riser_xid79), their BMCs on https://127.0.0.1:%d (sushy-tools, Redfish), "
                     "the simulator's Slurm" % port)

        section("loop01: fault, quarantine, repair, validation, return")
        demo.fault("loop01")
        rc, out = demo.playbook("preflight", "loop01", gpufleet_quarantine="critical")
        say("detect", "preflight with gpufleet_quarantine=critical: exit %d (the failing node fails the run)" % rc)
        demo.expect("loop01 after the preflight", demo.report("loop01", out), ("quarantined", True))
        rc, out = demo.playbook("lifecycle", "loop01", lifecycle_action="repair", lifecycle_node="loop01")
        say("repair", "gpufleet repair loop01: exit %d" % rc)
        demo.expect("loop01 after the repair", demo.report("loop01", out), ("healthy", False))
        smi = demo.sim("loop01", "nvidia-smi", "-L")
        say("check", "loop01: nvidia-smi -L exits %d, %d GPUs" % (smi.returncode, smi.stdout.count("GPU ")))

        section("loop02: the same fault twice in a day: a lemon, out for RMA")
        for attempt in (1, 2):
            demo.fault("loop02")
            rc, out = demo.playbook("lifecycle", "loop02", lifecycle_action="quarantine", lifecycle_node="loop02",
                                    lifecycle_code="XID_79", lifecycle_gpu="3", lifecycle_actor="alert",
                                    lifecycle_reason="GpuXidCritical: XID 79 on GPU 3")
            say("alert", "the XID alert quarantines loop02 (fault %d): exit %d" % (attempt, rc))
            state = demo.report("loop02", out)
            if attempt == 1:
                demo.expect("loop02 after its first fault", state, ("quarantined", True))
                rc, out = demo.playbook("lifecycle", "loop02", lifecycle_action="repair", lifecycle_node="loop02")
                say("repair", "gpufleet repair loop02: exit %d" % rc)
                demo.expect("loop02 after the repair", demo.report("loop02", out), ("healthy", False))
            else:
                demo.expect("loop02 after its second fault", state, ("rma", True))
        bundles = sorted((root / "reports" / "rma" / "loop02").glob("gpufleet-rma-loop02-*"))
        for bundle in bundles:
            manifest = json.loads((bundle / "manifest.json").read_text())
            say("rma", "%s: %s" % (bundle.relative_to(root), ", ".join(f["name"] for f in manifest["files"])))
        demo.expect("loop02's RMA bundles", len(bundles), 2)
        rc, out = demo.playbook("lifecycle", "loop02", lifecycle_action="repair", lifecycle_node="loop02")
        say("refused", "gpufleet repair loop02: exit %d: %s" % (rc, "out for RMA" if "out for RMA" in out else "?"))
    finally:
        bmc.terminate()
        bmc.wait(timeout=30)
    if demo.failures:
        say("FAILED", "; ".join(demo.failures))
    else:
        say("done", "loop01 returned to service; loop02 is out for RMA with its bundles (%s)" % (root / "reports"))
    if args.shot:
        print("screenshot", photograph(args.shot, root))
    return 1 if demo.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
