# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge a train_dryrun result: one training step on every local GPU with torchrun (stdlib only).

A failed step is explained most-specific first: CUDA out of memory (with the neighbour process when one holds the
GPU), a collective that timed out and the rank that never arrived (the ranks that REPORT a timeout were waiting for
it), the rank that failed first. A step that passed on every rank can still warn: a rank much slower than its peers
(a throttling GPU, a degraded PCIe link) is a straggler in every real step.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import statistics

from ansible_collections.kentino.gpufleet.plugins.module_utils.cuda_errors import NOT_READY, not_ready_action
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, lines
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import could_not_run, judge_door, unreadable

CHECK = "train_dryrun"
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads: what a module passes it.
THRESHOLDS = ("gpufleet_dryrun_slow_rank_factor",)

CODES = {
    "DRYRUN_FAIL": ("fail", "torchrun failed, a rank reported not ok, or ranks printed no result"),
    "DRYRUN_OOM": ("fail", "CUDA out of memory (with the neighbour process when one holds the GPU)"),
    "DRYRUN_NCCL_TIMEOUT": ("fail", "a collective timed out (op, sequence, ranks)"),
    "DRYRUN_CULPRIT": ("fail", "the rank that never arrived at the collective the others wait on"),
    "DRYRUN_SLOW_RANK": ("warn", "a rank slower than gpufleet_dryrun_slow_rank_factor x its peers' median"),
    "DRYRUN_FABRIC_NOT_READY": ("fail", "CUDA error 802 (system not yet initialized): on an NVSwitch machine the fabric "
                                        "manager is not running at the driver's version"),
}
OOM_REMEDIES = (
    "reduce the micro-batch size (or sequence length) per GPU",
    "enable gradient (activation) checkpointing",
    "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against allocator fragmentation",
    "check for a neighbour process on the same GPU (nvidia-smi shows two PIDs): stop the one that should be gone",
    "shard optimizer state (ZeRO/FSDP); a bigger GPU does not fix a growing activation footprint",
)


def _oom_detail(oom):
    detail = []
    if oom.get("tried_to_allocate_mib") is not None:
        detail.append("tried to allocate %.0f MiB" % oom["tried_to_allocate_mib"])
    if oom.get("free_mib") is not None:
        detail.append("%.0f MiB free" % oom["free_mib"])
    procs = oom.get("processes") or []
    if oom.get("neighbour_suspected") and len(procs) > 1:
        detail.append("%d processes hold memory on this GPU (pids %s): a neighbour process" % (
            len(procs), ",".join(str(p.get("pid")) for p in procs)))
    elif oom.get("neighbour_suspected"):
        detail.append("%.0f MiB held by other processes: a neighbour process (nvidia-smi shows its PID)"
                      % (oom.get("other_processes_mib") or 0))
    return "; ".join(detail) or "no detail"


def failure_findings(result, host):
    """Why the step failed, most specific first."""
    out = []
    watchdog = result.get("watchdog") or {}
    fix = "fix the training entrypoint or its environment on %s" % host
    for oom in result.get("oom") or []:
        where = "rank %s" % oom["rank"] if oom.get("rank") is not None else "a rank"
        gpu = " on GPU %s" % oom["gpu"] if oom.get("gpu") is not None else ""
        out.append(finding("fail", "DRYRUN_OOM", "%s: CUDA out of memory in %s%s (%s)" % (
            host, where, gpu, _oom_detail(oom)), "; ".join(OOM_REMEDIES[:4]), [oom.get("line")], gpu=oom.get("gpu")))
    timeouts = watchdog.get("timeouts") or []
    if timeouts:
        first = timeouts[0]
        ranks = sorted(set(x["rank"] for x in timeouts if x.get("rank") is not None))
        out.append(finding("fail", "DRYRUN_NCCL_TIMEOUT", "%s: collective %s (seq %s) timed out after %s ms on "
                           "rank(s) %s" % (host, first.get("op_type"), first.get("seq"), first.get("timeout_ms"),
                                           ",".join(str(r) for r in ranks) or "?"),
                           "find the rank that never arrived (below) and check its GPU and link",
                           [x.get("line") for x in timeouts[:4]]))
    culprit = watchdog.get("culprit")
    if culprit:
        out.append(finding("fail", "DRYRUN_CULPRIT", "%s: culprit: %s" % (host, culprit.get("reason")),
                           "inspect that rank's GPU (kentino.gpufleet.gpu_facts, xid_facts) and its PCIe/NVLink path; "
                           "the ranks that reported the timeout were waiting for it", [culprit.get("line")]))
    root = watchdog.get("root_cause")
    if root:
        what = ""
        if root.get("exception"):
            what = ": %s: %s" % (root["exception"].get("type"), root["exception"].get("message"))
        elif root.get("signal") == 6 and (timeouts or watchdog.get("terminate")):
            what = ": SIGABRT (the NCCL watchdog aborts the process on a timed-out or failed collective)"
        elif root.get("signal") == 6:
            what = ": SIGABRT (the process aborted itself: its last lines before the agent's summary say why)"
        elif root.get("signal"):
            what = ": killed by signal %d" % root["signal"]
        evidence = [x.get("line") for x in watchdog.get("terminate") or []][:2] or watchdog.get("evidence")
        out.append(finding("fail", "DRYRUN_FAIL", "%s: rank %s failed first (exitcode %s)%s" % (
            host, root.get("rank"), root.get("exitcode"), what), fix, evidence))
    return out


