#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: xid_facts
short_description: Read NVIDIA XID errors and lost GPUs from the kernel log
description:
  - Reads the kernel log (journald, dmesg or a plain/gzip log file), finds NVIDIA XID lines in every known driver
    format, and returns them as events enriched from NVIDIA's XID catalog (snapshot 2025-10) with a severity.
  - A burst of related lines is one event (XID 13 prints one line per SM; XID 119 is followed by an RPC history and a
    stack trace); XID 45 is correlated with the Xid that caused it and not counted twice.
  - A GPU that "fell off the bus" is reported in RV(ansible_facts.gpufleet_xid.lost_gpus) and as an XID 79 event even
    when the driver printed no Xid line (the one-line and the three-line forms).
  - A GPU the driver could not initialise (C(RmInitAdapter failed!)) is reported in
    RV(ansible_facts.gpufleet_xid.init_failures). Lines that follow an Xid are folded into its event only when
    they name no other GPU.
  - "With O(state_file), each run returns only what was logged since the previous run: no event is missed or repeated
    across journal rotation (cursor gone: falls back to the saved time), reboots (the journal's rest of the previous
    boot is read too), log-file rotation and truncation."
  - "Default severity per code: V(critical) for 48, 63, 64, 79 and 92 (docs/failure-modes.md pages on these), for the DCGM
    health-watch failures 74, 95, 119, 120 and 140, for 54 (auxiliary power cable), and for every code whose NVIDIA
    immediate action takes the GPU or node out of service (RESET_GPU, RESTART_BM, RESTART_VM, CHECK_MECHANICALS,
    WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, NVLink5 144-150 when the line says Fatal)."
  - "V(warning) for 13, 31, 32, 43 and 94 (DCGM warns; the device plugin calls them application errors, but hardware
    causes are listed), for RESTART_APP codes whose legacy causes include hardware, bus, thermal or framebuffer, for
    CONTACT_SUPPORT/UPDATE_SWFW codes, NVLink5 Nonfatal lines, and a solo XID 45."
  - "V(info) for IGNORE codes, application-only RESTART_APP codes (68 and others), and an XID 45 that follows another
    Xid on the same GPU. XID 154 takes the severity of the recovery action it announces (none: info; drain P2P:
    warning; any reset or reboot: critical). A code absent from the catalog is V(unknown), never ignored."
  - The full per-code table and its reasoning are in hack/gen_xid_catalog.py and docs/signals.md; override any code
    with O(severity_overrides).
version_added: "0.1.0"
author:
  - kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.node_module
  - kentino.gpufleet.node_module.facts
attributes:
  check_mode:
    support: full
    details: Check mode reads the log as a normal run does; the O(state_file) is read but not written.
options:
  source:
    description:
      - Where to read the kernel log.
      - V(auto) uses journald when C(journalctl) is present and answers, else C(dmesg).
      - V(file) reads O(path) (a saved dmesg, kern.log, messages, or their .gz; gzip is detected by its magic bytes).
    type: str
    choices: [auto, journal, dmesg, file]
    default: auto
  path:
    description:
      - The log file to read when O(source=file). Plain text or gzip.
    type: path
  state_file:
    description:
      - Where to keep the read position between runs. When set, only events logged after the previous run are
        returned, and the new position is saved atomically (not in check mode).
      - The position is per source; a state file written for another source is ignored (and said so).
    type: path
  since:
    description:
      - Only events at or after this time. ISO 8601 (C(2024-08-09T13:00:00Z), C(2024-08-09)) or relative to now
        (C(-2h), C(-30m), C(-1d), C(-90s), C(-1w)).
      - Events whose time the log does not give (dmesg without a boot time) are kept.
    type: str
  timeout:
    description:
      - Seconds allowed for journalctl or dmesg.
    type: int
    default: 60
  severity_overrides:
    description:
      - Severity per XID code, over the defaults. Keys are codes, values one of V(critical), V(warning), V(info),
        V(unknown).
    type: dict
    default: {}
  max_events:
    description:
      - At most this many events are returned (the newest); the counts in RV(ansible_facts.gpufleet_xid.summary)
        always cover all.
    type: int
    default: 500
  journalctl_executable:
    description:
      - Path of journalctl, when it is not on E(PATH).
    type: path
  dmesg_executable:
    description:
      - Path of dmesg, when it is not on E(PATH).
    type: path
notes:
  - "Reading the kernel log needs root on most systems (C(kernel.dmesg_restrict=1), the journal's system files):
    use C(become: true)."
  - With the journal, journalctl itself keeps only NVRM entries (C(--grep), systemd 237+; older versions are retried
    without it), so a long boot's kernel log stays far below the 4 MiB of tool output the module keeps.
  - dmesg lines carry only the uptime; their time is the boot time plus the uptime (approximate after a suspend).
"""

EXAMPLES = r"""
- name: XID errors of the current boot
  kentino.gpufleet.xid_facts:
  become: true

- name: Only what is new since the previous audit run, from the journal
  kentino.gpufleet.xid_facts:
    source: journal
    state_file: /var/lib/gpufleet/xid.state
  become: true

- name: Last two hours, with a site policy for row remaps
  kentino.gpufleet.xid_facts:
    since: -2h
    severity_overrides:
      63: warning
  become: true

- name: A kern.log copied from a customer's machine
  kentino.gpufleet.xid_facts:
    source: file
    path: /tmp/case-1234/kern.log.2.gz

