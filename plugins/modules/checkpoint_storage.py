#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: checkpoint_storage
short_description: Prove a checkpoint directory can take the run's checkpoints, for real
description:
  - Checks the directory a training run will checkpoint to against the ways a checkpoint write fails in the field
    (docs/failure-modes.md, checkpoint storage) - a full filesystem, inode exhaustion, a local NVMe gone read-only
    past its endurance, changed permissions.
  - Space and inodes come from C(statvfs) (C(f_bavail), C(f_favail), i.e. what a non-root trainer may use). The space must
    hold O(keep) checkpoints of O(checkpoint_size_gb) plus O(margin_pct).
  - The mount holding the path is found in C(/proc/mounts) (longest path-component prefix; a later mount hides the
    subtree it covers). A C(ro) mount fails, whatever old kernel log lines say.
  - A real write test writes O(write_test_mb) MB to a new file in the directory, C(fsync)s it, reads it back,
    compares and deletes it. The measured rate gives the estimated seconds per checkpoint, the overhead at
    O(interval_min) and the worst-case minutes of work lost (one interval).
  - When the mount is backed by an NVMe namespace (also through device-mapper or md), its health is read with
    C(nvme smart-log -o json) or, if nvme-cli is absent, C(smartctl -j -a) - critical warnings, wear (percent used),
    available spare against its threshold, media errors, terabytes written. Without either tool this is only noted.
  - Verdict RV(verdict=fail) when the path is missing, read-only, not writable, the write test fails or does not read back
    the same bytes, the checkpoints do not fit, inodes run out, or the NVMe reports read-only or degraded
    reliability. RV(verdict=warn) on wear >= O(wear_warn_pct), spare near its threshold, media errors, or overhead
    above O(max_overhead_pct). A failing directory is RV(verdict=fail) without failing the task, so the play carries
    on.
version_added: "0.1.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.node_module
  - kentino.gpufleet.thresholds
attributes:
  check_mode:
    support: partial
    details: In check mode the write test is not run; space, inodes, the mount and the NVMe health are still checked.
options:
  path:
    description: The checkpoint directory (it must exist; the kentino.gpufleet.training_env role creates it).
    type: path
    required: true
  checkpoint_size_gb:
    description:
      - Size of one checkpoint in GB (10^9 bytes). Without it space is reported but not judged and no time per
        checkpoint is estimated.
    type: float
  keep:
    description: How many checkpoints the run keeps on this path at once.
    type: int
    default: 2
  interval_min:
    description: Minutes between checkpoints; also the worst-case work lost when a checkpoint fails.
    type: float
    default: 30
  margin_pct:
    description: Extra free space required on top of O(keep) x O(checkpoint_size_gb), in percent.
    type: float
    default: 10
  write_test_mb:
    description:
      - Size of the real write test in MB (10^6 bytes); 0 disables it. Larger gives a truer rate on drives with a
        big write cache.
    type: int
    default: 256
  min_free_inodes:
    description: Fewer free inodes (C(f_favail)) than this fails; sharded checkpoints create many files.
    type: int
    default: 10000
  max_overhead_pct:
    description: Checkpoint time as a percentage of O(interval_min) above which the verdict is RV(verdict=warn).
    type: float
    default: 5
  wear_warn_pct:
    description: NVMe percentage used (rated endurance consumed) at or above which the verdict is RV(verdict=warn).
    type: int
    default: 80
  mounts_file:
    description:
      - Mount table to read, in /proc/mounts format. Another path serves an agent in a container that sees the
        host's table (C(/host/proc/1/mounts)), or a simulated node.
    type: path
    default: /proc/mounts
  nvme_executable:
    description: Path or name of nvme-cli's C(nvme). Default C(nvme) on E(PATH).
    type: path
  smartctl_executable:
    description: Path or name of C(smartctl), used when nvme-cli is absent. Default C(smartctl) on E(PATH).
    type: path
  timeout:
    description: Seconds for each health tool run and for the whole write test (a hung NFS mount fails the check).
    type: int
    default: 120
notes:
  - Run it as the user that trains (C(become_user)); permissions are judged for the user running the module.
  - The write test measures a single stream with one C(fsync); sharded checkpoints written by several ranks at once
    can be faster on NVMe, slower on NFS.
