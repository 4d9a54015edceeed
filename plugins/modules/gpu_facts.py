#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather per-GPU facts from nvidia-smi (identity, PCIe, ECC, retired pages, remapped rows, throttling)
description:
  - Runs C(nvidia-smi --query-gpu) once for the per-GPU values, C(--query-compute-apps) for the processes on each GPU
    and C(nvidia-smi -q) for what the CSV interface lacks (PCIe replay counter; values of fields the driver rejected).
  - Field names differ between driver generations and one unknown name aborts the whole query. The module asks with
    the newest names first; when the driver rejects one it reads C(--help-query-gpu) once and retries with the old
    names (C(pcie.link.gen.current), C(clocks_throttle_reasons.active)) or without the field.
  - Values the card does not support are null, never strings such as C([N/A]).
  - A lost GPU (C(GPU is lost), non-zero exit, possibly while the other GPUs still print) is reported in
    RV(ansible_facts.gpufleet_gpu_problems), not as a module failure. A node without nvidia-smi returns no GPUs and a
    V(tool_missing) problem.
version_added: "0.1.0"
author:
  - kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.check_common
  - kentino.gpufleet.node_module
  - kentino.gpufleet.node_module.read_only
  - kentino.gpufleet.node_module.facts
options:
  include_processes:
    description:
      - Query the compute processes on each GPU (one extra nvidia-smi call).
    type: bool
    default: true
  include_q:
    description:
      - Run C(nvidia-smi -q) for the PCIe replay counter and for values of fields this driver's CSV interface rejects
        (one extra call). When V(false), C(pcie_replays) is null.
    type: bool
    default: true
notes:
  - O(executable) defaults to C(nvidia-smi) on E(PATH).
  - O(timeout) applies to each nvidia-smi call and defaults to 60 seconds (a lost GPU can make nvidia-smi hang).
  - Lost GPUs are not listed in RV(ansible_facts.gpufleet_gpus) (nothing can be read from them) and are not counted
    in RV(ansible_facts.gpufleet_gpu_count); compare the count with the expected GPUs per node.
seealso:
  - module: kentino.gpufleet.gpu_sample
"""

EXAMPLES = r"""
- name: Gather GPU facts
  kentino.gpufleet.gpu_facts:

- name: Fewer calls on a big fleet (no processes, no -q)
  kentino.gpufleet.gpu_facts:
    include_processes: false
    include_q: false
    timeout: 30

