#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_sample
short_description: Sample GPU temperature, power, PCIe link, throttling and ECC with nvidia-smi while a load runs
description:
  - Runs C(nvidia-smi --query-gpu) every O(interval) seconds for O(duration) seconds and returns every sample plus a
    per-GPU summary. Meant to run with C(async) next to a burn-in or NCCL test, because the PCIe link drops its
    generation at idle and throttling only shows under load.
  - Judges the samples (module_utils/judge_samples.py) with the thresholds given as options, the same function the
    fleet report runs with the inventory's thresholds. C(fail) when a GPU stays above O(temp_max_c) for
    O(temp_sustained_s) or its PCIe link never reaches its rated generation/width under load; C(warn) on thermal
    throttling or rising volatile corrected ECC; C(error) when no sample could be taken.
  - The PCIe link is judged only from samples where the GPU's utilisation was at least O(load_util_min_pct), and by
    the best link seen there, so an idle link at gen 1 or a momentary dip is not mistaken for a degraded riser.
  - A GPU that is lost during the run (RV(problems) kind C(lost)) keeps the samples taken before; the other GPUs are
    sampled for the whole duration. Sampling stops early after 3 samples in a row without any GPU (the driver gone,
    nvidia-smi failing), with the reason in RV(stop_reason).
  - Read-only; runs in check mode.
version_added: "0.1.0"
author:
  - kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.check_common
  - kentino.gpufleet.lease
  - kentino.gpufleet.thresholds
  - kentino.gpufleet.node_module
