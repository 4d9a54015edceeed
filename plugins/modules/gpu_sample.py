#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_sample
short_description: Sample GPU temperature, power, PCIe link and throttling with nvidia-smi while a load runs
description:
  - Runs C(nvidia-smi --query-gpu) every O(interval) seconds for O(duration) seconds and returns every sample plus a
    per-GPU summary. Meant to run with C(async) next to a burn-in or NCCL test, because the PCIe link drops its
    generation at idle and throttling only shows under load.
  - The minimum PCIe generation and width are taken only from samples where the GPU's utilisation was at least
    O(load_threshold_pct), so an idle link at gen 1 is not mistaken for a degraded riser.
  - Stops early and returns what it has when the GPUs become unreadable (a lost GPU, nvidia-smi failing or hanging);
    the reason is in RV(stop_reason) and RV(problems).
  - Judgement (what temperature or link is acceptable) is left to the rules layer.
version_added: "0.1.0"
author:
  - kentino.gpufleet contributors
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - kentino.gpufleet.check_common
attributes:
  check_mode:
    support: full
    details: Read-only; check mode samples as a normal run does.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
options:
  duration:
    description:
      - Seconds to sample for (at least one sample is always taken).
    type: float
    default: 60
  interval:
    description:
      - Seconds between the starts of two samples.
    type: float
    default: 5
  temperature_threshold_c:
    description:
      - Temperature above which time is counted in RV(per_gpu[].seconds_above_threshold_s).
    type: int
    default: 85
  load_threshold_pct:
    description:
      - GPU utilisation (percent) from which a sample counts as under load for the PCIe minimums.
    type: int
    default: 50
  stop_file:
    description:
      - Stop sampling (normally, not early) as soon as this file exists, and delete it. The burn-in playbook touches
        it when the burn ends, so the samples cover exactly the load window whatever the burn's real length.
    type: path
notes:
  - O(executable) defaults to C(nvidia-smi) on E(PATH).
  - O(timeout) applies to each nvidia-smi call and defaults to 30 seconds; a call that times out ends the sampling.
seealso:
  - module: kentino.gpufleet.gpu_facts
"""

EXAMPLES = r"""
- name: Sample the GPUs while gpu_burn runs
  kentino.gpufleet.gpu_sample:
    duration: 600
    interval: 5
  async: 700
  poll: 0
  register: __gpufleet_sampler

- name: Burn
  kentino.gpufleet.gpu_burn:
    duration: 600
  register: gpufleet_result_gpu_burn

- name: Collect the samples
  ansible.builtin.async_status:
    jid: "{{ __gpufleet_sampler.ansible_job_id }}"
  register: gpufleet_result_samples
  until: gpufleet_result_samples.finished
  retries: 30
  delay: 10

- name: Short sample with a stricter thermal threshold
  kentino.gpufleet.gpu_sample:
    duration: 30
    interval: 1
    temperature_threshold_c: 83
    load_threshold_pct: 80
"""

RETURN = r"""
samples:
  description:
    - One entry per sample; t_s is seconds since the first sample. Each GPU has index, pci, temperature_c, power_w,
      pcie_gen_current, pcie_width_current, utilization_gpu_pct, throttle_reasons (list), memory_used_mib (null
      when not reported).
  returned: always
  type: list
  elements: dict
  sample:
    - t_s: 0.0
      gpus:
        - {index: 0, pci: "0000:18:00", temperature_c: 71, power_w: 651.0, pcie_gen_current: 5,
           pcie_width_current: 16, utilization_gpu_pct: 100, throttle_reasons: [], memory_used_mib: 70001}
