#!/usr/bin/env python3
"""Take docs/img/audit-trend.png: the report's trend view of a GPU with the slow ECC leak, for real.

Two simulated nodes (sim scenarios ecc_leak_trend and healthy_h100) are audited once a simulated day with
playbooks/audit.yml, the simulator's clock advanced between runs (gpufleet-sim clock), the history recording every
run; then headless chromium photographs the leaking node's card in the last report (its corrected-ECC-per-day curve,
the changes since the previous audit, the findings). Needs chromium.   Usage: hack/screenshot_audit.py [--days 20] [out.png]
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
HOSTS = {"leak01": "ecc_leak_trend", "ok01": "healthy_h100"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=20)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--reuse", help="a reports directory of an earlier run: only take the screenshot")
    parser.add_argument("out", nargs="?", default=str(REPO / "docs" / "img" / "audit-trend.png"))
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="gpufleet-audit-shot-"))
    inv = root / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("gpufleet_nodes:\n  children:\n    gpufleet_sim:\ngpufleet_sim:\n  hosts:\n" + "".join(
        "    %s:\n      gpufleet_sim_scenario: %s\n" % item for item in HOSTS.items()))
    os.symlink(REPO / "inventories" / "sim" / "group_vars", inv / "group_vars")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
               GPUFLEET_SIM_STATE_ROOT=str(root / "state"))
    extra = json.dumps({"gpufleet_report_dir": str(root / "reports"), "gpufleet_fail_on": "never",
                        "gpufleet_audit_dcgm_enabled": False, "gpufleet_checkpoint_path": ""})
    for day in range(0 if args.reuse is None else args.days + 1, args.days + 1):
        for host, scenario in HOSTS.items():
            subprocess.run([str(REPO / "sim" / "bin" / "gpufleet-sim"), "clock", "--set", str(day)], check=True,
                           capture_output=True, env=dict(env, GPUFLEET_SIM_NODE=host, GPUFLEET_SIM_STATE=str(
                               root / "state" / host), GPUFLEET_SIM_SCENARIO=scenario))
        proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "playbooks/audit.yml", "-i",
                               str(inv), "-e", extra], cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stdout[-3000:] + proc.stderr[-2000:])
        print("day %d audited" % day, flush=True)
    html = Path(args.reuse or root / "reports") / "latest" / "report.html"
    # The picture is the leaking node's card.
    out = photograph_report(html, "main > *:not(#nodes), #nodes > h2, .nodecard:not([data-host=leak01])", args.out,
                            args.height, root)
    print("wrote %s (report: %s)" % (out, html))
    return 0


if __name__ == "__main__":
    sys.exit(main())