- name: Page on lost GPUs
  ansible.builtin.debug:
    msg: "GPU {{ item }} fell off the bus: reseat the riser and the power cable before any RMA"
  loop: "{{ ansible_facts['gpufleet_xid']['lost_gpus'] }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts under RV(ansible_facts.gpufleet_xid).
  returned: success
  type: dict
  contains:
    gpufleet_xid:
      description: The XID picture of the node.
      type: dict
      contains:
        events:
          description:
            - One dict per event (bursts folded), oldest first. Keys xid, pci (dddd:bb:dd), gpu_instance,
              compute_instance, pid, process, message, channel, mnemonic, description, action
              ({immediate, investigatory} from the catalog), severity, severity_basis, time (ISO 8601 or null),
              uptime_s, boot_id, line (the first raw line), line_count, evidence (up to 5 raw lines),
              details (NVLink5 unit/fatal/link/subcode, XID 154 recovery actions, XID 45 caused_by_xid),
              counted (false for a correlated XID 45), correlated_with, synthetic (true for a lost GPU without an
              Xid line), uuid, serial.
          type: list
          elements: dict
          sample:
            - xid: 79
              pci: "0000:3b:00"
              pid: null
              process: null
              message: GPU has fallen off the bus.
              mnemonic: GPU_HAS_FALLEN_OFF_THE_BUS
              action: {immediate: RESTART_BM, investigatory: CONTACT_SUPPORT}
              severity: critical
              time: "2024-12-02T11:38:47+00:00"
              uptime_s: 219.470994
              line: "[  219.470994] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
        lost_gpus:
          description: PCI addresses (dddd:bb:dd) of GPUs that fell off the bus, with or without an Xid line.
          type: list
          elements: str
          sample: ["0000:3b:00"]
        init_failures:
          description:
            - GPUs the driver could not initialise (C(RmInitAdapter failed!), C(rm_init_adapter failed)), one entry
              per GPU whatever the number of attempts. Never folded into an Xid event of another GPU.
            - Keys kind (V(init_failed)), pci (dddd:bb:dd, null on drivers that print no address), minor (the
              /dev/nvidiaN minor number, when printed), code (the driver's status triple such as V(0x26:0x56:1474)),
              count (attempts in this read), time, uptime_s, boot_id, line (the first raw line), evidence (up to 5
              raw lines).
          type: list
          elements: dict
          sample:
            - kind: init_failed
              pci: "0000:3b:00"
              minor: 1
              code: "0x26:0x56:1474"
              count: 2
              line: "[ 8120.901114] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x56:1474)"
        gpu_ids:
          description: UUID and board serial per PCI address, from the lines the driver prints after a first Xid.
          type: dict
          sample: {"0000:3b:00": {"uuid": "GPU-5a1c7e2b-3f4d-4e21-9c0a-000000012345", "serial": "1652123456789"}}
        summary:
          description:
            - Counts of counted events by_code, by_pci and by_severity; events; correlated (XID 45 not counted
              again); burst_lines_folded; xid_lines; lines_read or bytes_read; skipped_before_since; events_dropped;
              init_failures (GPUs in init_failures).
          type: dict
        highest_severity:
          description: The worst severity among counted events (info < warning < unknown < critical), or V(none).
          type: str
          sample: critical
        unparsed:
          description:
            - What could not be read, counted by reason (xid_line, overlong_line, journal_json, journal_message_null,
              fallen_off_without_pci, output_cut), with up to 5 samples.
          type: dict
          sample: {"count": 1, "by_reason": {"xid_line": 1}, "samples": [{"reason": "xid_line", "line": "NVRM: Xid (PCI:0000:3b"}]}
        source:
          description: The source actually read (journal, dmesg or file).
          type: str
          sample: journal
        position:
          description:
            - Where this read ended (journal cursor/realtime_us/boot_id; dmesg boot_id/uptime_s; file path/inode/
              offset), whether it was saved to O(state_file), and notes on rotation, reboot or fallback.
          type: dict
        notes:
          description: Remarks about the read (source fallback, truncated tool output, unreadable journal entries).
          type: list
          elements: str
tool:
  description: The external tool run (argv, rc, timed_out, duration_s, error); null for O(source=file).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import parse_since
from ansible_collections.kentino.gpufleet.plugins.module_utils.xid_policy import parse_overrides
from ansible_collections.kentino.gpufleet.plugins.module_utils.xid_read import registered


def main():
    module = AnsibleModule(
        argument_spec=dict(
            source=dict(type="str", default="auto", choices=["auto", "journal", "dmesg", "file"]),
            path=dict(type="path"),
            state_file=dict(type="path"),
            since=dict(type="str"),
            timeout=dict(type="int", default=60),
            severity_overrides=dict(type="dict", default={}),
            max_events=dict(type="int", default=500),
            journalctl_executable=dict(type="path"),
            dmesg_executable=dict(type="path"),
        ),
        required_if=[("source", "file", ("path",))],
        supports_check_mode=True,
    )
    p = module.params
    try:
        overrides = parse_overrides(p["severity_overrides"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    try:
        since = parse_since(p["since"])
    except ValueError as exc:
        module.fail_json(msg="since: %s" % exc)
    if p["timeout"] <= 0 or p["max_events"] <= 0:
        module.fail_json(msg="timeout and max_events must be positive")
    result = registered(module, p["source"], path=p["path"], state_file=p["state_file"], since=since,
                        timeout_s=p["timeout"], overrides=overrides, max_events=p["max_events"],
                        journalctl=p["journalctl_executable"], dmesg=p["dmesg_executable"])
    if result.get("failed"):
        module.fail_json(**result)
    for note in result.pop("warnings"):
        module.warn(note)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