per_gpu:
  description: Summary per GPU over all samples.
  returned: always
  type: list
  elements: dict
  sample:
    - {index: 2, pci: "0000:3a:00", max_temperature_c: 79, seconds_above_threshold_s: 0.0, temperature_threshold_c: 85,
       min_pcie_gen_under_load: 3, min_pcie_width_under_load: 16, loaded_samples: 11,
       throttle_reasons_seen: [], samples: 12, max_power_w: 655.0}
  contains:
    index:
      description: GPU index as nvidia-smi numbers it.
      type: int
    pci:
      description: PCI address, lowercase V(dddd:bb:dd).
      type: str
    max_temperature_c:
      description: Highest temperature seen.
      type: int
    max_power_w:
      description: Highest power draw seen; null when not reported.
      type: float
    seconds_above_threshold_s:
      description: Time spent above O(temperature_threshold_c).
      type: float
    temperature_threshold_c:
      description: The threshold used (O(temperature_threshold_c) echoed).
      type: int
    min_pcie_gen_under_load:
      description: Lowest PCIe generation in samples at or above O(load_threshold_pct); null when no sample was loaded.
      type: int
    min_pcie_width_under_load:
      description: Lowest PCIe link width in samples at or above O(load_threshold_pct); null when no sample was loaded.
      type: int
    loaded_samples:
      description: Samples at or above O(load_threshold_pct).
      type: int
    throttle_reasons_seen:
      description: Sorted union of the active throttle reasons, without V(gpu_idle).
      type: list
      elements: str
    samples:
      description: How many samples read the GPU.
      type: int
problems:
  description:
    - What could not be read, as in M(kentino.gpufleet.gpu_facts) (kind V(lost), V(unreadable_field),
      V(unparsable_output), V(tool_error), V(tool_missing); pci, index; raw message).
  returned: always
  type: list
  elements: dict
stopped_early:
  description: True when sampling ended before O(duration) because the GPUs became unreadable.
  returned: always
  type: bool
stop_reason:
  description: Why sampling stopped early, naming the GPU where known; null otherwise.
  returned: always
  type: str
duration_s:
  description: Seconds actually spent sampling.
  returned: always
  type: float
interval_s:
  description: The interval used.
  returned: always
  type: float
nvidia_smi:
  description: Evidence; call_count, rejected_fields, and the tool dicts of the field-resolution and failing calls.
  returned: always
  type: dict
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import check_argument_spec, resolve_timeout
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import (
    SAMPLE_SPEC,
    QueryGpu,
    gpu_problem,
    public_problems,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool

SAMPLE_KEYS = [key for key, _candidates in SAMPLE_SPEC]
MAX_EVIDENCE_CALLS = 20


def _gpu_key(gpu):
    return gpu.get("pci") or "index:%s" % gpu.get("index")


def summarize(samples, interval, temperature_threshold_c, load_threshold_pct):
    """Per-GPU summary of the samples (pure: unit-tested directly)."""
    summary = {}
    order = []
    for i, sample in enumerate(samples):
        # Each sample stands for the time until the next one; the last for one interval.
        span = (samples[i + 1]["t_s"] - sample["t_s"]) if i + 1 < len(samples) else interval
        for gpu in sample["gpus"]:
            key = _gpu_key(gpu)
            if key not in summary:
                order.append(key)
                summary[key] = {"index": gpu.get("index"), "pci": gpu.get("pci"), "max_temperature_c": None,
                                "max_power_w": None, "seconds_above_threshold_s": 0.0,
                                "temperature_threshold_c": temperature_threshold_c, "min_pcie_gen_under_load": None,
                                "min_pcie_width_under_load": None, "loaded_samples": 0, "throttle_reasons_seen": [],
                                "samples": 0}
            entry = summary[key]
            entry["samples"] += 1
            temp = gpu.get("temperature_c")
            if temp is not None:
                entry["max_temperature_c"] = temp if entry["max_temperature_c"] is None else max(entry["max_temperature_c"], temp)
                if temp > temperature_threshold_c:
                    entry["seconds_above_threshold_s"] = round(entry["seconds_above_threshold_s"] + span, 3)
            power = gpu.get("power_w")
            if power is not None:
                entry["max_power_w"] = power if entry["max_power_w"] is None else max(entry["max_power_w"], power)
            util = gpu.get("utilization_gpu_pct")
            if util is not None and util >= load_threshold_pct:
                entry["loaded_samples"] += 1
                for field, out in (("pcie_gen_current", "min_pcie_gen_under_load"),
                                   ("pcie_width_current", "min_pcie_width_under_load")):
                    value = gpu.get(field)
                    if value is not None:
                        entry[out] = value if entry[out] is None else min(entry[out], value)
            for reason in gpu.get("throttle_reasons") or []:
                if reason != "gpu_idle" and reason not in entry["throttle_reasons_seen"]:
                    entry["throttle_reasons_seen"].append(reason)
    for entry in summary.values():
        entry["throttle_reasons_seen"].sort()
    return [summary[key] for key in order]


def _stop_reason(answer, first_count):
    """Why this sample ends the run, or None while the GPUs are still readable."""
    lost = [p for p in answer["problems"] if p["kind"] == "lost"]
    if lost:
        names = [p["pci"] or "index %s" % p.get("index") for p in lost]
        return "GPU %s became unreadable (lost): %s" % (", ".join(names), lost[0]["message"])
    errors = [p for p in answer["problems"] if p["kind"] == "tool_error"]
    if errors:
        return "nvidia-smi failed: %s" % errors[0]["message"]
    junk = [p for p in answer["problems"] if p["kind"] == "unparsable_output"]
    if junk and not answer["gpus"]:
        return "nvidia-smi printed lines that are not rows of the query: %s" % junk[0]["message"]
    if not answer["gpus"]:
        return "nvidia-smi returned no GPU rows"
    if first_count is not None and len(answer["gpus"]) < first_count:
        return "only %d of %d GPUs answered" % (len(answer["gpus"]), first_count)
    return None


def _wait_or_stop(until, stop_file):
    """Sleep until the monotonic time `until`; True as soon as stop_file exists (checked every 0.2 s)."""
    while True:
        if stop_file and os.path.exists(stop_file):
            try:
                os.unlink(stop_file)  # consumed: a later sampling with the same name must not stop at once
            except OSError:
                pass
            return True
        left = until - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, 0.2))


