# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The health gate a node passes before it joins an elastic training job (stdlib only: runs on the node, from the
elastic launcher, before every rendezvous).

A node with a lost GPU, a critical XID since boot, a GPU another process holds, or checkpoint storage that is
read-only or full would only fail the job again and burn its restart budget. The gate runs the preflight's
non-invasive checks with the collection's own parsers and judges (the fleet report's findings, word for word):

    gpus     nvidia-smi --query-gpu and --query-compute-apps  -> judge_gpu_health (unreadable, missing GPUs, memory
                                                                  counters at their RMA limit)
    xid      the kernel log of this boot (journalctl -k, dmesg)  -> judge_xid (GPU lost, RMA XIDs, other critical)
    busy     the compute processes on each GPU                   -> judge_busy (severity fail: a neighbour process
                                                                  is how a job that fits runs out of memory)
    storage  the checkpoint directory: exists, writable, mount not read-only, space for keep x size, inodes
                                                                -> judge_storage

evaluate() returns {"verdict": "pass"|"refuse", "findings", "refusing", "checks", "duration_s"}; a finding whose
severity is in `refuse_on` (fail and error: a check that could not run keeps the node out too) refuses the node.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import pwd
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils import (
    judge_busy,
    judge_gpu_health,
    judge_storage,
    judge_xid,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import XidScanner
from ansible_collections.kentino.gpufleet.plugins.module_utils.mounts import find_mount, read_mounts
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi import (
    COMPUTE_APPS_FIELDS,
    parse_compute_apps,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import (
    FACTS_SPEC,
    QueryGpu,
    public_problems,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool

CHECKS = ("gpus", "xid", "busy", "storage")
# Thresholds the gate sets differently from the report's defaults (the inventory's gate thresholds still win).
GATE_DEFAULTS = {"gpufleet_busy_gpu_severity": "fail"}
GB = 1000 * 1000 * 1000

CODES = {
    "NODE_DRAINED": ("fail", "the operator drained the node (gpufleet-elastic drain): it does not rejoin until undrained"),
}


def thresholds(overrides=None):
    t = dict(GATE_DEFAULTS)
    t.update(overrides or {})
    return complete(t)


def read_gpus(nvidia_smi, timeout_s, runner=run_tool):
    """{"facts": gpu_facts-shaped facts, "lost": [lost entries], "tools": [tool dicts]} from nvidia-smi."""
    query = QueryGpu(nvidia_smi, FACTS_SPEC, timeout_s, runner=runner)
    answer = query.run()
    problems = public_problems(answer["problems"])
    gpus = [dict(row, processes=[]) for row in answer["gpus"]]
    if gpus:
        apps = runner([nvidia_smi, "--query-compute-apps=" + ",".join(COMPUTE_APPS_FIELDS), "--format=csv,nounits"],
                      timeout_s)
        query.calls.append(apps.as_dict())
        if apps.error or apps.timed_out:
            problems.append({"kind": "tool_error", "pci": None, "index": None,
                             "message": "nvidia-smi --query-compute-apps: %s" % (apps.error or "timed out")})
        else:
            parsed = parse_compute_apps(apps.stdout)
            problems.extend(public_problems(parsed["problems"]))
            by_pci, by_uuid = {}, {}
            for proc in parsed["processes"]:
                entry = {"pid": proc["pid"], "name": proc["name"], "used_memory_mib": proc["used_memory_mib"]}
                (by_pci.setdefault(proc["pci"], []) if proc["pci"] else by_uuid.setdefault(proc["gpu_uuid"], [])
                 ).append(entry)
            for gpu in gpus:
                gpu["processes"] = by_pci.get(gpu.get("pci"), []) + by_uuid.get(gpu.get("uuid"), [])
    lost, seen = [], set()
    for p in problems:  # the query and compute-apps calls both name a lost GPU: one entry per GPU
        if p.get("kind") == "lost" and (p.get("pci"), p.get("index")) not in seen:
            seen.add((p.get("pci"), p.get("index")))
            lost.append({"index": p.get("index"), "pci": p.get("pci"), "line": p.get("message"),
                         "why": "lost (nvidia-smi)"})
    facts = {"gpufleet_gpus": gpus, "gpufleet_gpu_count": len(gpus), "gpufleet_gpu_problems": problems}
    return {"facts": facts, "lost": lost, "tools": query.calls}


def _journal_failed(res):
    if res.error or res.timed_out:
        return res.error or "journalctl timed out"
    if "No journal files" in (res.stderr or ""):
        return "journalctl found no journal files"
    if "not seeing messages from other users" in (res.stderr or ""):
        return ("journalctl hides the kernel's messages from this user (add it to the systemd-journal group; the "
                "elastic_training unit does)")
    if res.rc not in (0, 1) or (res.rc == 1 and res.stdout.strip()):
        return "journalctl exited %s: %s" % (res.rc, (res.stderr or "").strip()[-200:])
    return None


def read_xid(journalctl, dmesg, timeout_s, runner=run_tool, overrides=None):
    """XID events and lost GPUs of the current boot: the journal (kernel transport) or, without it, dmesg."""
    notes = []
    scanner = XidScanner(severity_overrides=overrides)
    source = None
    if journalctl:
        res = runner([journalctl, "-k", "-b", "0", "-o", "json", "--no-pager", "--all"], timeout_s)
        why = _journal_failed(res)
        if why is None:
            source = "journal"
            for line in res.stdout.splitlines():
                scanner.feed_journal_line(line)
        else:
            notes.append(why)
    if source is None and dmesg:
        res = runner([dmesg], timeout_s)
        if res.ok:
            source = "dmesg"
            for line in res.stdout.splitlines():
                scanner.feed_line(line)
        else:
            notes.append("dmesg: %s" % (res.error or "timed out" if res.error or res.timed_out else
                                        "exited %s: %s" % (res.rc, (res.stderr or "").strip()[-200:])))
    result = scanner.result()
    return {"source": source, "events": result["events"], "lost_gpus": result["lost_gpus"], "notes": notes}


def read_storage(path, checkpoint_size_gb=None, keep=1, mounts_file="/proc/mounts"):
    """The checkpoint directory as judge_storage reads it (no write test: the gate must stay quick and harmless)."""
    resolved = os.path.realpath(path)
    try:
        user = {"name": pwd.getpwuid(os.geteuid()).pw_name, "uid": os.geteuid()}
    except KeyError:
        user = {"name": str(os.geteuid()), "uid": os.geteuid()}
    obs = {"path": {"given": path, "resolved": resolved, "exists": os.path.exists(resolved),
                    "is_dir": os.path.isdir(resolved), "writable": None, "owner_mode": None},
           "job": {"checkpoint_size_gb": checkpoint_size_gb, "keep": keep, "interval_min": None},
           "mount": None, "space": {}, "devices": [], "user": user, "write_test": {"performed": False}}
    if not obs["path"]["is_dir"]:
        return obs
    obs["path"]["writable"] = os.access(resolved, os.W_OK | os.X_OK)
    obs["mount"] = find_mount(read_mounts(mounts_file)["mounts"], resolved)
    try:
        st = os.statvfs(resolved)
    except OSError as exc:
        obs["space"] = {"error": exc.strerror or str(exc)}
        return obs
    obs["space"] = {"free_gb": round(st.f_bavail * st.f_frsize / GB, 3), "free_inodes": st.f_favail,
                    "total_inodes": st.f_files,
                    "statvfs_line": "statvfs %s: f_bavail=%d f_frsize=%d f_favail=%d f_files=%d" % (
                        resolved, st.f_bavail, st.f_frsize, st.f_favail, st.f_files)}
    return obs


def drained(host, marker):
    return finding("fail", "NODE_DRAINED", "%s was drained by the operator (%s exists): it stays out of the job" % (
        host, marker), "undrain it when it is fixed: gpufleet-elastic undrain (or the role's undrain task)",
        ["drain marker %s" % marker])


def evaluate(cfg, host, runner=run_tool, clock=time.monotonic):
    """Run the enabled checks of cfg (the launcher's "gate" section plus checkpoint settings) and judge them.

    cfg keys: checks, nvidia_smi, journalctl, dmesg, timeout_s, thresholds, refuse_on, checkpoint_dir,
    checkpoint_size_gb, keep, mounts_file, drain_file. Never raises on bad tool output: that is an error finding.
    """
    started = clock()
    t = thresholds(cfg.get("thresholds"))
    checks = [c for c in cfg.get("checks", CHECKS) if c in CHECKS]
    timeout_s = cfg.get("timeout_s", 60)
    findings, report = [], {}
    drain_file = cfg.get("drain_file")
    if drain_file and os.path.exists(drain_file):
        findings.append(drained(host, drain_file))
        report["drain"] = {"verdict": "fail"}
    gpus, lost = [], []
    if "gpus" in checks or "busy" in checks:
        read = read_gpus(cfg.get("nvidia_smi") or "nvidia-smi", timeout_s, runner)
        gpus, lost = read["facts"]["gpufleet_gpus"], read["lost"]
        if "gpus" in checks:
            found = judge_gpu_health.judge(read["facts"], t, host, [e["pci"] for e in lost if e["pci"]])
            report["gpus"] = {"gpus": len(gpus), "lost": len(lost), "findings": len(found)}
            findings.extend(found)
        if "busy" in checks:
            found = judge_busy.judge(gpus, t, host)
            report["busy"] = {"busy_gpus": len(found), "findings": len(found)}
            findings.extend(found)
    events = []
    if "xid" in checks:
        xid = read_xid(cfg.get("journalctl", "journalctl"), cfg.get("dmesg", "dmesg"), timeout_s, runner,
                       t.get("gpufleet_xid_severity_overrides"))
        events = xid["events"]
        lost = lost + [{"pci": pci, "line": "kernel log: %s fell off the bus" % pci, "why": "lost"}
                       for pci in xid["lost_gpus"]]
        report["xid"] = {"source": xid["source"], "events": len(events), "notes": xid["notes"]}
        if xid["source"] is None:
            findings.append(finding("error", "CHECK_ERROR", "%s: the kernel log of this boot could not be read: %s"
                                    % (host, "; ".join(xid["notes"]) or "no journalctl or dmesg"),
                                    "give the training user read access to the journal (group systemd-journal) or "
                                    "the kernel ring buffer, or drop 'xid' from the gate checks", xid["notes"]))
    if events or lost:
        index = dict((g.get("pci"), g.get("index")) for g in gpus if g.get("pci"))
        found, _timeline = judge_xid.judge(events, lost, t, host, index)
        findings.extend(found)
    if "storage" in checks and cfg.get("checkpoint_dir"):
        obs = read_storage(cfg["checkpoint_dir"], cfg.get("checkpoint_size_gb"), cfg.get("keep") or 1,
                           cfg.get("mounts_file") or "/proc/mounts")
        found = judge_storage.judge(obs, t, host)
        report["storage"] = {"free_gb": obs["space"].get("free_gb"), "read_only": bool((obs["mount"] or {}).get(
            "read_only")), "findings": len(found)}
        findings.extend(found)
    refuse_on = cfg.get("refuse_on") or ["fail", "error"]
    refusing = [f for f in findings if f["severity"] in refuse_on]
    return {"verdict": "refuse" if refusing else "pass", "findings": findings, "refusing": refusing,
            "checks": report, "duration_s": round(clock() - started, 3)}
