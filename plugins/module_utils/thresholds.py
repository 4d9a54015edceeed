# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Every threshold the judges use: name, default, type and where the number comes from (stdlib only).

The names are the inventory variables (per group or host). The fleet report reads them from each node's hostvars and
checks their types with check_value(); modules take the same numbers as options and pass them to the same judges.
docs/rules.md is generated from this table (hack/gen_rules_doc.py), so the documentation cannot drift.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math

from ansible_collections.kentino.gpufleet.plugins.module_utils.xid_catalog import SEVERITIES

DEFAULT_ENV_EXPECTED = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000"}

# name -> (default, kind, meaning, source). kind: number, int, fraction, list_int, list_str, rails, gbps_map,
# str_map, int_map, str, choice:<a|b>.
THRESHOLDS = {
    "gpufleet_expected_gpus": (
        None, "int", "GPUs the node must show; fewer = a GPU is missing (unset: the NVIDIA GPUs on the PCI bus)",
        "your build sheet"),
    "gpufleet_psu_rails": (
        {}, "rails", "PSU rail -> GPU indices it feeds, e.g. {A: [0,1,2,3], B: [4,5,6,7]}",
        "the node's wiring; split ATX rails are the consumer builds' norm (docs/failure-modes.md)"),
    "gpufleet_psu_loss_window_s": (
        5.0, "number", "GPUs of one rail lost within this many seconds = that PSU",
        "a rail drop takes its GPUs within milliseconds; 5 s leaves room for log timestamp jitter"),
    "gpufleet_lost_xids": ([79], "list_int", "XIDs meaning the GPU fell off the bus", "NVIDIA XID catalog"),
    "gpufleet_rma_xids": (
        [48, 63, 64], "list_int", "XIDs that mean replace the card (RMA)",
        "NVIDIA XID catalog: double-bit ECC, page retirement / row remap, remap failure"),
    "gpufleet_ecc_leak_xids": ([92], "list_int", "XIDs of a slow single-bit ECC leak (warn)",
                               "NVIDIA XID catalog: excessive single-bit ECC rate"),
    "gpufleet_xid_severity_overrides": (
        {}, "xid_severities", "XID code -> severity (critical, warning, info, unknown) replacing the catalog default, "
        "for the report, the nodes' XID reads, the XID watcher's metrics and so the alerts", "your site policy"),
    "gpufleet_retired_pages_rma": (
        58, "int", "retired pages (SBE+DBE) at which the card is near the 64-page limit",
        "NVIDIA: pre-Ampere cards retire at most 64 pages"),
    "gpufleet_remapped_rows_rma": (
        460, "int", "uncorrectable remapped rows near the 512-remap limit",
        "NVIDIA: Ampere+ cards remap at most 512 rows per framebuffer"),
    "gpufleet_ecc_corrected_rise": (1, "int", "rise of volatile corrected ECC during the run that warns",
                                    "any rise under load is a leak in progress"),
    "gpufleet_temp_max_c": (85.0, "number", "GPU temperature limit, C",
                            "operators page on > 85 C for 5 minutes (docs/failure-modes.md)"),
    "gpufleet_temp_sustained_s": (300.0, "number", "seconds above the limit that fail", "5 minutes"),
    "gpufleet_load_util_min_pct": (50.0, "number", "utilisation from which a sample counts as under load",
                                   "below it the PCIe link may be legitimately downclocked"),
    "gpufleet_nccl_min_busbw_gbps": (
        None, "number", "NCCL busbw floor for this host/group, GB/s (overrides the model reference)",
        "your own burn-in of a known-good node of the platform"),
    "gpufleet_nccl_min_busbw_fraction": (0.7, "fraction", "share of the model's reference busbw required",
                                         "leaves room for platform variance"),
    "gpufleet_nccl_reference_busbw_gbps": ({}, "gbps_map", "extra/overriding references: GPU name substring -> GB/s",
                                           "your platform's measured baseline"),
    "gpufleet_busy_gpu_severity": ("warn", "choice:warn|fail", "severity of a GPU running someone else's process",
                                   "a neighbour process is the usual cause of CUDA OOM"),
    "gpufleet_busy_ignore_processes": ([], "list_str", "process names that do not make a GPU busy",
                                       "e.g. a display server on a workstation"),
    "gpufleet_storage_min_free_inodes": (10000, "int", "fewer free inodes in the checkpoint filesystem fail",
                                         "sharded checkpoints write thousands of files"),
    "gpufleet_storage_margin_pct": (10.0, "number", "free space required on top of keep x checkpoint size, %",
                                    "filesystems slow down and fragment when nearly full"),
    "gpufleet_storage_max_overhead_pct": (5.0, "number", "checkpoint time as % of the interval that warns",
                                          "a checkpoint should cost well under 1% (docs/failure-modes.md)"),
    "gpufleet_storage_wear_warn_pct": (80, "int", "NVMe percentage used (endurance consumed) that warns",
                                       "NVMe spec: 100 = rated endurance reached"),
    "gpufleet_dryrun_slow_rank_factor": (2.0, "number", "a rank slower than this many times its peers' median warns",
                                         "a straggler slows every collective of a real job"),
    "gpufleet_env_expected": (
        DEFAULT_ENV_EXPECTED, "str_map", "training environment variable -> required value (login shell)",
        "PyTorch: async error handling aborts a hung collective; the trace buffer feeds the post-mortem"),
    # The checkpoint plan of the report (plugins/plugin_utils/cadence.py, docs/training.md): fleet figures, not limits.
    "gpufleet_failure_gpu_hours": (
        50000.0, "number", "GPU-hours per job interruption for the checkpoint plan (set it, or the audit history's "
        "own rate is used when there is one)",
        "Llama 3 405B training (arXiv:2407.21783): 419 interruptions in 54 days on 16,384 GPUs"),
    "gpufleet_restart_min": (2.0, "number", "minutes one restart costs besides the lost work (rendezvous, start, load)",
                             "torchelastic restarts a job from its checkpoint in one to two minutes"),
    "gpufleet_gpu_hour_price": (None, "number", "price of one GPU-hour, to show the cost of lost work (unset: GPU-hours)",
                                "your amortised hardware and power cost, or the cloud price"),
    "gpufleet_cadence_gpus": (None, "int", "GPUs of the training job for the checkpoint plan (unset: the report's GPUs)",
                              "the job's size"),
    # History (audits): trends, drift and baselines, judged from the history store (docs/audit.md).
    "gpufleet_trend_window_days": (14.0, "number", "days of history before the recent window that trends compare with",
                                   "two weeks: a weekly XID 92 shows at least twice"),
    "gpufleet_trend_recent_days": (3.0, "number", "the recent window of a trend, days",
                                   "three nightly audits: one noisy night does not make a trend"),
    "gpufleet_trend_acceleration_factor": (
        3.0, "number", "recent rate >= this x the earlier rate = accelerating (corrected ECC, XID 92)",
        "the slow ECC leak goes weekly -> daily -> hourly (docs/failure-modes.md)"),
    "gpufleet_trend_ecc_rate_warn_per_day": (
        10.0, "number", "corrected ECC errors per day (lifetime counter) that warn; also the floor of an acceleration",
        "a healthy card corrects a handful of errors per month; tens per day is a leak"),
    "gpufleet_trend_xid92_min_events": (3, "int", "XID 92 events on one GPU before their rate is judged",
                                        "two events make one gap, not a trend"),
    "gpufleet_trend_exhaustion_days": (
        30.0, "number", "retired pages / remapped rows projected to reach NVIDIA's limit within this many days warn",
        "NVIDIA GPU memory error management: 64 retired pages; 512 remaps, 8 per bank"),
    "gpufleet_trend_temp_rise_c": (8.0, "number", "rise of the GPU temperature at equal load (same power band), C",
                                   "dust, a failing fan or dried thermal paste show as degrees at the same watts"),
    "gpufleet_trend_pcie_replays_per_day": (100.0, "number", "PCIe replays per day that warn",
                                            "replays grow on a marginal riser or slot long before the link drops"),
    "gpufleet_history_stale_days": (2.0, "number", "an unreachable node without a passing run for this many days is "
                                                   "stale", "nightly audits: two missed nights"),
    "gpufleet_baseline_max_drop": (
        0.15, "fraction", "a figure this share below the node's own burn-in baseline warns (Gflop/s, busbw, write speed)",
        "run-to-run spread of gpu-burn and nccl-tests on one healthy node is a few percent"),
    "gpufleet_drift_group": (None, "str", "the group whose majority a node's versions are compared with (unset: its "
                                          "GPU model)", "your platform groups (one per SKU and build)"),
    "gpufleet_drift_min_nodes": (3, "int", "nodes a group needs before its majority version is the reference",
                                 "with two nodes there is no majority"),
    "gpufleet_golden_versions": (
        {}, "str_map", "pinned versions: driver, vbios, dcgm, kernel, bios, inforom -> the exact version required",
        "your qualified software/firmware set"),
    "gpufleet_nvlink_crc_fail_per_s": (
        100.0, "number", "NVLink CRC errors per second on one link during the run that fail (any rise below warns)",
        "NVIDIA DCGM health watch: CRC errors only matter at 100 per second and above (dcgm_gpu_hardware_limits.h)"),
    "gpufleet_nvlink_replay_recovery_fail": (
        1, "int", "rise of NVLink replay + recovery errors on one link during the run that fails",
        "NVIDIA DCGM health watch: any replay or recovery error is a failure"),
    "gpufleet_nvlink_min_link_speed_gbps": (
        None, "number", "an NVLink slower than this, GB/s, fails (unset: the node's fastest link of the same GPU model)",
        "nvidia-smi nvlink -s of a known-good node: H100 SXM 26.562, A100 SXM 25, B200 53.125 per link"),
    "gpufleet_nvlink_links_per_gpu": (
        None, "int", "NVLinks each GPU must list (unset: the most any GPU of the same model on the node lists)",
        "the platform: HGX H100/H200 and B200 have 18 per GPU, HGX A100 12"),
}
DEFAULTS = dict((name, spec[0]) for name, spec in THRESHOLDS.items())