- name: Stop when a GPU is lost
  ansible.builtin.assert:
    that: ansible_facts['gpufleet_gpu_problems'] | selectattr('kind', 'equalto', 'lost') | list | length == 0
    fail_msg: "{{ ansible_facts['gpufleet_gpu_problems'] | selectattr('kind', 'equalto', 'lost') | map(attribute='message') | list }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts about the node's NVIDIA GPUs.
  returned: always
  type: dict
  contains:
    gpufleet_gpus:
      description:
        - One dict per readable GPU with exactly these keys; a value the card or driver does not provide is null.
        - index, pci (V(dddd:bb:dd), lowercase), uuid, serial, name, driver_version, vbios, temperature_c, power_w,
          power_limit_w, memory_used_mib, memory_total_mib, pcie_gen_current, pcie_gen_max, pcie_width_current,
          pcie_width_max, pcie_replays (from C(-q)), ecc_mode (V(enabled)/V(disabled)), ecc_volatile_corrected,
          ecc_volatile_uncorrected, ecc_aggregate_corrected, ecc_aggregate_uncorrected, retired_pages_sbe,
          retired_pages_dbe, retired_pages_pending (bool), remapped_rows_correctable, remapped_rows_uncorrectable,
          remapped_rows_pending (bool), remapped_rows_failure (bool), throttle_reasons (list of active reasons such as
          V(gpu_idle), V(sw_power_cap), V(hw_slowdown), V(hw_thermal_slowdown), V(sw_thermal_slowdown),
          V(hw_power_brake_slowdown)), persistence_mode (bool), recovery_action (V(none), V(gpu_reset),
          V(node_reboot), V(drain_p2p), V(drain_and_reset), ...), processes (list of {pid, name, used_memory_mib};
          null when not queried or unreadable).
      type: list
      elements: dict
      sample:
        - index: 0
          pci: "0000:18:00"
          name: NVIDIA H100 80GB HBM3
          temperature_c: 58
          pcie_gen_current: 5
          pcie_width_current: 16
          pcie_replays: 0
          remapped_rows_pending: false
          throttle_reasons: []
          processes: [{pid: 48213, name: /opt/conda/bin/python3.11, used_memory_mib: 59012}]
    gpufleet_pci_gpus:
      description:
        - PCI addresses (V(dddd:bb:dd)) of the NVIDIA GPUs on the PCI bus, whatever nvidia-smi says; the expected
          GPU count when C(gpufleet_expected_gpus) is not set.
      type: list
      elements: str
      sample: ["0000:18:00", "0000:2a:00"]
    gpufleet_driver_version:
      description: NVIDIA driver version, null when nvidia-smi could not report it.
      type: str
      sample: "570.133.20"
    gpufleet_gpu_count:
      description: Number of readable GPUs (lost GPUs are in RV(ansible_facts.gpufleet_gpu_problems) instead).
      type: int
      sample: 8
    gpufleet_gpu_problems:
      description:
        - What could not be read, as {kind, pci, index, message}. kind is V(lost) (nvidia-smi has no handle for the
          GPU, whether it fell off the bus, reads C(Unknown Error) or is insufficiently powered), V(unreadable_field) (a value read as
          C([Unknown Error]) or C([Insufficient Permissions])), V(unparsable_output) (a line that is not a GPU row of
          the query, with the wrong number of fields or no valid index or PCI bus id; such lines are never GPUs),
          V(tool_error) (nvidia-smi failed, timed out or printed an error), V(tool_missing) (no nvidia-smi),
          V(parser_error). pci (V(dddd:bb:dd)) and index are null where the tool did not name them. message is the
          raw line where there is one.
      type: list
      elements: dict
      sample:
        - kind: lost
          pci: "0000:c1:00"
          index: 0
          message: "Unable to determine the device handle for GPU0: 0000:C1:00.0: Unknown Error"
nvidia_smi:
  description: Evidence of how the facts were read.
  returned: always
  type: dict
  contains:
    calls:
      description: Each nvidia-smi invocation (argv, rc, timed_out, duration_s, error).
      type: list
      elements: dict
    rejected_fields:
      description: Query fields this driver rejected (older or newer driver than the newest names).
      type: list
      elements: str
    unsupported_keys:
      description: RV(ansible_facts.gpufleet_gpus) keys the CSV interface of this driver cannot provide (filled from C(-q) when it can).
      type: list
      elements: str
    unparsed:
      description: Lines no parser could read, per call (count and up to 5 samples).
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import check_argument_spec, resolve_timeout
from ansible_collections.kentino.gpufleet.plugins.module_utils.gpu_table import MISSING_MESSAGE, facts, read_table
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import gpu_problem
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool


def main():
    module = AnsibleModule(
        argument_spec=check_argument_spec(
            include_processes=dict(type="bool", default=True),
            include_q=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    resolve_timeout(module, 60)
    executable = find_tool(module, "nvidia-smi", params["executable"])
    evidence = {"calls": [], "rejected_fields": [], "unsupported_keys": [], "unparsed": {}}
    if executable is None:
        message = MISSING_MESSAGE
        if params["executable"]:
            message = "install the NVIDIA driver (nvidia-smi not found at %s)" % params["executable"]
        module.exit_json(changed=False, ansible_facts=facts([], None, [gpu_problem("tool_missing", message)]),
                         nvidia_smi=evidence)

    answer, evidence, _rows = read_table(executable, params["timeout"], params["include_processes"],
                                         params["include_q"])
    module.exit_json(changed=False, ansible_facts=answer, nvidia_smi=evidence)


if __name__ == "__main__":
    main()
