#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nccl_test
short_description: Run an nccl-tests benchmark (all_reduce_perf) and judge correctness and bus bandwidth
description:
  - Runs C(all_reduce_perf) (or another nccl-tests binary given as O(executable)) directly or under C(mpirun),
    through the collection's tool runner (own process group, the whole group killed on timeout).
  - Returns every result row, the peak bus bandwidth at the largest message size (the health figure; the tool's
    C(Avg bus bandwidth) includes tiny latency-bound sizes and is informational), wrong values and the GPUs used.
  - Wrong values, out-of-bounds values, C(Test CUDA/NCCL failure) lines or a non-zero exit after results are
    RV(verdict=fail); a RV(peak_busbw_gbps) below the floor is RV(verdict=fail). The floor is O(min_busbw_gbps), else
    the GPU model's reference times O(min_busbw_fraction); an unknown model without a floor warns. No result rows is
    RV(verdict=error). The judgement is kentino.gpufleet's judge_nccl, the same the fleet report applies with the
    inventory's thresholds.
  - In check mode nothing runs (RV(verdict=skipped)).
version_added: "0.1.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.check_common
  - kentino.gpufleet.lease
  - kentino.gpufleet.thresholds
  - kentino.gpufleet.node_module.tool_check
attributes:
  check_mode:
    details: In check mode neither the test nor nvidia-smi is run; the result is RV(verdict=skipped).
options:
  min_bytes:
    description: Smallest message size (C(-b)), bytes with an optional K, M or G suffix.
    type: str
    default: "8"
  max_bytes:
    description: Largest message size (C(-e)), bytes with an optional K, M or G suffix.
    type: str
    default: "1G"
  step_factor:
    description: Multiply the size by this factor between rows (C(-f)).
    type: int
    default: 2
  gpus_per_process:
    description:
      - How many GPUs each process drives (C(-g)). A count, unlike the GPU index lists of
        M(kentino.gpufleet.gpu_burn) and M(kentino.gpufleet.dcgm_diag); choose GPUs with E(CUDA_VISIBLE_DEVICES) in
        O(env).
      - Default with O(launcher=none) all visible GPUs in one process (the count of E(CUDA_VISIBLE_DEVICES) in
        O(env) when set, else one C(nvidia-smi --query-gpu=index) call); with O(launcher=mpirun) V(1) (one rank a
        GPU).
      - The alias O(gpus) is deprecated and will be removed in version 1.0.0; use O(gpus_per_process).
    type: int
    aliases: [gpus]
  iterations:
    description: Timed iterations per size (C(-n)). Default the tool's (20).
    type: int
  launcher:
    description: V(none) runs the binary directly; V(mpirun) runs it under Open MPI's C(mpirun -np NP).
    type: str
    choices: [none, mpirun]
    default: none
  launcher_args:
    description: Extra arguments for mpirun, placed before the binary (e.g. C(--allow-run-as-root), C(--bind-to numa)).
    type: list
    elements: str
    default: []
  np:
    description: Number of MPI ranks with O(launcher=mpirun). Default the number of visible GPUs.
    type: int
  extra_args:
    description: Extra arguments for the nccl-tests binary, appended last, each one argv element (never a shell).
    type: list
    elements: str
    default: []
  env:
    description:
      - Environment for the test (E(NCCL_DEBUG), E(NCCL_P2P_LEVEL), E(NCCL_TESTS_MIN_BW), E(CUDA_VISIBLE_DEVICES) ...).
      - With O(launcher=mpirun) each variable is also exported to the ranks with C(-x NAME).
    type: dict
    default: {}
  min_busbw_gbps:
    description:
      - Minimum acceptable bus bandwidth (GB/s) at the largest size; below it the verdict is fail.
      - Default the GPU model's single-node reference (O(reference_busbw_gbps), else the built-in table) times
        O(min_busbw_fraction). A GPU without a reference gives verdict C(warn) (no baseline) with the figure.
    type: float
  min_busbw_fraction:
    description: Share of the model's reference bus bandwidth required when O(min_busbw_gbps) is not given, in (0, 1].
    type: float
    default: 0.7
  reference_busbw_gbps:
    description:
      - Extra or overriding references, GPU name substring to GB/s (for example C(RTX 5090) to 50); the longest
        matching name wins. Use your platform's burn-in figure.
    type: dict
    default: {}
  interconnect:
    description:
      - How the node's GPUs reach each other, the C(interconnect) of M(kentino.gpufleet.nvlink_facts)' fact
        C(gpufleet_nvlink). A built-in reference applies only to the interconnect it was measured on (an H100 SXM
        figure says nothing about H100 PCIe cards); without a matching one the verdict is V(warn) with the figure,
        as in the fleet report.
    type: str
    choices: [nvswitch, nvlink, pcie, mixed]
  gpu_names:
    description:
      - The node's GPU models (the C(gpufleet_gpus) fact's names) the reference is chosen by; default the names in
        the tool's own header.
    type: list
    elements: str
    default: []