TYPE_WORDS = {
    "number": "a number >= 0 (e.g. 85)",
    "int": "an integer >= 0 (e.g. 8)",
    "fraction": "a number in (0, 1] (e.g. 0.7)",
    "list_int": "a list of integers (e.g. [48, 63, 64])",
    "list_str": "a list of strings",
    "rails": "a mapping of rail name to a list of GPU indices (e.g. {A: [0, 1, 2, 3], B: [4, 5, 6, 7]})",
    "gbps_map": "a mapping of GPU name to GB/s (e.g. {'RTX 5090': 50})",
    "str_map": "a mapping of names to string values",
    "str": "a non-empty string",
    "xid_severities": "a mapping of XID code to critical, warning, info or unknown (e.g. {'13': 'critical'})",
}


def _is_number(value):
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float (a YAML typo of 400 digits) is not a usable number
        return False


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _from_text(raw):
    """A number written as text (INI inventories and `-e key=value` give strings): "85" -> 85.0; "85C" stays text."""
    if isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            return raw
        if math.isfinite(value):
            return int(value) if value.is_integer() and "." not in raw else value
    return raw


def check_value(kind, raw):
    """(ok, normalised value) for a raw inventory value of the given kind. Numbers written as text are read as
    numbers; anything else of the wrong type is reported, never guessed."""
    if kind in ("number", "int", "fraction"):
        raw = _from_text(raw)
    if kind == "number":
        return (_is_number(raw) and raw >= 0), (float(raw) if _is_number(raw) else None)
    if kind == "int":
        ok = _is_int(raw) or (_is_number(raw) and float(raw).is_integer())
        return (ok and raw >= 0), (int(raw) if ok else None)
    if kind == "fraction":
        return (_is_number(raw) and 0 < raw <= 1), (float(raw) if _is_number(raw) else None)
    if kind == "list_int":
        ok = isinstance(raw, (list, tuple)) and all(_is_int(x) for x in raw)
        return ok, (list(raw) if ok else None)
    if kind == "list_str":
        ok = isinstance(raw, (list, tuple)) and all(isinstance(x, str) for x in raw)
        return ok, (list(raw) if ok else None)
    if kind == "rails":
        ok = isinstance(raw, dict) and all(
            isinstance(v, (list, tuple)) and v and all(_is_int(x) for x in v) for v in raw.values())
        return ok, (dict((str(k), list(v)) for k, v in raw.items()) if ok else None)
    if kind == "gbps_map":
        ok = isinstance(raw, dict) and all(_is_number(v) and v > 0 for v in raw.values())
        return ok, (dict((str(k), float(v)) for k, v in raw.items()) if ok else None)
    if kind == "str_map":
        ok = isinstance(raw, dict) and all(isinstance(v, (str, int)) and not isinstance(v, bool) or v is None
                                           for v in raw.values())
        return ok, (dict((str(k), None if v is None else str(v)) for k, v in raw.items()) if ok else None)
    if kind == "str":
        return isinstance(raw, str) and raw.strip() != "", raw
    if kind == "xid_severities":
        ok = isinstance(raw, dict) and all(str(k).strip().isdigit() and v in SEVERITIES for k, v in raw.items())
        return ok, (dict((str(k).strip(), v) for k, v in raw.items()) if ok else None)
    if kind.startswith("choice:"):
        return raw in kind.split(":", 1)[1].split("|"), raw
    return False, None


def expected_words(kind):
    return TYPE_WORDS.get(kind) or "one of " + ", ".join(kind.split(":", 1)[1].split("|"))


def resolve(values, host="this node"):
    """(thresholds, sources, errors) from a mapping that may hold any of THRESHOLDS' names.

    A value of the wrong type keeps the default and yields an error naming the host, the variable, the expected type
    and what was found: the run goes on and the node shows the error.
    """
    thresholds = dict(DEFAULTS)
    sources = dict((name, "default") for name in DEFAULTS)
    errors = []
    for name, (_default, kind, _meaning, _source) in THRESHOLDS.items():
        raw = values.get(name)
        if raw is None:
            continue
        ok, value = check_value(kind, raw)
        if ok:
            thresholds[name] = value
            sources[name] = "inventory %s" % name
        else:
            errors.append("host %s: %s must be %s, got %s %r; fix it in host_vars/group_vars (the default %r is used "
                          "meanwhile; docs/rules.md)" % (host, name, expected_words(kind), type(raw).__name__, raw,
                                                          DEFAULTS[name]))
    return thresholds, sources, errors
