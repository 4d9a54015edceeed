#!/usr/bin/env python3
"""Take docs/img/fabric-report.png: the fleet report's fabric section, for real.

Runs playbooks/fabric.yml on the demo fabric (inventories/sim-fabric: twelve simulated nodes on three leaf switches,
a slow NIC rail on fab-node06, fab-node11 unreachable from its partners), then headless chromium photographs the
report's fabric section (the culprit with its evidence and action, the pair errors, the pairs matrix).
Needs chromium.   Usage: hack/screenshot_fabric.py [--reuse REPORTS_DIR] [out.png]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from report_shot import photograph_report  # hack/ is on sys.path: a script

REPO = Path(__file__).resolve().parents[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=1560)
    parser.add_argument("--reuse", help="a reports directory of an earlier run: only take the screenshot")
    parser.add_argument("out", nargs="?", default=str(REPO / "docs" / "img" / "fabric-report.png"))
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="gpufleet-fabric-shot-"))
    if args.reuse is None:
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
                   GPUFLEET_SIM_STATE_ROOT=str(root / "state"))
        extra = json.dumps({"gpufleet_report_dir": str(root / "reports"), "gpufleet_fail_on": "never",
                            "gpufleet_sim_time_scale": 0.001})
        proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "playbooks/fabric.yml", "-i",
                               "inventories/sim-fabric", "-e", extra], cwd=REPO, env=env, capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stdout[-3000:] + proc.stderr[-2000:])
    html = Path(args.reuse or root / "reports") / "latest" / "report.html"
    # The picture is the fabric section.
    out = photograph_report(html, "main > *:not(#fabric)", args.out, args.height, root)
    print("wrote %s (report: %s)" % (out, html))
    return 0


if __name__ == "__main__":
    sys.exit(main())
