#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nvlink_facts
short_description: Gather NVSwitch, fabric manager, fabric state, NVLink and topology facts of a GPU node
description:
  - "Reads what decides whether the GPUs of an NVSwitch machine (HGX/DGX A100, H100, H200, B200) can talk to each
    other: whether the node has NVSwitches (NVIDIA PCI devices of class 0680, or the NVLink 5 switch-management
    bridges), the fabric manager's package version, systemd state and journal, each GPU's registration with the
    NVLink fabric (the C(Fabric) section of C(nvidia-smi -q): State, Status and Health), each NVLink's state and speed
    (C(nvidia-smi nvlink -s)), each NVLink's error counters (C(nvidia-smi nvlink -e): CRC, replay, recovery) and the
    connection matrix (C(nvidia-smi topo -m))."
  - Observations only; judgement is kentino.gpufleet's judge_nvlink (in the fleet report). Every figure is named with
    its unit or meaning (C(nvlink_links_up), C(nvlink_crc_errors_total), C(fabric_state)), so a history can read them
    from the schema C(plugins/plugin_utils/schemas/nvlink_facts.json).
  - GPUs are joined across the tools by UUID and PCI address (C(--query-gpu=index,pci.bus_id,uuid)), never by the
    order of their blocks.
  - A node without NVLink is not an error (its GPUs have C(nvlink_present) false); a tool that is missing, fails or
    times out is a problem in the result, never a module failure.
version_added: "0.2.0"
author:
  - kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.check_common
  - kentino.gpufleet.node_module
  - kentino.gpufleet.node_module.read_only
  - kentino.gpufleet.node_module.facts
options:
  gather:
    description:
      - What to read. V(platform) (NVSwitch detection from sysfs/procfs), V(fabric_manager) (systemctl and dpkg-query),
        V(gpus) (the GPU identities), V(fabric) (C(nvidia-smi -q)), V(nvlink) (C(nvidia-smi nvlink -s)), V(counters)
        (C(nvidia-smi nvlink -e)), V(topology) (C(nvidia-smi topo -m)).
      - V(fabric), V(nvlink), V(counters) and V(topology) read V(gpus) too.
    type: list
    elements: str
    choices: [platform, fabric_manager, gpus, fabric, nvlink, counters, topology]
    default: [platform, fabric_manager, gpus, fabric, nvlink, counters, topology]
  fabric_manager_service:
    description: The fabric manager's systemd unit.
    type: str
    default: nvidia-fabricmanager
  sysfs_root:
    description: Where sysfs is mounted (the simulated fleet points it at a prepared tree).
    type: path
    default: /sys
  procfs_root:
    description: Where procfs is mounted.
    type: path
    default: /proc
  baseline:
    description:
      - An earlier read of this module (its RV(ansible_facts.gpufleet_nvlink)), e.g. the one taken before a burn.
        Its error counters are kept in the result (C(baseline) in RV(ansible_facts.gpufleet_nvlink)) so that one
        result holds the counters before and after, and the rise between them can be judged.
    type: dict
notes:
  - O(executable) defaults to C(nvidia-smi) on E(PATH); O(timeout) applies to each call and defaults to 60 seconds.
  - C(systemctl), C(dpkg-query) and C(journalctl) are looked up on E(PATH); without them the fabric manager's state is
    reported as unknown with the reason. Its journal needs root or the C(systemd-journal) group.
seealso:
  - module: kentino.gpufleet.gpu_facts
  - name: The kentino.gpufleet.fabric_manager role
    description: Installs the fabric manager at the driver's version on NVSwitch machines and verifies the fabric.
    link: https://example.invalid/kentino/gpufleet/blob/main/docs/roles.md#fabric_manager
"""

EXAMPLES = r"""
- name: Read NVLink, fabric and topology facts
  kentino.gpufleet.nvlink_facts:

- name: Only decide whether this is an NVSwitch machine (no driver needed)
  kentino.gpufleet.nvlink_facts:
    gather: [platform]

- name: Read the counters again after a burn, keeping the earlier read for the rise
  kentino.gpufleet.nvlink_facts:
    baseline: "{{ gpufleet_nvlink_before.ansible_facts.gpufleet_nvlink }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts about the node's NVLink fabric.
  returned: always
  type: dict
  contains:
    gpufleet_nvlink:
      description:
        - "read_at (epoch seconds), gathered (what was read), driver_version, interconnect (V(nvswitch), V(nvlink),
          V(pcie), V(mixed) or null: how the node's GPUs reach each other), platform ({nvswitch, nvlink5, generation,
          nvswitch_pci, nvswitch_driver_devices, nvlink5_bridges, evidence}), fabric_manager ({service, load_state,
          active_state, sub_state, unit_file_state, exec_main_status, package, version, upstream_version,
          nscq_package, nscq_version, packages, errors, journal}), gpus, topology, baseline, problems, unparsed."
        - "fabric_manager.journal: {read, error, lines, events} from the unit's journal of this boot (the last
          300 entries of C(journalctl -u)); events: V(driver_version_mismatch) (the daemon's version and the
          driver's, as its start-up line names them) and V(no_nvswitch) (C(NV_WARN_NOTHING_TO_DO)), each with the
          raw line."
        - "Each GPU: index, pci (V(dddd:bb:dd)), uuid, name, fabric_state (V(completed), V(in_progress),
          V(not_started) ..., null when the GPU is not in an NVSwitch fabric), fabric_status (e.g. V(Success)),
          fabric_clique_id, fabric_cluster_uuid, fabric_health_summary (V(Healthy), V(Unhealthy), V(Limited Capacity)),
          fabric_health_bandwidth (V(Full), V(Degraded)), fabric_health_route_recovery, fabric_health_route_unhealthy,
          fabric_health_access_timeout_recovery (V(True), V(False)), fabric_health_incorrect_configuration
          (V(None) or the fault; null where the driver prints no such row), nvlink_present,
          nvlink_all_inactive, nvlink_links_total, nvlink_links_up, nvlink_links ([{link, up, speed_gbps}]),
          nvlink_counters ([{link, crc_errors, replay_errors, recovery_errors, counters}]), nvlink_crc_errors_total,
          nvlink_replay_errors_total, nvlink_recovery_errors_total, evidence (the raw lines)."
      type: dict
      sample:
        interconnect: nvswitch
        platform: {nvswitch: true, nvlink5: false, generation: nvswitch}
        fabric_manager: {service: nvidia-fabricmanager, active_state: active, package: nvidia-fabricmanager-570,
                         upstream_version: "570.172.08"}
        gpus:
          - index: 0
            pci: "0000:18:00"
            fabric_state: completed
            fabric_status: Success
            nvlink_links_total: 18
            nvlink_links_up: 18
            nvlink_crc_errors_total: 0
nvidia_smi:
  description: Evidence of how the facts were read.
  returned: always
  type: dict
  contains:
    calls:
      description: Each tool invocation (argv, rc, timed_out, duration_s, error).
      type: list
      elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import fabric_manager
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import check_argument_spec, resolve_timeout
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvlink_read import GATHER, registered


def main():
    module = AnsibleModule(
        argument_spec=check_argument_spec(
            gather=dict(type="list", elements="str", choices=list(GATHER), default=list(GATHER)),
            fabric_manager_service=dict(type="str", default=fabric_manager.SERVICE),
            sysfs_root=dict(type="path", default="/sys"),
            procfs_root=dict(type="path", default="/proc"),
            baseline=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    resolve_timeout(module, 60)
    module.exit_json(**registered(module, module.params, module.params["gather"], module.params["timeout"]))


if __name__ == "__main__":
    main()
