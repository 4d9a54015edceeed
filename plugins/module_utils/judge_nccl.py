# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge an nccl_test result (all_reduce_perf): failures, wrong values, bus bandwidth against the platform floor.

The health figure is the bus bandwidth at the LARGEST message size (best of out-of-place and in-place): the tool's
own "Avg bus bandwidth" averages tiny latency-bound sizes in and says little. The floor is the inventory's
gpufleet_nccl_min_busbw_gbps, else the GPU model's single-node reference times gpufleet_nccl_min_busbw_fraction
(docs/rules.md lists the references and their public sources). Stdlib only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import could_not_run, fmt_size, judge_door

CHECK = "nccl_test"
# Why a node's NCCL stage does not run on a node with a single GPU (roles/gpufleet/tasks/stage_nccl.yml says it first):
# nothing to check there, not a check left out.
ONE_GPU = "one GPU on this node"
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads: what a module passes it.
THRESHOLDS = ("gpufleet_nccl_min_busbw_gbps", "gpufleet_nccl_min_busbw_fraction", "gpufleet_nccl_reference_busbw_gbps")

CODES = {
    "NCCL_FAIL": ("fail", "a `Test CUDA/NCCL failure` line, or a non-zero exit after results"),
    "NCCL_WRONG_VALUES": ("fail", "wrong values, out-of-bounds values or bitwise mismatches: data corrupted between GPUs"),
    "NCCL_NO_FIGURE": ("error", "no result rows, no bus bandwidth at the largest size, or a run on one GPU (an "
                                "all_reduce on one GPU moves nothing between GPUs): nothing measured"),
    "NCCL_BUSBW_LOW": ("fail", "busbw at the largest size below the floor (or 0): the figure, floor and its source shown"),
    "NCCL_NO_BASELINE": ("warn", "no floor for this GPU model: set gpufleet_nccl_min_busbw_gbps"),
    "NCCL_INCOMPLETE": ("warn", "the sweep ended before maxBytes or before the footer"),
    "NCCL_UNVALIDATED": ("warn", "data validation was off (#wrong is N/A)"),
}

# Single-node all_reduce busbw references, GB/s, matched as a case-insensitive substring of the GPU name, longest key
# first. Datacenter SXM figures from NVIDIA's published nccl-tests results; PCIe consumer cards depend on the
# platform (risers, PCIe switches, CPU root ports): measure your own and set it per group.
REFERENCE_BUSBW_GBPS = {
    "H200": 480.0,
    "H100": 370.0,
    "A100": 230.0,
    "L40S": 40.0,
    "RTX 5090": 50.0,
    "RTX 4090": 25.0,
}


# The interconnect each built-in reference was measured on: an SXM figure says nothing about the same GPU model on
# PCIe (H100 PCIe cards, or an HGX whose fabric is down), and a PCIe figure nothing about an NVSwitch baseboard.
REFERENCE_TOPOLOGY = {
    "H200": "nvswitch",
    "H100": "nvswitch",
    "A100": "nvswitch",
    "L40S": "pcie",
    "RTX 5090": "pcie",
    "RTX 4090": "pcie",
}


def _split_key(key):
    """"H100@pcie" -> ("H100", "pcie"); "H100" -> ("H100", None)."""
    name, sep, topology = str(key).partition("@")
    return name, (topology.strip().lower() or None) if sep else None


def threshold(gpu_names, t, sources=None, topology=None):
    """(min_busbw_gbps or None, where it came from). topology: the node's interconnect (nvswitch, nvlink, pcie, mixed)
    or None when unknown; a reference applies only to the interconnect it was measured on (overrides may name one:
    "H100@pcie"; a key without "@" applies to any)."""
    sources = sources or {}
    explicit = t.get("gpufleet_nccl_min_busbw_gbps")
    if explicit is not None:
        return float(explicit), sources.get("gpufleet_nccl_min_busbw_gbps", "gpufleet_nccl_min_busbw_gbps")
    overrides = t.get("gpufleet_nccl_reference_busbw_gbps") or {}
    fraction = t.get("gpufleet_nccl_min_busbw_fraction") or 0.7
    names = [n for n in gpu_names if n]
    table = dict((key, (value, REFERENCE_TOPOLOGY.get(key), "built-in")) for key, value in REFERENCE_BUSBW_GBPS.items())
    table.update((key, (value, _split_key(key)[1], "gpufleet_nccl_reference_busbw_gbps"))
                 for key, value in overrides.items())
    mismatch = None
    for key in sorted(table, key=lambda k: len(_split_key(k)[0]), reverse=True):
        value, measured_on, where = table[key]
        name = _split_key(key)[0]
        if not any(name.lower() in gpu.lower() for gpu in names):
            continue
        if topology and measured_on and measured_on != topology:
            mismatch = mismatch or (key, value, measured_on)
            continue
        on = " on %s" % measured_on if topology and measured_on else ""
        return round(value * fraction, 2), "%s reference for %s%s (%g GB/s) x %g" % (where, name, on, value, fraction)
    if mismatch:
        return None, ("the %s reference (%g GB/s) is for %s machines, this node's GPUs talk over %s: set "
                      "gpufleet_nccl_min_busbw_gbps, or gpufleet_nccl_reference_busbw_gbps {'%s@%s': <GB/s>}" % (
                          mismatch[0], mismatch[1], mismatch[2], topology, _split_key(mismatch[0])[0], topology))
    return None, "no reference for %s: set gpufleet_nccl_min_busbw_gbps for this group" % (
        names[0] if names else "an unknown GPU")


