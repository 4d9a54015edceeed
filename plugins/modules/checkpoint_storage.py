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
  - ansible.builtin.action_common_attributes
  - kentino.gpufleet.node_module
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
extends_documentation_fragment:
  - kentino.gpufleet.node_module.check_result
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

import errno
import hashlib
import os
import pwd
import socket
import stat
import threading
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_storage
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import exit_check, node_name, planned_tool
from ansible_collections.kentino.gpufleet.plugins.module_utils.mounts import (
    backing_devices,
    disk_for_source,
    find_mount,
    nvme_devices_for_source,
    read_mounts,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvme_smart import (
    parse_nvme_smart_log,
    parse_smartctl_json,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool, run_tool

MB = 1000 * 1000
GB = 1000 * MB
_CHUNK = 4 * 1024 * 1024
_NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "fuse.sshfs", "lustre", "beegfs", "gpfs",
               "fuse.juicefs", "9p", "virtiofs")


def _user():
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return {"name": name, "uid": uid}


def _owner_mode(path):
    try:
        st = os.stat(path)
    except OSError:
        return "owner unknown"
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    return "owned by %s (uid %d), mode %s" % (owner, st.st_uid, oct(stat.S_IMODE(st.st_mode))[2:].zfill(4))


def _chunk(index, block):
    # A per-chunk header defeats deduplicating/compressing storage that would fake the rate.
    header = ("gpufleet-%08d-" % index).encode("ascii")
    return header + block[len(header):]


def write_test(directory, size_bytes):
    """Write, fsync, read back, compare, delete one file in directory. Returns a dict, never raises."""
    result = {"performed": True, "bytes": 0, "write_s": None, "read_s": None, "write_mb_per_s": None,
              "read_mb_per_s": None, "verified": False, "error": None, "errno": None, "stage": None, "file": None}
    name = ".gpufleet-write-test-%s-%d-%s" % (socket.gethostname(), os.getpid(), os.urandom(4).hex())
    path = os.path.join(directory, name)
    result["file"] = path
    block = os.urandom(_CHUNK)
    written = hashlib.sha256()
    stage = "open"
    fd = None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        stage = "write"
        started = time.monotonic()
        remaining, index = size_bytes, 0
        while remaining > 0:
            data = _chunk(index, block)[:remaining]
            view = memoryview(data)
            while view:
                count = os.write(fd, view)
                view = view[count:]
            written.update(data)
            remaining -= len(data)
            result["bytes"] += len(data)
            index += 1
        stage = "fsync"
        os.fsync(fd)
        os.close(fd)
        fd = None
        try:  # the new directory entry must be durable too, as for a real checkpoint
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass
        elapsed = max(time.monotonic() - started, 1e-6)
        result["write_s"] = round(elapsed, 4)
        result["write_mb_per_s"] = round(result["bytes"] / MB / elapsed, 1)

        stage = "read"
        fd = os.open(path, os.O_RDONLY)
        if hasattr(os, "posix_fadvise"):
            try:  # drop our pages so the read comes from the device, not the page cache (best effort)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
        read_hash = hashlib.sha256()
        started = time.monotonic()
        total = 0
        while True:
            data = os.read(fd, _CHUNK)
            if not data:
                break
            read_hash.update(data)
            total += len(data)
        os.close(fd)
        fd = None
        elapsed = max(time.monotonic() - started, 1e-6)
        result["read_s"] = round(elapsed, 4)
        result["read_mb_per_s"] = round(total / MB / elapsed, 1)
        stage = "compare"
        if total != result["bytes"] or read_hash.digest() != written.digest():
            result["error"] = "read back %d bytes that differ from the %d written" % (total, result["bytes"])
            result["stage"] = stage
        else:
            result["verified"] = True
        stage = "delete"
        os.unlink(path)
    except OSError as exc:
        result["error"] = exc.strerror or str(exc)
        result["errno"] = errno.errorcode.get(exc.errno, exc.errno) if exc.errno else None
        result["stage"] = stage
    finally:
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        if stage != "open" and os.path.lexists(path):
            try:
                os.unlink(path)
            except OSError:
                pass
    return result


def _run_write_test(directory, size_bytes, timeout_s):
    """write_test in a daemon thread: a hung mount (dead NFS server) must fail the check, not hang the play."""
    box = {}
    thread = threading.Thread(target=lambda: box.update(result=write_test(directory, size_bytes)))
    thread.daemon = True
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return {"performed": True, "bytes": None, "write_s": None, "read_s": None, "write_mb_per_s": None,
                "read_mb_per_s": None, "verified": False, "errno": "ETIMEDOUT", "stage": "hung", "file": None,
                "error": "write test did not finish within %d s" % timeout_s}
    return box["result"]


def _device_health(module, device, params, notes):
    """Run nvme-cli (or smartctl) for one NVMe controller; returns (entry, tool_dict or None)."""
    # nvme-cli only speaks NVMe; smartctl reads both (and is the only choice for SATA/SAS disks).
    nvme = find_tool(module, "nvme", params["nvme_executable"]) if nvme_devices_for_source(device) else None
    smartctl = find_tool(module, "smartctl", params["smartctl_executable"])
    if nvme:
        argv = [nvme, "smart-log", device, "-o", "json"]
    elif smartctl:
        argv = [smartctl, "-j", "-a", device]
    else:
        notes.append("no %s found: health of %s not checked (install %s)" % (
            "nvme-cli or smartctl" if nvme_devices_for_source(device) else "smartctl", device,
            "nvme-cli" if nvme_devices_for_source(device) else "smartmontools"))
        return {"device": device, "tool": None, "health": None, "readable": False}, None
    res = run_tool(argv, params["timeout"])
    if nvme:
        health = parse_nvme_smart_log(res.stdout)
    else:
        health = parse_smartctl_json(res.stdout, rc=res.rc)
    health["device"] = health.get("device") or device
    readable = health["percent_used"] is not None or health["critical_warning"] is not None \
        or health.get("smart_passed") is not None
    entry = {"device": device, "tool": os.path.basename(argv[0]), "health": health,
             "readable": bool(readable and not res.error and not res.timed_out)}
    if not entry["readable"]:
        why = res.error or ("timed out" if res.timed_out else "; ".join(
            p["message"] for p in health["problems"][:2]) or "rc %s" % res.rc)
        notes.append("health of %s not read with %s: %s%s" % (device, os.path.basename(argv[0]), why,
                                                             " (needs root: become: true)" if "ermission" in
                                                             (res.stderr + res.stdout + why) else ""))
    return entry, res.as_dict()


def _targets_for(mount):
    """Controllers/disks to ask about, from the mount source (nvme0n1p1 -> /dev/nvme0)."""
    targets = []
    for dev in backing_devices(mount["source"]) or [mount["source"]]:
        nv = nvme_devices_for_source(dev)
        target = nv["controller"] if nv else disk_for_source(dev)
        if target and target not in targets:
            targets.append(target)
    return targets


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
    t = {"gpufleet_storage_margin_pct": p["margin_pct"], "gpufleet_storage_min_free_inodes": p["min_free_inodes"],
         "gpufleet_storage_max_overhead_pct": p["max_overhead_pct"], "gpufleet_storage_wear_warn_pct": p["wear_warn_pct"]}

    notes = []
    given = p["path"]
    resolved = os.path.realpath(given)
    obs = {
        "tool": planned_tool([]),  # argv [] = no health tool ran (none applies or none installed: see notes)
        "job": {"checkpoint_size_gb": p["checkpoint_size_gb"], "keep": p["keep"], "interval_min": p["interval_min"]},
        "path": {"given": given, "resolved": resolved, "exists": os.path.exists(resolved),
                 "is_dir": os.path.isdir(resolved), "writable": None, "owner_mode": None},
        "mount": None, "space": {}, "devices": [], "notes": notes, "user": _user(),
        "write_test": {"performed": False, "bytes": None, "write_s": None, "read_s": None, "write_mb_per_s": None,
                       "read_mb_per_s": None, "verified": None, "error": None, "errno": None, "stage": None,
                       "file": None},
    }

    def finish():
        obs.update(judge_storage.figures(obs))
        exit_check(module, obs, judge_storage.judge(obs, t, node_name()))

    mounts = read_mounts(p["mounts_file"])
    if mounts["unparsed"]["count"]:
        sample = mounts["unparsed"]["samples"][0]
        notes.append("%d lines of %s not understood, e.g. %r (%s)" % (
            mounts["unparsed"]["count"], p["mounts_file"], sample["line"], sample["reason"]))
    if not obs["path"]["is_dir"]:
        finish()
    obs["path"]["writable"] = os.access(resolved, os.W_OK | os.X_OK)
    obs["path"]["owner_mode"] = _owner_mode(resolved)

    mount = obs["mount"] = find_mount(mounts["mounts"], resolved)
    if mount is None:
        notes.append("no entry of %s holds %s: mount state unknown" % (p["mounts_file"], resolved))
    try:
        st = os.statvfs(resolved)
        obs["space"] = {"free_gb": round(st.f_bavail * st.f_frsize / GB, 3),
                        "total_gb": round(st.f_blocks * st.f_frsize / GB, 3), "free_inodes": st.f_favail,
                        "total_inodes": st.f_files,
                        "statvfs_line": "statvfs %s: f_bavail=%d f_frsize=%d f_favail=%d f_files=%d" % (
                            resolved, st.f_bavail, st.f_frsize, st.f_favail, st.f_files)}
    except OSError as exc:
        obs["space"] = {"error": exc.strerror or str(exc)}
    if not p["checkpoint_size_gb"]:
        notes.append("checkpoint_size_gb not given: free space reported, not judged")

    if module.check_mode:
        notes.append("check mode: write test skipped")
    elif p["write_test_mb"] > 0:
        obs["write_test"] = _run_write_test(resolved, p["write_test_mb"] * MB, p["timeout"])
    else:
        notes.append("write_test_mb=0: write test disabled")

    if mount is not None:
        if (mount["fstype"] or "").lower() in _NETWORK_FS or ":" in mount["source"] or mount["source"].startswith("//"):
            notes.append("%s is a network filesystem (%s from %s): no local drive health to read" % (
                mount["target"], mount["fstype"], mount["source"]))
        else:
            targets = _targets_for(mount)
            if not targets:
                notes.append("%s (%s) is not backed by a local NVMe or disk device: health not checked" % (
                    mount["target"], mount["source"]))
            for target in targets:
                entry, tool_dict = _device_health(module, target, p, notes)
                obs["devices"].append(entry)
                if tool_dict:
                    obs["tool"] = tool_dict
    finish()


if __name__ == "__main__":
    main()