def main():
    module = AnsibleModule(
        argument_spec=check_argument_spec(
            duration=dict(type="float", default=60),
            interval=dict(type="float", default=5),
            temperature_threshold_c=dict(type="int", default=85),
            load_threshold_pct=dict(type="int", default=50),
            stop_file=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    resolve_timeout(module, 30)
    for name in ("duration", "interval"):
        if p[name] <= 0:
            module.fail_json(msg="%s must be a positive number of seconds, got %s" % (name, p[name]))
    result = {"changed": False, "samples": [], "per_gpu": [], "problems": [], "stopped_early": False,
              "stop_reason": None, "duration_s": 0.0, "interval_s": p["interval"],
              "nvidia_smi": {"call_count": 0, "rejected_fields": [], "calls": []}}
    executable = find_tool(module, "nvidia-smi", p["executable"])
    if executable is None:
        result["problems"].append(gpu_problem("tool_missing", "install the NVIDIA driver (nvidia-smi not found %s)"
                                              % ("at " + p["executable"] if p["executable"] else "on PATH")))
        result["stopped_early"] = True
        result["stop_reason"] = "nvidia-smi not found"
        module.exit_json(**result)

    query = QueryGpu(executable, SAMPLE_SPEC, p["timeout"])
    problems = []
    first_count = None
    started = time.monotonic()
    tick = 0
    seen_calls = 0
    while tick == 0 or tick * p["interval"] < p["duration"]:
        if tick and _wait_or_stop(started + tick * p["interval"], p["stop_file"]):
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
        if answer["gpus"]:
            gpus = [dict((key, row.get(key)) for key in SAMPLE_KEYS) for row in answer["gpus"]]
            result["samples"].append({"t_s": t_s, "gpus": gpus})
        reason = _stop_reason(answer, first_count)
        if reason is not None:
            result["stopped_early"] = True
            result["stop_reason"] = reason
            break
        if first_count is None:
            first_count = len(answer["gpus"])
        tick += 1
    result["duration_s"] = round(time.monotonic() - started, 3)
    result["problems"] = public_problems(problems)
    result["per_gpu"] = summarize(result["samples"], p["interval"], p["temperature_threshold_c"], p["load_threshold_pct"])
    result["nvidia_smi"]["call_count"] = len(query.calls)
    result["nvidia_smi"]["rejected_fields"] = list(query.rejected)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