def _line(row):
    return row.get("line") or "size %s busbw oop %s ip %s" % (row.get("size_bytes"), row.get("oop_busbw_gbps"),
                                                              row.get("ip_busbw_gbps"))


def _next_step_exceeds(result, largest):
    # With -f F the last size is the biggest power step <= maxBytes, which can be below maxBytes.
    header = result.get("header") or {}
    factor = header.get("step_factor")
    return bool(factor and factor > 1 and largest * factor > header.get("max_bytes", 0))


@judge_door(CHECK)
def judge(result, t, host, gpu_names=None, sources=None, topology=None):
    """[finding] for one nccl_test result. gpu_names: the node's GPU models (else those in the tool's header)."""
    out = could_not_run(result, CHECK, host)
    if out or result.get("not_run"):
        return out
    rc = (result.get("tool") or {}).get("rc")
    rows = result.get("rows") or []
    failures = result.get("failures") or []
    fix = "fix what NCCL reports on %s (driver/CUDA/NCCL mismatch, a GPU in error), then rerun" % host
    if failures:
        more = " (and %d more failure lines)" % (len(failures) - 1) if len(failures) > 1 else ""
        out.append(finding("fail", "NCCL_FAIL", "%s: NCCL test failed: %s%s" % (host, failures[0], more), fix,
                           failures[:10]))
    if not rows:
        if not failures:
            out.append(finding("error", "NCCL_NO_FIGURE", "%s: all_reduce_perf printed no result rows (rc=%s): "
                               "nothing was measured" % (host, rc),
                               "rerun nccl_test on %s and read its output; no figure is not a pass" % host,
                               (result.get("unparsed") or {}).get("samples")))
        return out
    if rc not in (0, None):
        out.append(finding("fail", "NCCL_FAIL", "%s: all_reduce_perf exited with rc=%s after %d result rows" % (
            host, rc, len(rows)), fix, [_line(r) for r in rows[-2:]]))
    bad = [r for r in rows if (r.get("oop_wrong") or 0) or (r.get("ip_wrong") or 0)]
    if bad:
        out.append(finding("fail", "NCCL_WRONG_VALUES", "%s: %d wrong values in the collective results (sizes %s): "
                           "data corrupted between GPUs" % (host, result.get("wrong_values") or 0,
                                                            ", ".join(fmt_size(r.get("size_bytes")) for r in bad[:5])),
                           "check the links (NVLink/PCIe risers) of %s and rerun per GPU pair" % host,
                           [_line(r) for r in bad[:5]]))
    if result.get("out_of_bounds"):
        out.append(finding("fail", "NCCL_WRONG_VALUES", "%s: nccl-tests reports %d out-of-bounds values" % (
            host, result["out_of_bounds"]), "check the links of %s and rerun per GPU pair" % host,
            ["# Out of bounds values : %s %s" % (result["out_of_bounds"], result.get("out_of_bounds_status") or "")]))
    if result.get("bitwise_mismatches"):
        out.append(finding("fail", "NCCL_WRONG_VALUES", "%s: nccl-tests reports %d bitwise mismatches between "
                           "repeats" % (host, result["bitwise_mismatches"]),
                           "check the links of %s and rerun per GPU pair" % host,
                           ["# Bitwise mismatches : %s" % result["bitwise_mismatches"]]))
    if failures or rc not in (0, None):
        return out  # a failed run's bandwidth and truncation are consequences, not findings of their own
    out.extend(_bandwidth(result, rows, t, host, gpu_names, sources, topology))
    return out


