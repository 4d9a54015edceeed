# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge a checkpoint_storage result: the ways a checkpoint fails in the field, each with the fix (stdlib only).

A full filesystem, inode exhaustion, a local NVMe gone read-only past its endurance, changed permissions, a write
that does not read back: each is found at the NEXT checkpoint in a real job, when the work since the last good one is
lost. The job's own figures (checkpoint size, how many are kept, the interval) come with the result; the policy
(margin, inode floor, acceptable overhead, wear) is thresholds.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door, unreadable
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvme_smart import assess_health

CHECK = "checkpoint_storage"
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads: what a module passes it.
THRESHOLDS = ("gpufleet_storage_margin_pct", "gpufleet_storage_min_free_inodes",
              "gpufleet_storage_max_overhead_pct", "gpufleet_storage_wear_warn_pct")

CODES = {
    "STORAGE_FAIL": ("fail", "missing or read-only path, not writable, full, out of inodes, a write that failed or did "
                             "not read back, or an NVMe that is read-only/degraded/failing; the message says which"),
    "STORAGE_WARN": ("warn", "checkpoint overhead above gpufleet_storage_max_overhead_pct, NVMe wear, spare near its "
                             "threshold, media errors"),
    "STORAGE_ERROR": ("error", "statvfs failed: space and inodes unknown"),
}
GB = 1000 * 1000 * 1000
READ_ONLY_ACTION = ("check `dmesg` for 'Remounting filesystem read-only', fsck the filesystem, check NVMe health "
                    "(nvme smart-log), then remount read-write or move checkpoints")
_REPLACE = ("critical_warning_read_only", "critical_warning_reliability_degraded", "smart_failing")


def _storage(severity, host, message, evidence=None):
    # One code per severity: the message says which way the storage fails and the fix, in the operator's words.
    return finding(severity, "STORAGE_" + severity.upper(), "%s: %s" % (host, message),
                   "fix the checkpoint storage on %s: %s" % (host, message), evidence)


def _write_failure(res, path, user, owner_mode=None):
    """(message, raw line) of a failed write test; owner_mode: the directory's owner and mode (the module's
    path.owner_mode), so a permission failure names who may write there."""
    err, stage = res.get("errno"), res.get("stage")
    raw = "%s: %s (%s) at %s" % (path, res.get("error"), err, stage)
    if err in ("EACCES", "EPERM"):
        return "%s is not writable by %s (uid %s): %s; chown/chmod it for the training user or run as its owner" % (
            path, user.get("name"), user.get("uid"), owner_mode or "owner unknown"), raw
    if err == "EROFS":
        return "%s is on a read-only filesystem: %s" % (path, READ_ONLY_ACTION), raw
    if err in ("ENOSPC", "EDQUOT"):
        return "%s is full (%s) during a %s-byte write test: free space or raise the quota" % (
            path, err, res.get("bytes")), raw
    if err == "EIO":
        return ("%s: I/O error while writing (%s): check `dmesg` and the drive's health, replace it if media errors "
                "grow" % (path, stage)), raw
    if err == "ETIMEDOUT":
        return "%s: %s: the storage is hanging (NFS server? failing drive?)" % (path, res.get("error")), raw
    if stage == "compare":
        return "%s: %s: silent data corruption on this storage, do not checkpoint here" % (path, res.get("error")), raw
    return "%s: write test failed at %s: %s" % (path, stage, res.get("error")), raw


def _space(result, t, host, given):
    out = []
    space = result.get("space") or {}
    job = result.get("job") or {}
    raw = space.get("statvfs_line")
    if space.get("error"):
        return [_storage("error", host, "statvfs(%s) failed: %s" % (given, space["error"]))]
    free_gb = space.get("free_gb")
    size, keep = job.get("checkpoint_size_gb"), job.get("keep")
    keep = 1 if keep is None else keep  # unknown: at least the checkpoint being written
    if free_gb is not None and size:
        required = size * keep * (1 + t["gpufleet_storage_margin_pct"] / 100.0)
        if free_gb < required:
            out.append(_storage("fail", host, "%s has %.1f GB free but %d checkpoints of %s GB (+%s%% margin) need "
                                "%.1f GB: free space, lower keep, or move checkpoints to a bigger volume" % (
                                    given, free_gb, keep, size, t["gpufleet_storage_margin_pct"], required), [raw]))
    inodes, total = space.get("free_inodes"), space.get("total_inodes")
    # total 0: filesystems without an inode limit (btrfs, some network filesystems).
    if total and inodes is not None and inodes < t["gpufleet_storage_min_free_inodes"]:
        out.append(_storage("fail", host, "%s has only %d free inodes (< %d): sharded checkpoints will fail with "
                            "ENOSPC; delete old files or recreate the filesystem with more inodes" % (
                                given, inodes, t["gpufleet_storage_min_free_inodes"]), [raw]))
    return out