def _texts(result):
    watchdog = result.get("watchdog") or {}
    root = watchdog.get("root_cause") or {}
    texts = list(result.get("output_tail") or []) + list(watchdog.get("evidence") or [])
    texts.append(str((root.get("exception") or {}).get("message") or ""))
    for r in result.get("ranks") or []:
        texts += [str(e) for e in r.get("errors") or []] + [str(r.get("line") or "")]
    return [x for x in texts if isinstance(x, str)]


def fabric_not_ready(result, host):
    """[finding] when CUDA failed with error 802: the GPUs are not registered with the NVLink fabric (NVSwitch machine
    without a running fabric manager at the driver's version)."""
    matched = [x for x in _texts(result) if NOT_READY.search(x)]
    if not matched:
        return []
    return [finding("fail", "DRYRUN_FABRIC_NOT_READY", "%s: CUDA could not initialise (error 802, system not yet "
                    "initialized): the GPUs are not registered with the NVLink fabric" % host,
                    not_ready_action(host), matched[:6])]


@judge_door(CHECK)
def judge(result, t, host):
    """[finding] for one train_dryrun result. Threshold: gpufleet_dryrun_slow_rank_factor."""
    tool = result.get("tool") or {}
    if tool.get("timed_out"):
        out = could_not_run(result, CHECK, host)
        missing = result.get("missing_ranks") or []
        if missing and result.get("ranks"):
            out[0]["message"] += "; ranks %s never reported a result: look at those first" % (
                ",".join(str(r) for r in missing))
        # A hung run proves nothing (error, not fail): what the ranks said before the kill are clues, kept as the
        # error's evidence rather than failures of their own.
        clues = ["clue: %s" % f["message"] for f in failure_findings(result, host)]
        out[0]["evidence"] = lines(clues + out[0]["evidence"], 40)
        return out
    out = could_not_run(result, CHECK, host)
    if out or result.get("not_run"):
        return out
    rc = tool.get("rc")
    if rc is None:  # neither ran nor said why: no verdict, rather than "failed with rc None"
        return [unreadable(CHECK, host, "the result has no exit status of torchrun and no reason it did not run")]
    script = "the shipped dry-run script" if result.get("script") == "shipped" else result.get("entrypoint")
    fix = "fix the training entrypoint or its environment on %s" % host
    if rc != 0:
        out += fabric_not_ready(result, host)
        out.append(finding("fail", "DRYRUN_FAIL", "%s: torchrun exited with rc %s (%s ranks, %s)" % (
            host, rc, result.get("world_size"), script), fix,
            (result.get("watchdog") or {}).get("evidence") or (result.get("output_tail") or [])[-8:]))
        return out + failure_findings(result, host)
    out += fabric_not_ready(result, host)
    ranks = result.get("ranks") or []
    for r in ranks:
        if r.get("status") != "pass":
            out.append(finding("fail", "DRYRUN_FAIL", "%s: rank %s (%s %s): %s" % (
                host, r.get("rank"), r.get("device"), r.get("device_name"),
                "; ".join(r.get("errors") or []) or "reported not ok"), fix, [r.get("line")]))
    if result.get("missing_ranks"):
        out.append(finding("fail", "DRYRUN_FAIL", "%s: ranks %s printed no result although torchrun exited 0" % (
            host, ",".join(str(x) for x in result["missing_ranks"])), fix, (result.get("output_tail") or [])[-8:]))
    timed = [r for r in ranks if isinstance(r.get("step_time_s"), (int, float))]
    factor = t["gpufleet_dryrun_slow_rank_factor"]
    for r in timed if len(timed) >= 2 else []:
        # Median of the OTHER ranks: with 2 ranks the plain median would hide the slow one.
        median = statistics.median([x["step_time_s"] for x in timed if x is not r])
        if median > 0 and r["step_time_s"] > factor * median:
            out.append(finding("warn", "DRYRUN_SLOW_RANK", "%s: rank %s on %s %s took %.3f s for the step, %.1fx the "
                               "other ranks' median %.3f s" % (host, r["rank"], r.get("device"), r.get("device_name"),
                                                               r["step_time_s"], r["step_time_s"] / median, median),
                               "check that GPU's clocks/throttling and PCIe link under load", [r.get("line")]))
    return out