notes:
  - O(executable) defaults to C(all_reduce_perf) on E(PATH) or in C(/opt/gpufleet/bin), where the
    C(kentino.gpufleet.validation_tools) role installs it; C(mpirun) is looked up the same way.
  - O(timeout) defaults to 600 seconds; on timeout every rank is killed.
  - Loads the GPUs and their links; do not run it on nodes with live jobs.
"""

EXAMPLES = r"""
- name: All-reduce across all GPUs of the node, one process
  kentino.gpufleet.nccl_test:
    max_bytes: 1G
  register: gpufleet_result_nccl_test

- name: The vendor's fabric test, one MPI rank per GPU, with a floor
  kentino.gpufleet.nccl_test:
    launcher: mpirun
    np: 8
    launcher_args: [--allow-run-as-root]
    env:
      NCCL_DEBUG: WARN
    min_busbw_gbps: 40
  register: gpufleet_result_nccl_test
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
output_tail:
  description: The last lines the tool printed when it timed out (where it hung), else empty.
  returned: always
  type: list
  elements: str
evidence:
  description: Raw lines that justify the verdict (failure lines, rows with wrong values, the largest-size rows).
  returned: always
  type: list
  elements: str
tool:
  description: How the test ran (argv, rc, timed_out, duration_s, error).
  returned: always
  type: dict
rows:
  description:
    - One dict per result row C({size_bytes, count, type, redop, root, oop_time_us, oop_algbw_gbps, oop_busbw_gbps,
      oop_wrong, ip_time_us, ip_algbw_gbps, ip_busbw_gbps, ip_wrong}); C(*_wrong) is null when validation was off.
  returned: when the test ran
  type: list
  elements: dict
peak_busbw_gbps:
  description: Best bus bandwidth (out-of-place or in-place) at the largest message size.
  returned: when the test ran
  type: float
  sample: 377.71
largest_size_bytes:
  description: The largest message size measured.
  returned: when the test ran
  type: int
avg_busbw_gbps:
  description: The tool's average bus bandwidth over all sizes (informational, includes tiny sizes).
  returned: when the test ran
  type: float
wrong_values:
  description: Sum of the #wrong columns.
  returned: when the test ran
  type: int
out_of_bounds:
  description: The tool's out-of-bounds count (null when the footer is missing).
  returned: when the test ran
  type: int
gpus:
  description: The ranks from the C(# Rank) lines C({rank, group, pid, host, device, pci, bus_id, name}).
  returned: when the test ran
  type: list
  elements: dict
failures:
  description: Failure lines (C(Test CUDA failure), C(Test NCCL failure), mpirun aborts).
  returned: when the test ran
  type: list
  elements: str
header:
  description: Run parameters read from the header (nthread, ngpus, min_bytes, max_bytes, iters, validation ...).
  returned: when the test ran
  type: dict
foreign_lines_in_table:
  description: Lines inside the result table that were not result rows (MPI or NCCL warnings), skipped.
  returned: when the test ran
  type: int
unparsed:
  description: Lines that matched nothing (count and up to 5 samples).
  returned: when the test ran
  type: dict
problems:
  description: What the parser could not read.
  returned: when the test ran
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import nccl_check


def main():
    module = AnsibleModule(argument_spec=nccl_check.argument_spec(), supports_check_mode=True)
    nccl_check.run(module, nccl_check.check_options(module))


if __name__ == "__main__":
    main()