def _no_figures():
    return {"estimated_checkpoint_s": None, "overhead_pct": None, "worst_case_lost_min": None, "write_mb_per_s": None}


@judge_door(CHECK, empty=_no_figures, takes_t=False)
def figures(result):
    """Estimated seconds per checkpoint and its overhead at the job's interval, from the measured write rate."""
    job = result.get("job") or {}
    rate = (result.get("write_test") or {}).get("write_mb_per_s")
    out = {"estimated_checkpoint_s": None, "overhead_pct": None, "worst_case_lost_min": job.get("interval_min"),
           "write_mb_per_s": rate}
    if rate and job.get("checkpoint_size_gb") and job.get("interval_min"):
        est = job["checkpoint_size_gb"] * GB / (rate * 1e6)
        out["estimated_checkpoint_s"] = round(est, 2)
        out["overhead_pct"] = round(est / (job["interval_min"] * 60.0) * 100.0, 3)
    return out


@judge_door(CHECK)
def judge(result, t, host):
    """[finding] for one checkpoint_storage result."""
    path = result.get("path") or {}
    given = path.get("given") or "the checkpoint directory"
    if path.get("exists") is None:  # not looked at: no claim either way
        return [unreadable(CHECK, host, "the result does not say whether %s exists" % given)]
    if not path.get("exists"):
        return [_storage("fail", host, "%s does not exist: create it (the kentino.gpufleet.training_env role creates "
                         "it) or fix the checkpoint path" % given)]
    if not path.get("is_dir", True):
        return [_storage("fail", host, "%s is not a directory: point the checkpoint path at a directory" % given)]
    out = []
    mount = result.get("mount")
    if mount and mount.get("read_only"):
        out.append(_storage("fail", host, "%s is on a read-only mount (%s on %s): %s" % (
            given, mount.get("source"), mount.get("target"), READ_ONLY_ACTION), [mount.get("line")]))
    out.extend(_space(result, t, host, given))
    user = result.get("user") or {}
    wt = result.get("write_test") or {}
    if path.get("writable") is False and not wt.get("performed"):  # the write test says it better when it ran
        out.append(_storage("fail", host, "%s is not writable by %s (uid %s): %s" % (
            given, user.get("name"), user.get("uid"), path.get("owner_mode") or "owner unknown")))
    if wt.get("error"):
        message, raw = _write_failure(wt, given, user, path.get("owner_mode"))
        out.append(_storage("fail", host, message, [raw]))
    fig = figures(result)
    job = result.get("job") or {}
    if fig["overhead_pct"] is not None and fig["overhead_pct"] > t["gpufleet_storage_max_overhead_pct"]:
        out.append(_storage("warn", host, "%s writes at %.0f MB/s: a %s GB checkpoint takes ~%.0f s, %.1f%% of the "
                            "%s-min interval (> %s%%): use faster local NVMe, async checkpointing, or a longer "
                            "interval" % (given, wt["write_mb_per_s"], job["checkpoint_size_gb"],
                                          fig["estimated_checkpoint_s"], fig["overhead_pct"], job["interval_min"],
                                          t["gpufleet_storage_max_overhead_pct"])))
    for device in result.get("devices") or []:
        health = device.get("health")
        if not health or not device.get("readable"):
            continue
        summary = "%s: critical_warning=%s percent_used=%s available_spare=%s/%s media_errors=%s" % (
            device.get("device"), health.get("critical_warning"), health.get("percent_used"),
            health.get("available_spare_pct"), health.get("available_spare_threshold_pct"), health.get("media_errors"))
        for item in assess_health(health, wear_warn_pct=t["gpufleet_storage_wear_warn_pct"]):
            tail = ": replace the drive; copy the checkpoints off it now" if item["kind"] in _REPLACE else ""
            out.append(_storage(item["severity"], host, item["message"] + tail, [summary]))
    return out
