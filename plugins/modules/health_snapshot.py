#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: health_snapshot
short_description: Read a GPU node's health in one round trip, safely on a production node under load
description:
  - "The audit's module (playbook C(kentino.gpufleet.audit)). Read-only: no burn, no write test, no diag, nothing
    that touches a GPU's work. Bounded: every tool has a timeout cut to what is left of O(budget); a part that finds
    the budget spent is skipped and named in RV(parts)."
  - Built from the collection's readers and parsers, and returns what their modules return, so the fleet report judges
    it with the same judges. RV(ansible_facts) holds the GPU table of M(kentino.gpufleet.gpu_facts)
    (C(gpufleet_gpus), ...) and the XIDs of M(kentino.gpufleet.xid_facts) (C(gpufleet_xid)); RV(gpu_sample) is the same
    nvidia-smi reading in the shape of M(kentino.gpufleet.gpu_sample), RV(storage) the observations of
    M(kentino.gpufleet.checkpoint_storage) (without its write test) and RV(env) those of
    M(kentino.gpufleet.training_env_facts).
  - "What only it reads: the reading's timestamp, utilisation and SM clocks, the InfoROM image and the bank remap
    histogram (C(remapped_rows.histogram.*)) per GPU in RV(gpus); the driver, DCGM, kernel, system BIOS, VBIOS and
    InfoROM versions in RV(versions); the board's identity (DMI) in RV(platform)."
  - XIDs are read incrementally from the position saved in O(xid_state_file), a file of its own, so each audit sees
    what was logged since the previous audit, none missed or repeated.
version_added: "0.3.0"
author:
  - kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.node_module
  - kentino.gpufleet.node_module.facts
  - kentino.gpufleet.thresholds
attributes:
  check_mode:
    support: full
    details: Reads as a normal run does; the XID position is not saved.
