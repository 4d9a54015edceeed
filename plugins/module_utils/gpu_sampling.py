# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""nvidia-smi sampling beside a load (stdlib only: runs on the node).

One loop serves the standalone gpu_sample module (it stops at its duration or a stop file) and gpu_burn, which runs it
in a thread beside the burn and stops it when the burn ends: the samples then cover exactly the load window, with no
second job, stop-file task or wait for the controller to fan out over the fleet.

The result has gpu_sample's observation keys (samples, per_gpu, problems, stopped_early, stop_reason, duration_s,
interval_s, nvidia_smi); the caller adds the verdict of judge_samples. A long run returns judge_samples.compact's
result: the figures of every sample, and the samples the judge quotes and the chart needs, not all of them.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_samples
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import (
    SAMPLE_SPEC,
    QueryGpu,
    gpu_problem,
    public_problems,
)

SAMPLE_KEYS = [key for key, _candidates in SAMPLE_SPEC]
MAX_EVIDENCE_CALLS = 20
# nvidia-smi answering with no GPU at all this many times in a row ends the sampling (a lost GPU alone does not: the
# others are still sampled).
MAX_EMPTY_SAMPLES = 3


def thresholds(temp_max_c=85.0, temp_sustained_s=300.0, load_util_min_pct=50.0, ecc_corrected_rise=1):
    """The judge_samples thresholds from the modules' options."""
    return {"gpufleet_temp_max_c": float(temp_max_c), "gpufleet_temp_sustained_s": float(temp_sustained_s),
            "gpufleet_load_util_min_pct": float(load_util_min_pct),
            "gpufleet_ecc_corrected_rise": int(ecc_corrected_rise)}


def empty_result(interval):
    return {"samples": [], "per_gpu": [], "problems": [], "stopped_early": False, "stop_reason": None,
            "duration_s": 0.0, "interval_s": interval,
            "nvidia_smi": {"call_count": 0, "rejected_fields": [], "calls": []}}


def missing_tool_result(interval, executable=None):
    result = empty_result(interval)
    result["problems"].append(gpu_problem("tool_missing", "install the NVIDIA driver (nvidia-smi not found %s)"
                                          % ("at " + executable if executable else "on PATH")))
    result["stopped_early"] = True
    result["stop_reason"] = "nvidia-smi not found"
    return result


def _empty_reason(answer):
    errors = [p for p in answer["problems"] if p["kind"] in ("tool_error", "unparsable_output")]
    return "nvidia-smi failed: %s" % errors[0]["message"] if errors else "nvidia-smi returned no GPU rows"


def sample(executable, timeout, interval, duration, t, stop=None, lease=None):
    """Sample every `interval` s until `duration` s have passed (at least once) or stop() names a reason to end:
    'stop' ends normally (the load is over), any other text early (stopped_early with that text as the reason).
    The lease, when given, ends it early once the controller stopped waiting. Returns the observations."""
    result = empty_result(interval)
    query = QueryGpu(executable, SAMPLE_SPEC, timeout)
    problems = []
    empty = 0
    started = time.monotonic()
    tick = 0
    seen_calls = 0
    while tick == 0 or tick * interval < duration:
        if tick:
            why = _wait_or_stop(started + tick * interval, stop, lease)
            if why == "lease":
                result["stopped_early"], result["stop_reason"] = True, lease.reason()
                break
            if why == "stop":
                break
            if why:
                result["stopped_early"], result["stop_reason"] = True, why
                break
        t_s = round(time.monotonic() - started, 3)
        answer = query.run()
        # Keep the evidence of resolution and failures, not of every routine sample.
        new_calls = query.calls[seen_calls:]
        seen_calls = len(query.calls)
        if tick == 0 or answer["problems"]:
            room = MAX_EVIDENCE_CALLS - len(result["nvidia_smi"]["calls"])
            result["nvidia_smi"]["calls"].extend(new_calls[:max(room, 0)])
        problems.extend(answer["problems"])
        tick += 1
        if answer["gpus"]:
            empty = 0
            gpus = [dict((key, row.get(key)) for key in SAMPLE_KEYS) for row in answer["gpus"]]
            result["samples"].append({"t_s": t_s, "gpus": gpus})
            continue
        empty += 1
        if empty >= MAX_EMPTY_SAMPLES:
            result["stopped_early"], result["stop_reason"] = True, _empty_reason(answer)
            break
    result["duration_s"] = round(time.monotonic() - started, 3)
    result["problems"] = public_problems(problems)
    result["nvidia_smi"]["call_count"] = len(query.calls)
    result["nvidia_smi"]["rejected_fields"] = list(query.rejected)
    result = judge_samples.compact(result, t)
    # Of a compact result, figures() gives back the per_gpu compact() computed from every sample.
    result["per_gpu"] = judge_samples.figures(result, t)[0]
    return result


def _wait_or_stop(until, stop, lease):
    """Sleep until the monotonic time `until`. Returns why to stop: stop()'s text, 'lease', or None."""
    while True:
        why = stop() if stop is not None else None
        if why:
            return why
        if lease is not None and lease.expired():
            return "lease"
        left = until - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(left, 0.2))
