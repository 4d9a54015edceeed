# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What checkpoint_storage observes about a checkpoint directory (stdlib only: runs on the node), shared by the
checkpoint_storage module and health_snapshot (which reads the same state without the write test).

The path (exists, directory, writable, owner and mode), the mount that holds it (read-only or not, from the mount
table), statvfs (free space and inodes), a real write + fsync + read-back + compare (when write_test_mb > 0) and the
health of the NVMe or disk beneath it (nvme smart-log, else smartctl). The judgement is judge_storage's.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import hashlib
import os
import pwd
import socket
import stat
import threading
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import planned_tool
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


def observe(module, p, check_mode=False):
    """The observations of one checkpoint directory. p: path, checkpoint_size_gb, keep, interval_min, write_test_mb,
    mounts_file, nvme_executable, smartctl_executable, timeout. Never raises for a path or tool that fails."""
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

    mounts = read_mounts(p["mounts_file"])
    if mounts["unparsed"]["count"]:
        sample = mounts["unparsed"]["samples"][0]
        notes.append("%d lines of %s not understood, e.g. %r (%s)" % (
            mounts["unparsed"]["count"], p["mounts_file"], sample["line"], sample["reason"]))
    if not obs["path"]["is_dir"]:
        return obs
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

    if check_mode:
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
    return obs