options:
  mode:
    description:
      - V(audit) reads everything below. V(identity) reads only the GPUs (one nvidia-smi query) and the versions
        and platform, and returns no RV(gpu_sample) - what a burn-in or preflight records for the history (drift, the
        customer handover sheet). With O(gpu_table) it also returns the run's GPU table (the processes and C(-q) read
        too), which the run judges as its own; without it, no GPU table.
      - With O(xid_state_file), V(identity) also reads the XIDs (the fact C(gpufleet_xid) only, not judged in this
        module's verdict) - a burn-in's mark before its load, in the same round trip; with O(nvlink_mark), the NVLink
        read before the load too.
    type: str
    choices: [audit, identity]
    default: audit
  budget:
    description: Seconds the whole snapshot may take; each tool's timeout is cut to what is left.
    type: int
    default: 120
  timeout:
    description: Seconds allowed for each nvidia-smi, nvme or smartctl call (within O(budget)).
    type: int
    default: 60
  include_q:
    description: Run C(nvidia-smi -q) for the PCIe replay counter (one extra call).
    type: bool
    default: true
  nvidia_smi_executable:
    description: Path of nvidia-smi when it is not on E(PATH).
    type: path
  xid:
    description: Read the XIDs logged since the previous snapshot.
    type: bool
    default: true
  xid_source:
    description: Where to read the kernel log (see M(kentino.gpufleet.xid_facts)).
    type: str
    choices: [auto, journal, dmesg]
    default: auto
  xid_state_file:
    description:
      - Where the XID read position is kept between snapshots. Without it every snapshot reads the current boot.
    type: path
  xid_timeout:
    description: Seconds allowed for journalctl or dmesg (within O(budget)).
    type: int
    default: 60
  severity_overrides:
    description: XID code -> severity (V(critical), V(warning), V(info), V(unknown)) over the catalog default.
    type: dict
    default: {}
  checkpoint_path:
    description: Checkpoint directory whose state is read (mount, space, inodes, drive health; no write). Empty skips it.
    type: str
    default: ""
  checkpoint_size_gb:
    description: Size of one checkpoint in GB, for the free-space verdict.
    type: float
  checkpoint_keep:
    description: Checkpoints kept on the path.
    type: int
    default: 3
  checkpoint_interval_min:
    description: Minutes between checkpoints.
    type: float
    default: 30
  mounts_file:
    description: Mount table that says which filesystem and device hold the checkpoint path.
    type: path
    default: /proc/mounts
  nvme_executable:
    description: Path of nvme-cli when it is not on E(PATH).
    type: path
  smartctl_executable:
    description: Path of smartctl when it is not on E(PATH).
    type: path
  env:
    description: Read the training user's environment (login shell, systemd, /etc/environment).
    type: bool
    default: true
  train_user:
    description: The training user; empty is the user the module runs as.
    type: str
    default: ""
  train_home:
    description: That user's home for the login shell, when it is the user the module runs as.
    type: path
  env_expected:
    description: Training variable -> required value.
    type: dict
  dcgmi_executable:
    description: Path of dcgmi when it is not on E(PATH) (for the DCGM version).
    type: path
  gpu_table:
    description:
      - With O(mode=identity) only. Also read and return the GPU table exactly as M(kentino.gpufleet.gpu_facts) does
        (its facts C(gpufleet_gpus), C(gpufleet_gpu_count), C(gpufleet_gpu_problems), C(gpufleet_driver_version),
        with the processes and C(nvidia-smi -q)), in the same nvidia-smi query as the identity's - the table a
        burn-in or preflight judges as its own (the report's gpu_facts check; not judged in this module's verdict).
    type: bool
    default: false
  nvlink_mark:
    description:
      - With O(mode=identity) only. Also read what a burn-in compares its NVLink read after the load with (the fact
        C(gpufleet_nvlink) of M(kentino.gpufleet.nvlink_facts) with its O(kentino.gpufleet.nvlink_facts#module:gather)
        of platform, fabric_manager, gpus, nvlink and counters; not judged in this module's verdict), in the same
        round trip. Its tool calls are in RV(nvlink_calls), its part in RV(parts).
    type: bool
    default: false
  stop_leftovers:
    description:
      - With O(mode=identity) only. First stop what earlier gpufleet runs left running on the node and remove their
        state, as M(kentino.gpufleet.run_cleanup) does with its O(kentino.gpufleet.run_cleanup#module:run_id) (the
        same code), before anything is read, so that the GPU table shows the GPUs without an interrupted run's burn.
        In the same round trip as the identity; what was stopped is in RV(leftovers) and a warning.
      - When they cannot be stopped the task fails with C(leftovers.failed) (the burn-in and preflight stop the
        node there).
    type: dict
    version_added: "0.3.0"
    suboptions:
      state_dir:
        description: The node's gpufleet state directory.
        type: path
        required: true
      run_id:
        description: The current run, whose work is kept.
        type: str
        required: true
  nvlink_fabric_manager_service:
    description: The fabric manager's systemd unit, for O(nvlink_mark).
    type: str
    default: nvidia-fabricmanager
  nvlink_sysfs_root:
    description: Where sysfs is mounted (NVSwitch detection), for O(nvlink_mark).
    type: path
    default: /sys
  nvlink_procfs_root:
    description: Where procfs is mounted (NVSwitch detection), for O(nvlink_mark).
    type: path
    default: /proc
  dmi_dir:
    description: Directory of the DMI identity files (system BIOS version, board and product names and serials).
    type: path
    default: /sys/class/dmi/id
notes:
  - "Board and product serial numbers and the system journal need root (C(become: true))."
seealso:
  - module: kentino.gpufleet.gpu_facts
  - module: kentino.gpufleet.xid_facts
"""

EXAMPLES = r"""
- name: Nightly audit reading of a node
  kentino.gpufleet.health_snapshot:
    xid_state_file: /var/lib/gpufleet/audit.xid.position
    checkpoint_path: /mnt/nvme/ckpt
    train_user: train
  become: true
  register: gpufleet_result_health_snapshot

- name: GPU table and versions only, in at most 30 seconds
  kentino.gpufleet.health_snapshot:
    budget: 30
    xid: false
    env: false
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
evidence:
  description: The raw lines that justify the verdict.
  returned: always
  type: list
  elements: str
not_run:
  description: Why nothing ran (check mode, a precondition), else null.
  returned: always
  type: str
leftovers:
  description:
    - With O(stop_leftovers), what earlier runs left running and was stopped (C(stopped), as
      M(kentino.gpufleet.run_cleanup) returns it) and C(msg) in one line; C(failed) with C(msg) when they could not be
      stopped.
  returned: when O(stop_leftovers) was given
  type: dict
mode:
  description: The O(mode) the snapshot ran in.
  returned: always
  type: str
ansible_facts:
  description: C(gpufleet_gpus), C(gpufleet_gpu_count), C(gpufleet_driver_version), C(gpufleet_gpu_problems) as
    M(kentino.gpufleet.gpu_facts) sets them, and C(gpufleet_xid) as M(kentino.gpufleet.xid_facts) sets it. With
    O(mode=identity), C(gpufleet_xid) only, when O(xid_state_file) is given.
  returned: when O(mode=audit), or the XIDs were read
  type: dict
gpus:
  description:
    - Per GPU what the GPU table does not hold - index, pci, uuid, read_at (the reading's time, ISO 8601 UTC, from
      nvidia-smi's timestamp), utilization_gpu_pct, clocks_sm_mhz, clocks_sm_max_mhz, inforom_image, remap_banks
      ({max, high, partial, low, none} banks by spare rows left; null where the card has no row remapper).
  returned: always
  type: list
  elements: dict
gpu_sample:
  description: The same reading as one sample in M(kentino.gpufleet.gpu_sample)'s result shape.
  returned: always
  type: dict
storage:
  description: M(kentino.gpufleet.checkpoint_storage)'s observations without the write test; null without O(checkpoint_path).
  returned: always
  type: dict
env:
  description: M(kentino.gpufleet.training_env_facts)'s observations; null when O(env=false).
  returned: always
  type: dict
versions:
  description: driver, dcgm, kernel, bios, bios_date, vbios and inforom (GPU index -> version).
  returned: always
  type: dict
  sample: {driver: "570.133.20", dcgm: "4.2.3", kernel: "6.1.0-28-amd64", bios: "2.1", vbios: {"0": "96.00.99.00.01"}}
platform:
  description: The DMI identity (sys_vendor, product_name, product_serial, board_vendor, board_name, board_serial,
    chassis_serial) where readable.
  returned: always
  type: dict
parts:
  description: Per part (gpus, xid, nvlink, storage, env, versions) - ok, duration_s, error (why it could not be read),
    skipped (V(budget) when the time budget was spent before it).
  returned: always
  type: dict
collected_at:
  description: When the snapshot started (the node's clock, ISO 8601 UTC).
  returned: always
  type: str
duration_s:
  description: Seconds the snapshot took.
  returned: always
  type: float
budget_s:
  description: The time budget it had.
  returned: always
  type: int
tool:
  description: The first nvidia-smi call (argv, rc, timed_out, duration_s, error).
  returned: always
  type: dict
xid_tool:
  description: The journalctl or dmesg call.
  returned: when the XIDs were read
  type: dict
nvlink_calls:
  description: The tool calls of the NVLink read (argv, rc, timed_out, duration_s, error).
  returned: with O(nvlink_mark)
  type: list
  elements: dict
nvidia_smi:
  description: Evidence of the nvidia-smi calls (calls, rejected_fields, unsupported_keys, unparsed).
  returned: when nvidia-smi ran
  type: dict
notes:
  description: Remarks (a tool not found, serials needing root, the XID read's notes).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import (
    fabric_manager,
    judge_env,
    judge_gpu_health,
    judge_samples,
    judge_snapshot,
    judge_storage,
    judge_xid,
    xid_read,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import (
    THRESHOLD_OPTIONS,
    exit_check,
    given_thresholds,
    node_name,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import module_fields
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_reader import ReadError
from ansible_collections.kentino.gpufleet.plugins.module_utils.lease import RUN_ID_RE, describe_stopped, stop_other_runs
from ansible_collections.kentino.gpufleet.plugins.module_utils.snapshot import Snapshot, XidReadError
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULT_ENV_EXPECTED
from ansible_collections.kentino.gpufleet.plugins.module_utils.xid_policy import parse_overrides


def _xid_reader(module, p):
    """read(timeout) -> (gpufleet_xid fact, tool dict, notes) with xid_facts' incremental reader (xid_read.read)."""
    try:
        overrides = parse_overrides(p["severity_overrides"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))

    def read(timeout):
        try:
            got = xid_read.read(module, p["xid_source"], state_file=p["xid_state_file"], timeout_s=timeout,
                                overrides=overrides)
        except ReadError as exc:
            raise XidReadError("%s (run the audit with become: true to read the system journal)" % exc) from None
        if p["xid_state_file"] and not module.check_mode:
            try:
                got.save()
            except (IOError, OSError) as exc:
                raise XidReadError("cannot save the XID read position to %s: %s; make its directory writable "
                                   "(become: true)" % (p["xid_state_file"], exc)) from None
        return got.facts(), got.tool.as_dict() if got.tool is not None else None, list(got.notes)

    return read


def _verdicts(result, facts, host, t):
    """The node's own view: each part's judge with the thresholds given (the report's, from the stage)."""
    sub = {}
    if result.get("gpu_sample") is not None:
        findings = judge_samples.judge(result["gpu_sample"], t, host)
        result["gpu_sample"].update(module_fields(findings))
        sub["gpu_sample"] = findings
    if result.get("storage") is not None:
        findings = judge_storage.judge(result["storage"], t, host)
        result["storage"].update(module_fields(findings))
        result["storage"].update(judge_storage.figures(result["storage"]))
        sub["storage"] = findings
    if result.get("env") is not None:
        findings = judge_env.judge(result["env"], t, host)
        result["env"].update(module_fields(findings))
        sub["env"] = findings
    findings = judge_snapshot.judge(result, t, host)
    if facts:  # mode identity reads no GPU table: the run's own (gpu_facts) is the one judged
        findings += judge_gpu_health.judge(facts, t, host)
    xid = facts.get("gpufleet_xid")
    if xid is not None:
        events, lost = xid.get("events") or [], [{"pci": pci, "why": "lost"} for pci in xid.get("lost_gpus") or []]
        gpus = dict((g["pci"], g["index"]) for g in facts.get("gpufleet_gpus") or [])
        findings += judge_xid.judge(events, lost, t, host, gpus)[0]
    for part in sub.values():
        findings += part
    return findings


def _stop_leftovers(module, options):
    """What earlier runs left running, stopped before anything is read ({stopped, msg}); fails the task (with
    leftovers.failed) when it cannot: the node must not be checked beside an interrupted run's burn."""
    if not RUN_ID_RE.match(options["run_id"]):
        module.fail_json(msg="stop_leftovers.run_id %r is not a run id (letters, digits, . _ -)" % options["run_id"])
    try:
        stopped = stop_other_runs(options["state_dir"], options["run_id"], dry_run=module.check_mode)
    except Exception as exc:  # stopping processes and removing directories: any failure stops the node
        msg = ("cannot stop what earlier runs left running under %s: %s. Fix: look for gpu_burn, dcgmi or "
               "all_reduce_perf still running there, stop them (gpufleet abort), then run again"
               % (options["state_dir"], exc))
        module.fail_json(msg=msg, leftovers={"failed": True, "msg": msg})
    said = describe_stopped(stopped)
    if any(s.get("killed") for s in stopped):
        module.warn("stopped what earlier runs left running: %s" % said)
    return {"stopped": stopped, "msg": ("check mode, would stop: " if module.check_mode else "") + said}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", default="audit", choices=["audit", "identity"]),
            budget=dict(type="int", default=120),
            timeout=dict(type="int", default=60),
            include_q=dict(type="bool", default=True),
            nvidia_smi_executable=dict(type="path"),
            xid=dict(type="bool", default=True),
            xid_source=dict(type="str", default="auto", choices=["auto", "journal", "dmesg"]),
            xid_state_file=dict(type="path"),
            xid_timeout=dict(type="int", default=60),
            severity_overrides=dict(type="dict", default={}),
            checkpoint_path=dict(type="str", default=""),
            checkpoint_size_gb=dict(type="float"),
            checkpoint_keep=dict(type="int", default=3),
            checkpoint_interval_min=dict(type="float", default=30),
            mounts_file=dict(type="path", default="/proc/mounts"),
            nvme_executable=dict(type="path"),
            smartctl_executable=dict(type="path"),
            env=dict(type="bool", default=True),
            train_user=dict(type="str", default=""),
            train_home=dict(type="path"),
            env_expected=dict(type="dict"),
            dcgmi_executable=dict(type="path"),
            dmi_dir=dict(type="path", default="/sys/class/dmi/id"),
            gpu_table=dict(type="bool", default=False),
            nvlink_mark=dict(type="bool", default=False),
            nvlink_fabric_manager_service=dict(type="str", default=fabric_manager.SERVICE),
            nvlink_sysfs_root=dict(type="path", default="/sys"),
            nvlink_procfs_root=dict(type="path", default="/proc"),
            stop_leftovers=dict(type="dict", options=dict(state_dir=dict(type="path", required=True),
                                                          run_id=dict(type="str", required=True))),
            **THRESHOLD_OPTIONS
        ),
        supports_check_mode=True,
    )
    p = module.params
    for name in ("budget", "timeout", "xid_timeout"):
        if p[name] < 1:
            module.fail_json(msg="%s must be at least 1 second, got %s" % (name, p[name]))
    if p["checkpoint_interval_min"] <= 0 or p["checkpoint_keep"] < 0 or (
            p["checkpoint_size_gb"] is not None and p["checkpoint_size_gb"] <= 0):
        module.fail_json(msg="checkpoint_size_gb and checkpoint_interval_min must be > 0 and checkpoint_keep >= 0")
    p["env_expected"] = dict(DEFAULT_ENV_EXPECTED) if p["env_expected"] is None else dict(
        (str(k), None if v is None else str(v)) for k, v in p["env_expected"].items())
    t = given_thresholds(module, {"gpufleet_env_expected": p["env_expected"],
                                  "gpufleet_xid_severity_overrides": p["severity_overrides"] or {}})
    p["env_expected"], p["severity_overrides"] = t["gpufleet_env_expected"], t["gpufleet_xid_severity_overrides"]
    identity = p["mode"] == "identity"
    if p["nvlink_mark"] and not identity:
        module.fail_json(msg="nvlink_mark is the NVLink read before a burn: it needs mode identity (an audit's NVLink "
                             "read is kentino.gpufleet.nvlink_facts)")
    if p["gpu_table"] and not identity:
        module.fail_json(msg="gpu_table returns a run's GPU table from mode identity; an audit reads it always")
    if p["stop_leftovers"] and not identity:
        module.fail_json(msg="stop_leftovers is a run's first step: it needs mode identity (an audit stops nothing)")
    leftovers = _stop_leftovers(module, p["stop_leftovers"]) if p["stop_leftovers"] else None
    if identity:
        # XIDs only as a burn-in's mark (a position file given): the read its window goes on from. The GPU table's
        # -q only when the table is returned (gpu_facts' read).
        p.update(include_q=p["gpu_table"], xid=bool(p["xid"] and p["xid_state_file"]), env=False, checkpoint_path="")
    result, facts = Snapshot(module, p, _xid_reader(module, p)).collect()
    result["mode"] = p["mode"]
    if leftovers is not None:
        result["leftovers"] = leftovers
    if identity:
        result["gpu_sample"] = None  # the run's own sampler and GPU table stay the ones judged
        # the mark's XIDs are the read before the burn, judged with the window's by the report's XID rule
        if not p["gpu_table"]:
            facts = dict((k, v) for k, v in facts.items() if k in ("gpufleet_xid", "gpufleet_nvlink"))
    if result["tool"] is None:
        result["tool"] = {"argv": [], "rc": None, "timed_out": False, "duration_s": 0.0,
                          "error": (result["parts"].get("gpus") or {}).get("error")}
    findings = _verdicts(result, {} if identity else facts, node_name(), t)
    if facts:
        result["ansible_facts"] = facts
    exit_check(module, result, findings)


if __name__ == "__main__":
    main()