attributes:
  check_mode:
    support: full
    details: Read-only; check mode samples as a normal run does.
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
  temp_max_c:
    description:
      - GPU temperature limit in C; time above it is counted in RV(per_gpu[].seconds_above_limit_s) and judged with
        O(temp_sustained_s) (the inventory's C(gpufleet_temp_max_c) in the fleet report).
    type: float
    default: 85.0
    aliases: [temperature_threshold_c]
  temp_sustained_s:
    description: Seconds above O(temp_max_c) that make the verdict V(fail) (C(gpufleet_temp_sustained_s)).
    type: float
    default: 300.0
  load_util_min_pct:
    description:
      - GPU utilisation (percent) from which a sample counts as under load for the PCIe link
        (C(gpufleet_load_util_min_pct)).
    type: float
    default: 50.0
    aliases: [load_threshold_pct]
  ecc_corrected_rise:
    description: Rise of volatile corrected ECC errors during the sampling that warns (C(gpufleet_ecc_corrected_rise)).
    type: int
    default: 1
  stop_file:
    description:
      - Stop sampling (normally, not early) as soon as this file exists. The burn-in playbook creates it when the burn
        ends, so the samples cover exactly the load window whatever the burn's real length. The file is only read,
        never deleted (the run's directory goes with the run).
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
    temp_max_c: 83
    temp_sustained_s: 60
    load_util_min_pct: 80
"""

RETURN = r"""
verdict:
  description:
    - The node's own verdict, V(pass), V(warn), V(fail), V(error) or V(skipped), from this check's judge with the
      thresholds given as options. The fleet report judges the same observations again with the inventory's.
  returned: always
  type: str
  sample: fail
reasons:
  description: One line per finding, naming what is wrong, where (GPU, device, path, rank) and what to do.
  returned: always
  type: list
  elements: str
not_run:
  description: Why nothing ran (check mode, a precondition), else null.
  returned: always
  type: str
samples:
  description:
    - One entry per sample; t_s is seconds since the first sample. Each GPU has index, pci, temperature_c, power_w,
      pcie_gen_current, pcie_width_current, utilization_gpu_pct, throttle_reasons (list), memory_used_mib,
      pcie_gen_max, pcie_width_max, ecc_volatile_corrected (null when not reported).
  returned: always
  type: list
  elements: dict
  sample:
    - t_s: 0.0
      gpus:
        - {index: 0, pci: "0000:18:00", temperature_c: 71, power_w: 651.0, pcie_gen_current: 5,
           pcie_width_current: 16, utilization_gpu_pct: 100, throttle_reasons: [], memory_used_mib: 70001,
           pcie_gen_max: 5, pcie_width_max: 16, ecc_volatile_corrected: 0}
per_gpu:
  description:
    - Summary per GPU over all samples, computed by the same function the fleet report uses (judge_samples.figures).
  returned: always
  type: list
  elements: dict
  sample:
    - {index: 2, pci: "0000:3a:00", samples: 12, loaded_samples: 11, max_temperature_c: 79, max_power_w: 655.0,
       seconds_above_limit_s: 0.0, temperature_limit_c: 85.0, pcie_gen_under_load: 5, pcie_width_under_load: 16,
       pcie_gen_max: 5, pcie_width_max: 16, ecc_corrected_first: 0, ecc_corrected_last: 0, throttle_reasons_seen: []}
  contains:
    index:
      description: GPU index as nvidia-smi numbers it.
      type: int
    pci:
      description: PCI address, lowercase V(dddd:bb:dd).
      type: str
    samples:
      description: How many samples read the GPU.
      type: int
    loaded_samples:
      description: Samples at or above O(load_util_min_pct) utilisation.
      type: int
    max_temperature_c:
      description: Highest temperature seen.
      type: float
    max_power_w:
      description: Highest power draw seen; null when not reported.
      type: float
    seconds_above_limit_s:
      description: Time spent above O(temp_max_c), each sample standing until the next.
      type: float
    temperature_limit_c:
      description: The limit used (O(temp_max_c)).
      type: float
    pcie_gen_under_load:
      description: The BEST PCIe generation in loaded samples (a momentary dip is not a degraded link); null without any.
      type: int
    pcie_width_under_load:
      description: The best PCIe link width in loaded samples; null without any.
      type: int
    pcie_gen_max:
      description: The GPU's rated PCIe generation.
      type: int
    pcie_width_max:
      description: The GPU's rated link width.
      type: int
    ecc_corrected_first:
      description: Volatile corrected ECC count in the first sample that read it.
      type: int
    ecc_corrected_last:
      description: Volatile corrected ECC count in the last sample that read it.
      type: int
    throttle_reasons_seen:
      description: Sorted union of the active throttle reasons, without V(gpu_idle).
      type: list
      elements: str
evidence:
  description: The sample lines that justify the findings.
  returned: always
  type: list
  elements: str
problems:
  description:
    - What could not be read, as in M(kentino.gpufleet.gpu_facts) (kind V(lost), V(unreadable_field),
      V(unparsable_output), V(tool_error), V(tool_missing); pci, index; raw message).
  returned: always
  type: list
  elements: dict
stopped_early:
  description:
    - True when sampling ended before O(duration) and before the O(stop_file) appeared - nvidia-smi answered with no
      GPU three times in a row, or the run's lease expired. A lost GPU alone does not stop it; the others are sampled.
  returned: always
  type: bool
stop_reason:
  description: Why sampling stopped early; null otherwise.
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
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_samples
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import check_argument_spec, resolve_timeout
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import (
    LEASE_OPTIONS,
    THRESHOLD_OPTIONS,
    exit_check,
    given_thresholds,
    node_name,
    open_lease,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import (
    SAMPLE_SPEC,
    QueryGpu,
    gpu_problem,
    public_problems,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool

SAMPLE_KEYS = [key for key, _candidates in SAMPLE_SPEC]
MAX_EVIDENCE_CALLS = 20
# nvidia-smi answering with no GPU at all this many times in a row ends the sampling (a lost GPU alone does not: the
# others are still sampled).
MAX_EMPTY_SAMPLES = 3


def _wait_or_stop(until, stop_file, lease):
    """Sleep until the monotonic time `until`. Returns the reason to stop early: 'stop_file', 'lease' or None."""
    while True:
        if stop_file and os.path.exists(stop_file):
            return "stop_file"
        if lease is not None and lease.expired():
            return "lease"
        left = until - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(left, 0.2))


def _empty_reason(answer):
    errors = [p for p in answer["problems"] if p["kind"] in ("tool_error", "unparsable_output")]
    return "nvidia-smi failed: %s" % errors[0]["message"] if errors else "nvidia-smi returned no GPU rows"


def thresholds(p):
    return {"gpufleet_temp_max_c": float(p["temp_max_c"]), "gpufleet_temp_sustained_s": float(p["temp_sustained_s"]),
            "gpufleet_load_util_min_pct": float(p["load_util_min_pct"]),
            "gpufleet_ecc_corrected_rise": p["ecc_corrected_rise"]}


def main():
    module = AnsibleModule(
        argument_spec=check_argument_spec(
            duration=dict(type="float", default=60),
            interval=dict(type="float", default=5),
            temp_max_c=dict(type="float", default=85.0, aliases=["temperature_threshold_c"]),
            temp_sustained_s=dict(type="float", default=300.0),
            load_util_min_pct=dict(type="float", default=50.0, aliases=["load_threshold_pct"]),
            ecc_corrected_rise=dict(type="int", default=1),
            stop_file=dict(type="path"),
            **dict(LEASE_OPTIONS, **THRESHOLD_OPTIONS)
        ),
        supports_check_mode=True,
    )
    p = module.params
    resolve_timeout(module, 30)
    for name in ("duration", "interval", "lease_timeout"):
        if p[name] <= 0:
            module.fail_json(msg="%s must be a positive number of seconds, got %s" % (name, p[name]))
    t = given_thresholds(module, thresholds(p))
    host = node_name()
    lease = open_lease(module)
    result = {"samples": [], "per_gpu": [], "problems": [], "stopped_early": False, "stop_reason": None,
              "duration_s": 0.0, "interval_s": p["interval"],
              "nvidia_smi": {"call_count": 0, "rejected_fields": [], "calls": []}}
    executable = find_tool(module, "nvidia-smi", p["executable"])
    if executable is None:
        result["problems"].append(gpu_problem("tool_missing", "install the NVIDIA driver (nvidia-smi not found %s)"
                                              % ("at " + p["executable"] if p["executable"] else "on PATH")))
        result["stopped_early"] = True
        result["stop_reason"] = "nvidia-smi not found"
        exit_check(module, result, judge_samples.judge(result, t, host))

    query = QueryGpu(executable, SAMPLE_SPEC, p["timeout"])
    problems = []
    empty = 0
    started = time.monotonic()
    tick = 0
    seen_calls = 0
    while tick == 0 or tick * p["interval"] < p["duration"]:
        if tick:
            why = _wait_or_stop(started + tick * p["interval"], p["stop_file"], lease)
            if why == "lease":
                result["stopped_early"], result["stop_reason"] = True, lease.reason()
                break
            if why == "stop_file":
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
    result["per_gpu"] = judge_samples.figures(result, t)[0]
    result["nvidia_smi"]["call_count"] = len(query.calls)
    result["nvidia_smi"]["rejected_fields"] = list(query.rejected)
    exit_check(module, result, judge_samples.judge(result, t, host))


if __name__ == "__main__":
    main()
