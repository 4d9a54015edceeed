#!/usr/bin/env python3
"""What a long burn's nvidia-smi sampling costs to carry to the controller, whole and as judge_samples.compact returns
it: JSON size, and the controller's CPU to read it (json.loads), check it against the schema and judge it.

One synthetic run of --hours at --interval seconds on --gpus GPUs (a hot spell with thermal throttling on one GPU, a
degraded link on another, corrected ECC rising, an idle sample every 100), built in this process. Printed: the samples,
the JSON size whole and compact and their ratio, the node's CPU for compact(), the controller's CPU for each, and
whether both judge the same (they must). Last line: `sampling_result whole_mb=<x> compact_mb=<y> ratio=<z>`.

Usage: bench/sampling_result.py [--hours 24] [--interval 5] [--gpus 8]
"""

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_samples  # noqa: E402
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete  # noqa: E402
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import schema_errors  # noqa: E402


def row(index, i, n):
    idle = i % 100 == 0
    hot = index == 1 and n // 2 <= i < n // 2 + 80
    return {"index": index, "pci": "0000:%02x:00" % (0x18 + index), "temperature_c": 91 if hot else 70 + i % 7,
            "power_w": 80.0 if idle else 650.0, "pcie_gen_current": 1 if idle else (3 if index == 2 else 5),
            "pcie_width_current": 16, "utilization_gpu_pct": 0 if idle else 100,
            "throttle_reasons": ["sw_thermal_slowdown"] if hot and i % 3 == 0 else [], "memory_used_mib": 70001,
            "pcie_gen_max": 5, "pcie_width_max": 16, "ecc_volatile_corrected": i // 5000 if index == 1 else 0}


def controller(text, t):
    """What the report does with the result: read it, check its shape, judge it. (CPU s, findings)"""
    start = time.process_time()
    result = json.loads(text)
    errors = schema_errors("gpu_sample", dict(result, verdict="pass"))
    findings = judge_samples.judge(result, t, "gpu-node-01")
    judge_samples.figures(result, t)
    return time.process_time() - start, findings, errors


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args(argv)
    n = int(args.hours * 3600 / args.interval)
    t = complete({})
    whole = {"samples": [{"t_s": i * args.interval, "gpus": [row(g, i, n) for g in range(args.gpus)]}
                         for i in range(n)],
             "problems": [], "stopped_early": False, "stop_reason": None, "duration_s": n * args.interval,
             "interval_s": args.interval, "nvidia_smi": {}}
    whole["per_gpu"] = judge_samples.figures(whole, t)[0]
    start = time.process_time()
    small = judge_samples.compact(whole, t)
    node_cpu = time.process_time() - start
    whole_text, small_text = json.dumps(whole), json.dumps(small)
    whole_cpu, whole_findings, whole_errors = controller(whole_text, t)
    small_cpu, small_findings, small_errors = controller(small_text, t)
    same = whole_findings == small_findings and not whole_errors and not small_errors
    mb = 1024.0 * 1024.0
    print("samples                 %d of %d GPUs (%.1f h at %g s); returned compact: %d"
          % (n, args.gpus, args.hours, args.interval, len(small["samples"])))
    print("JSON                    whole %.1f MiB, compact %.2f MiB: %.0fx smaller"
          % (len(whole_text) / mb, len(small_text) / mb, len(whole_text) / float(len(small_text))))
    print("node CPU for compact()  %.2f s (the figures over every sample and the choice of the samples kept)" % node_cpu)
    print("controller CPU          whole %.2f s, compact %.3f s (read, schema, judge): %.0fx less"
          % (whole_cpu, small_cpu, whole_cpu / small_cpu if small_cpu else float("inf")))
    print("same findings           %s (%d findings: %s)" % ("yes" if same else "NO", len(small_findings),
                                                            ", ".join(sorted({f["code"] for f in small_findings}))))
    print("sampling_result whole_mb=%.1f compact_mb=%.2f ratio=%.0f" % (
        len(whole_text) / mb, len(small_text) / mb, len(whole_text) / float(len(small_text))))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
