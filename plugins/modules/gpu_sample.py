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
  - Runs C(nvidia-smi --query-gpu) every O(interval) seconds for O(duration) seconds and returns the samples plus a
    per-GPU summary of all of them. Past 720 samples (an hour at 5 s) it returns the per-GPU summary of every sample,
    the samples its findings quote and an even spread of the others for the chart, marked RV(samples_thinned), so a
    run of hours does not send tens of megabytes to the controller; the findings are the same. Meant to run with
    C(async) next to a burn-in or NCCL test, because the PCIe link drops its generation at idle and throttling only
    shows under load.
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
    - One entry per sample (past 720 samples, those kept, RV(samples_thinned)); t_s is seconds since the first sample.
      Each GPU has index, pci, temperature_c, power_w, pcie_gen_current, pcie_width_current, utilization_gpu_pct,
      throttle_reasons (list), memory_used_mib, pcie_gen_max, pcie_width_max, ecc_volatile_corrected (null when not
      reported).
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
      Of a thinned result (RV(samples_thinned)) the report judges these figures, computed here from every sample.
  returned: always
  type: list
  elements: dict
  sample:
    - {index: 2, pci: "0000:3a:00", samples: 12, loaded_samples: 11, max_temperature_c: 79, max_power_w: 655.0,
       seconds_above_limit_s: 0.0, temperature_limit_c: 85.0, pcie_gen_under_load: 5, pcie_width_under_load: 16,
       pcie_gen_max: 5, pcie_width_max: 16, ecc_corrected_first: 0, ecc_corrected_last: 0, throttle_reasons_seen: [],
       throttled_samples: 0}
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
    throttled_samples:
      description: Samples with a thermal throttle reason active.
      type: int
samples_thinned:
  description:
    - True when the run took more than 720 samples and RV(samples) holds only those kept (the ones the findings quote,
      each GPU's first and last two, an even spread of the rest); RV(per_gpu) covers every sample.
  returned: when more than 720 samples were taken
  type: bool
samples_total:
  description: How many samples were taken, when RV(samples) is thinned.
  returned: when more than 720 samples were taken
  type: int
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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import gpu_sampling, judge_samples
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import check_argument_spec, resolve_timeout
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import (
    LEASE_OPTIONS,
    THRESHOLD_OPTIONS,
    exit_check,
    given_thresholds,
    node_name,
    open_lease,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool


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
    t = given_thresholds(module, gpu_sampling.thresholds(p["temp_max_c"], p["temp_sustained_s"],
                                                         p["load_util_min_pct"], p["ecc_corrected_rise"]))
    host = node_name()
    lease = open_lease(module)
    executable = find_tool(module, "nvidia-smi", p["executable"])
    if executable is None:
        result = gpu_sampling.missing_tool_result(p["interval"], p["executable"])
    else:
        stop_file = p["stop_file"]
        result = gpu_sampling.sample(executable, p["timeout"], p["interval"], p["duration"], t,
                                     stop=(lambda: "stop" if os.path.exists(stop_file) else None) if stop_file
                                     else None, lease=lease)
    exit_check(module, result, judge_samples.judge(result, t, host))


if __name__ == "__main__":
    main()