def _bandwidth(result, rows, t, host, gpu_names, sources, topology=None):
    out = []
    names = list(gpu_names or []) or [g.get("name") for g in result.get("gpus") or [] if g.get("name")]
    floor, where = threshold(names, t, sources, topology)
    peak = result.get("peak_busbw_gbps")
    largest = result.get("largest_size_bytes")
    largest_lines = [_line(r) for r in rows if r.get("size_bytes") == largest]
    topology = ("check the topology and risers on %s: nvidia-smi topo -m, PCIe gen/width of each GPU under load, "
                "reseat/replace the riser of the slow link" % host)
    ranks = len(result.get("gpus") or [])
    if peak is None:
        out.append(finding("error", "NCCL_NO_FIGURE", "%s: no bus bandwidth could be read at the largest size (%s)"
                           % (host, fmt_size(largest or 0)), "rerun nccl_test on %s and read its output" % host,
                           largest_lines))
    elif ranks == 1 and peak <= 0:
        out.append(finding("error", "NCCL_NO_FIGURE", "%s: all_reduce_perf ran on one GPU: a collective on one GPU "
                           "moves nothing between GPUs, so its 0 GB/s measures nothing" % host,
                           "run it over every GPU of %s (gpus_per_process: the GPU count nvidia-smi gives; fix "
                           "nvidia-smi first if it gave none); a node with one GPU has nothing to measure: the "
                           "burn-in skips it there" % host, largest_lines))
    elif peak <= 0:
        out.append(finding("fail", "NCCL_BUSBW_LOW", "%s: NCCL busbw %.1f GB/s at %s: nothing moved between the GPUs"
                           % (host, peak, fmt_size(largest)), topology, largest_lines))
    elif floor is None:
        out.append(finding("warn", "NCCL_NO_BASELINE", "%s: NCCL busbw %.1f GB/s, no threshold: %s" % (
            host, peak, where), "set gpufleet_nccl_min_busbw_gbps for this platform's group (burn in a known-good "
            "node first)", largest_lines))
    elif peak < floor:
        out.append(finding("fail", "NCCL_BUSBW_LOW", "%s: NCCL busbw %.1f GB/s < %.1f GB/s at %s (%s)" % (
            host, peak, floor, fmt_size(largest), where), topology, largest_lines))
    warn_action = "rerun nccl_test on %s with the full sweep (-b 8 -e 1G -f 2) and data validation" % host
    header = result.get("header") or {}
    max_bytes = header.get("max_bytes")
    if max_bytes and largest is not None and largest < max_bytes and not _next_step_exceeds(result, largest):
        out.append(finding("warn", "NCCL_INCOMPLETE", "%s: results stop at %s, before maxBytes %s: the run ended early"
                           % (host, fmt_size(largest), fmt_size(max_bytes)), warn_action, largest_lines))
    elif not result.get("concluded") and result.get("avg_busbw_gbps") is None:
        # Old nccl-tests print no "concluded" line, but every version prints the footer.
        out.append(finding("warn", "NCCL_INCOMPLETE", "%s: all_reduce_perf output ended before its footer" % host,
                           warn_action, largest_lines))
    if header.get("validation") == 0 or all(r.get("oop_wrong") is None and r.get("ip_wrong") is None for r in rows):
        out.append(finding("warn", "NCCL_UNVALIDATED", "%s: data validation was off (#wrong is N/A): corrupted "
                           "results would go unnoticed" % host, "run all_reduce_perf without -c 0", largest_lines))
    return out


def _no_figures():
    return {"busbw_gbps": None, "min_busbw_gbps": None, "threshold_source": "the result could not be read",
            "avg_busbw_gbps": None, "largest_size_bytes": None}


@judge_door(CHECK, empty=_no_figures)
def figures(result, t, gpu_names=None, sources=None, topology=None):
    """The figures the report shows beside the verdict: measured, threshold and where it came from."""
    names = list(gpu_names or []) or [g.get("name") for g in result.get("gpus") or [] if g.get("name")]
    floor, where = threshold(names, t, sources, topology)
    out = {"busbw_gbps": result.get("peak_busbw_gbps"), "min_busbw_gbps": floor, "threshold_source": where,
           "avg_busbw_gbps": result.get("avg_busbw_gbps"), "largest_size_bytes": result.get("largest_size_bytes")}
    if topology:
        out["interconnect"] = topology
    return out