"""

EXAMPLES = r"""
- name: Check the local NVMe checkpoint directory for a 7B fine-tune (14 GB checkpoints, keep 3, every 30 min)
  kentino.gpufleet.checkpoint_storage:
    path: /mnt/nvme/ckpt
    checkpoint_size_gb: 14
    keep: 3
    interval_min: 30
  become: true
  become_user: train
  register: gpufleet_result_checkpoint_storage

- name: Quick look without writing anything
  kentino.gpufleet.checkpoint_storage:
    path: /mnt/nvme/ckpt
    checkpoint_size_gb: 140
  check_mode: true
  register: gpufleet_result_checkpoint_storage
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
evidence:
  description: Raw lines that justify the verdict (the /proc/mounts line, the write error, the health fields).
  returned: always
  type: list
  elements: str
tool:
  description: The last health tool run (argv, rc, timed_out, duration_s, error); argv empty when none ran (see notes).
  returned: always
  type: dict
path:
  description: The path as given and resolved (symlinks followed).
  returned: always
  type: dict
  sample: {"given": "/ckpt", "resolved": "/mnt/nvme/ckpt", "exists": true}
mount:
  description: The mount holding the path (target, source, fstype, options, read_only, line); null if unknown.
  returned: always
  type: dict
space:
  description:
    - free_gb, total_gb, free_inodes, total_inodes, required_gb (keep x size x (1 + margin)), fits (null when
      checkpoint_size_gb is not given), checkpoints_that_fit.
  returned: always
  type: dict
write_test:
  description:
    - performed, bytes, write_s (write + fsync), read_s, write_mb_per_s, read_mb_per_s, verified (read back equal),
      error, errno, stage (open, write, fsync, read, compare, delete) where it failed.
  returned: always
  type: dict
estimated_checkpoint_s:
  description: checkpoint_size_gb at the measured write rate, seconds; null when not measured.
  returned: always
  type: float
overhead_pct:
  description: estimated_checkpoint_s as a percentage of interval_min.
  returned: always
  type: float
worst_case_lost_min:
  description: Minutes of training lost when a checkpoint fails (the interval).
  returned: always
  type: float
devices:
  description:
    - Per backing block device, the normalised health (tool, critical_warning_flags, temperature_c, percent_used,
      available_spare_pct, available_spare_threshold_pct, data_written_tb, media_errors, error_log_entries,
      unsafe_shutdowns, smart_passed, exit_bits) and its findings.
  returned: always
  type: list
  elements: dict
notes:
  description: What was not checked and why (no nvme-cli, network filesystem, check mode).
  returned: always
  type: list
  elements: str
user:
  description: The user the check ran as (name, uid), i.e. whose permissions were tested.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_storage
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import (
    THRESHOLD_OPTIONS,
    exit_check,
    given_thresholds,
    node_name,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.checkpoint_state import observe


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            checkpoint_size_gb=dict(type="float"),
            keep=dict(type="int", default=2),
            interval_min=dict(type="float", default=30),
            margin_pct=dict(type="float", default=10),
            write_test_mb=dict(type="int", default=256),
            min_free_inodes=dict(type="int", default=10000),
            max_overhead_pct=dict(type="float", default=5),
            wear_warn_pct=dict(type="int", default=80),
            mounts_file=dict(type="path", default="/proc/mounts"),
            nvme_executable=dict(type="path"),
            smartctl_executable=dict(type="path"),
            timeout=dict(type="int", default=120),
            **THRESHOLD_OPTIONS
        ),
        supports_check_mode=True,
    )
    p = module.params
    for name in ("keep", "write_test_mb", "min_free_inodes", "timeout"):
        if p[name] is not None and p[name] < 0:
            module.fail_json(msg="%s must be >= 0, got %s" % (name, p[name]))
    if p["checkpoint_size_gb"] is not None and p["checkpoint_size_gb"] <= 0:
        module.fail_json(msg="checkpoint_size_gb must be > 0, got %s" % p["checkpoint_size_gb"])
    if p["interval_min"] <= 0:
        module.fail_json(msg="interval_min must be > 0, got %s" % p["interval_min"])
    t = given_thresholds(module, {
        "gpufleet_storage_margin_pct": p["margin_pct"], "gpufleet_storage_min_free_inodes": p["min_free_inodes"],
        "gpufleet_storage_max_overhead_pct": p["max_overhead_pct"], "gpufleet_storage_wear_warn_pct": p["wear_warn_pct"]})

    obs = observe(module, p, module.check_mode)
    obs.update(judge_storage.figures(obs))
    exit_check(module, obs, judge_storage.judge(obs, t, node_name()))


if __name__ == "__main__":
    main()
