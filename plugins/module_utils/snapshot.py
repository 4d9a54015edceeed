# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The health snapshot of a node in one pass (stdlib only: runs on the node, from kentino.gpufleet.health_snapshot).

Read-only and bounded, for production nodes under load: no burn, no write test, no diag. Each part runs the
collection's existing readers and parsers and returns what their modules return, so the existing judges judge it:

    gpus      the GPU table of gpu_facts (gpu_table.read_table) with more fields in the same nvidia-smi query:
              the reading's timestamp, utilisation, SM clocks, InfoROM image, the bank remap histogram
    sample    that same reading in gpu_sample's shape (PCIe link under load, throttling: judge_samples)
    xid       the XIDs logged since the previous audit (xid_facts' incremental reader, its own position file)
    nvlink    a burn-in's NVLink read before its load (nvlink_read.MARK_GATHER, nvlink_facts' fact), in mode identity
    storage   checkpoint_storage's observations of the checkpoint path, without the write test
    env       training_env_facts' observations of the training user's environment
    versions  driver, DCGM (dcgmi --version), kernel, system BIOS and board identity (DMI), VBIOS and InfoROM per GPU

The whole snapshot has a time budget: each tool's timeout is cut to what is left, and a part that finds the budget
spent is skipped and named (`parts.<name>.skipped = "budget"`), so one hung tool never holds an audit.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils import checkpoint_state, nvlink_read, training_env_state
from ansible_collections.kentino.gpufleet.plugins.module_utils.gpu_table import MISSING_MESSAGE, facts, read_table
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi import convert_value
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import (
    HISTOGRAM_LEVELS,
    SAMPLE_SPEC,
    gpu_problem,
    spec,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool, run_tool

BANK_LEVELS = HISTOGRAM_LEVELS
# Fields the GPU table does not ask for, added to its one query (names from nvidia_smi_query.FIELDS).
EXTRA_SPEC = spec("read_at", "utilization_gpu_pct", "clocks_sm_mhz", "clocks_sm_max_mhz", "inforom_image",
                  *("remap_banks_" + level for level in HISTOGRAM_LEVELS))
SAMPLE_KEYS = tuple(key for key, _names in SAMPLE_SPEC)
DMI_FILES = ("sys_vendor", "product_name", "product_serial", "board_vendor", "board_name", "board_serial",
             "chassis_serial", "bios_vendor", "bios_version", "bios_date")
_DCGMI_VERSION_RE = re.compile(r"^\s*dcgmi\s+version:\s*(\S+)", re.M)
_TIMESTAMP_RE = re.compile(r"^(\d{4})/(\d{2})/(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?$")


class XidReadError(Exception):
    """The kernel log could not be read: the message names the tool and the fix."""


def parse_dcgmi_version(text):
    """'dcgmi  version: 4.2.3' -> '4.2.3' (None when absent)."""
    match = _DCGMI_VERSION_RE.search(text or "")
    return match.group(1) if match else None


def parse_smi_timestamp(text):
    """nvidia-smi's `timestamp` ('2024/08/09 13:32:56.123', the node's local time) -> ISO 8601 UTC, or None."""
    match = _TIMESTAMP_RE.match((text or "").strip())
    if not match:
        return None
    parts = [int(x) for x in match.groups()[:6]]
    try:
        epoch = time.mktime((parts[0], parts[1], parts[2], parts[3], parts[4], parts[5], 0, 0, -1))
    except (OverflowError, ValueError):
        return None
    epoch += float("0." + match.group(7)) if match.group(7) else 0.0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + ".%03dZ" % int(round((epoch % 1) * 1000) % 1000)


def read_dmi(directory):
    """({file: value}, [unreadable file names]) from /sys/class/dmi/id (serials need root)."""
    values, unreadable = {}, []
    for name in DMI_FILES:
        path = os.path.join(directory, name)
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except (IOError, OSError):
            if os.path.exists(path):
                unreadable.append(name)
            continue
        values[name] = text or None
    return values, unreadable


def _int(value):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    converted, status = convert_value(value if isinstance(value, str) else None, "int")
    return converted if status == "ok" else None


class Budget:
    """Time left for the snapshot; a part asks for a tool timeout within it."""

    def __init__(self, seconds, clock=time.time):
        self.clock = clock
        self.end = clock() + seconds

    def left(self):
        return max(0.0, self.end - self.clock())

    def timeout(self, wanted):
        return max(1, int(min(wanted, self.left())))


class Snapshot:
    """Collect the parts in order; `result` is the module's result without verdict (see collect())."""

    def __init__(self, module, p, read_xids, runner=run_tool):
        self.module = module
        self.p = p
        self.read_xids = read_xids
        self.runner = runner
        self.budget = Budget(p["budget"])
        self.parts = {}
        self.result = {"budget_s": p["budget"], "parts": self.parts, "gpus": [], "versions": {}, "platform": {},
                       "gpu_sample": None, "storage": None, "env": None, "notes": [], "tool": None}
        self.facts = {}

    def run_part(self, name, fn, minimum_s=1.0):
        started = time.time()
        if self.budget.left() < minimum_s:
            self.parts[name] = {"ok": False, "duration_s": 0.0, "error": None, "skipped": "budget"}
            return
        entry = {"ok": True, "duration_s": 0.0, "error": None, "skipped": None}
        self.parts[name] = entry
        try:
            fn()
        except XidReadError as exc:
            entry.update(ok=False, error=str(exc))
        entry["duration_s"] = round(time.time() - started, 3)

    # ---- parts -----------------------------------------------------------------------------------------------
    def gpus(self):
        p = self.p
        exe = find_tool(self.module, "nvidia-smi", p["nvidia_smi_executable"])
        if exe is None:
            self.facts.update(facts([], None, [gpu_problem("tool_missing", MISSING_MESSAGE)]))
            self.parts["gpus"].update(ok=False, error=MISSING_MESSAGE)
            return
        table, evidence, rows = read_table(exe, self.budget.timeout(p["timeout"]),
                                           p["mode"] == "audit" or p["gpu_table"], p["include_q"],
                                           EXTRA_SPEC, runner=self.runner)
        self.facts.update(table)
        self.result["nvidia_smi"] = evidence
        self.result["tool"] = evidence["calls"][0] if evidence["calls"] else None
        sample_rows = []
        for position, gpu in enumerate(table["gpufleet_gpus"]):
            row = rows[position]  # read_table keeps the query's rows in GPU order
            banks = dict((level, _int(row.get("remap_banks_" + level))) for level in BANK_LEVELS)
            self.result["gpus"].append({
                "index": gpu["index"], "pci": gpu["pci"], "uuid": gpu.get("uuid"),
                "read_at": parse_smi_timestamp(row.get("read_at")),
                "utilization_gpu_pct": row.get("utilization_gpu_pct"),
                "clocks_sm_mhz": _int(row.get("clocks_sm_mhz")), "clocks_sm_max_mhz": _int(row.get("clocks_sm_max_mhz")),
                "inforom_image": row.get("inforom_image") or None,
                "remap_banks": banks if any(v is not None for v in banks.values()) else None,
            })
            sample_rows.append(dict((key, gpu.get(key, row.get(key))) for key in SAMPLE_KEYS))
        lost = [pr for pr in table["gpufleet_gpu_problems"] if pr.get("kind") == "lost"]
        self.result["gpu_sample"] = {"samples": [{"t_s": 0.0, "gpus": sample_rows}] if sample_rows else [],
                                 "problems": [{"kind": pr["kind"], "message": pr["message"]} for pr in lost],
                                 "interval_s": 0.0, "stop_reason": None if sample_rows else
                                 "no GPU could be read (see the GPU table's problems)"}
        if not table["gpufleet_gpus"]:
            self.parts["gpus"].update(ok=False, error="; ".join(
                pr["message"] for pr in table["gpufleet_gpu_problems"][:3]) or "no GPU answered")

    def xid(self):
        xid_facts, tool, notes = self.read_xids(self.budget.timeout(self.p["xid_timeout"]))
        self.facts["gpufleet_xid"] = xid_facts
        self.result["xid_tool"] = tool
        self.result["notes"].extend(notes)

    def nvlink(self):
        p = self.p
        params = {"executable": p["nvidia_smi_executable"], "fabric_manager_service": p["nvlink_fabric_manager_service"],
                  "sysfs_root": p["nvlink_sysfs_root"], "procfs_root": p["nvlink_procfs_root"], "baseline": None}
        fact, calls = nvlink_read.read(self.module, params, nvlink_read.MARK_GATHER,
                                       lambda: self.budget.timeout(p["timeout"]))
        self.facts["gpufleet_nvlink"] = fact
        self.result["nvlink_calls"] = calls

    def storage(self):
        p = self.p
        params = {"path": p["checkpoint_path"], "checkpoint_size_gb": p["checkpoint_size_gb"],
                  "keep": p["checkpoint_keep"], "interval_min": p["checkpoint_interval_min"], "write_test_mb": 0,
                  "mounts_file": p["mounts_file"], "nvme_executable": p["nvme_executable"],
                  "smartctl_executable": p["smartctl_executable"], "timeout": self.budget.timeout(p["timeout"])}
        self.result["storage"] = checkpoint_state.observe(self.module, params)

    def env(self):
        p = self.p
        current = training_env_state.current_user()
        user = p["train_user"] or current
        params = {"home": p["train_home"] if user == current else None, "check_systemd": True,
                  "systemctl_executable": None, "etc_environment": "/etc/environment",
                  "environment_d": "/etc/environment.d", "timeout": self.budget.timeout(30)}
        self.result["env"] = training_env_state.observe(self.module, params, user, current, p["env_expected"])

    def versions(self):
        p = self.p
        versions = self.result["versions"]
        versions["driver"] = self.facts.get("gpufleet_driver_version")
        versions["kernel"] = os.uname()[2]
        gpus = self.facts.get("gpufleet_gpus") or []
        versions["vbios"] = dict((str(g["index"]), g["vbios"]) for g in gpus if g.get("vbios"))
        versions["inforom"] = dict((str(g["index"]), g["inforom_image"]) for g in self.result["gpus"]
                                   if g.get("inforom_image"))
        dcgmi = find_tool(self.module, "dcgmi", p["dcgmi_executable"])
        versions["dcgm"] = None
        if dcgmi:
            res = self.runner([dcgmi, "--version"], self.budget.timeout(30))
            versions["dcgm"] = parse_dcgmi_version(res.stdout)
            if versions["dcgm"] is None:
                self.result["notes"].append("dcgmi --version did not say its version (rc %s): %s" % (
                    res.rc, (res.error or res.stderr or res.stdout or "").strip()[:200]))
        else:
            self.result["notes"].append("dcgmi not found: the DCGM version is unknown")
        dmi, unreadable = read_dmi(p["dmi_dir"])
        versions["bios"] = dmi.get("bios_version")
        versions["bios_date"] = dmi.get("bios_date")
        self.result["platform"] = dict((k, v) for k, v in dmi.items() if not k.startswith("bios_"))
        if unreadable:
            self.result["notes"].append("%s: %s not readable (serial numbers need root: become: true)" % (
                p["dmi_dir"], ", ".join(unreadable)))

    def collect(self):
        """Run every enabled part. Returns (result, facts)."""
        started = time.time()
        self.result["collected_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
        self.run_part("gpus", self.gpus)
        if self.p["xid"]:
            self.run_part("xid", self.xid)
        if self.p["nvlink_mark"]:
            self.run_part("nvlink", self.nvlink)
        if self.p["checkpoint_path"]:
            self.run_part("storage", self.storage)
        if self.p["env"]:
            self.run_part("env", self.env)
        self.run_part("versions", self.versions)
        self.result["duration_s"] = round(time.time() - started, 3)
        return self.result, self.facts
