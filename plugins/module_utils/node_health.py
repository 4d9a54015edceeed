# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The node health collector: one run writes gpufleet_health.prom for node_exporter (stdlib only: runs on the node
from the gpufleet-node-health systemd timer, installed by the kentino.gpufleet.gpu_monitoring role).

What the XID watcher cannot see in the kernel log, read with the collection's existing parsers: retired pages, row
remaps and the bank remap availability histogram, clock throttle reasons and ECC counters (nvidia_smi_query), NVLink
state, speed and error counters, each GPU's fabric registration and the fabric manager's service (nvidia_smi_nvlink,
fabric_manager), the checkpoint storage (mounts + statvfs) and NVMe health (nvme_smart). Observations only: the thresholds live in the
alert rules. A source that cannot be read says so in gpufleet_health_collector_up{collector} = 0 and in the log;
the others are still written.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import glob
import os
import shutil
import sys
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils import ib_sysfs
from ansible_collections.kentino.gpufleet.plugins.module_utils.fabric_manager import SERVICE as FM_SERVICE
from ansible_collections.kentino.gpufleet.plugins.module_utils.fabric_manager import parse_systemctl_show
from ansible_collections.kentino.gpufleet.plugins.module_utils.mounts import (
    backing_devices,
    find_mount,
    nvme_devices_for_source,
    read_mounts,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi import THROTTLE_BITS, convert_value, parse_q
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_nvlink import (
    link_totals,
    parse_nvlink_errors,
    parse_nvlink_status,
    q_fabric,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import (
    HISTOGRAM_LEVELS,
    IDENTITY,
    MEMORY_HEALTH,
    QueryGpu,
    spec,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvme_smart import (
    CRITICAL_WARNING_BITS,
    parse_nvme_smart_log,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci
from ansible_collections.kentino.gpufleet.plugins.module_utils.prom_textfile import MetricFamily, atomic_write, render
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool
from ansible_collections.kentino.gpufleet.plugins.module_utils.xid_watcher import ConfigError, load_config

HEALTH_PROM = "gpufleet_health.prom"
GPU_SPEC = spec(*IDENTITY + ("temperature_c",) + MEMORY_HEALTH + ("throttle_reasons",)
                + tuple("remap_banks_" + level for level in HISTOGRAM_LEVELS))


class Families:
    """The metric families of one run, created in a fixed order."""

    def __init__(self):
        self.items = []
        self.by_name = {}

    def get(self, name, kind, help_text):
        if name not in self.by_name:
            self.by_name[name] = MetricFamily(name, kind, help_text)
            self.items.append(self.by_name[name])
        return self.by_name[name]


def _number(value):
    """A value from the query (the histogram fields are not typed by the parser: convert them the parser's way)."""
    if isinstance(value, bool):
        return 1 if value else 0
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        converted, status = convert_value(value, "int")
        return converted if status == "ok" else None
    return None


def collect_gpus(fams, nvidia_smi, timeout_s, log, runner=run_tool):
    """nvidia-smi --query-gpu: returns True when it answered for at least one GPU."""
    if not nvidia_smi:
        log("nvidia-smi not found: GPU health (ECC, retired pages, row remaps, throttling) not collected")
        return False
    out = QueryGpu(nvidia_smi, GPU_SPEC, timeout_s, runner=runner).run()
    for problem in out["problems"]:
        log("nvidia-smi: %s" % problem["message"])
    for row in out["gpus"]:
        pci = normalize_pci(row.get("pci"))
        if pci is None:
            continue
        labels = {"pci": pci, "gpu": "" if row.get("index") is None else str(row["index"])}
        simple = (
            ("gpufleet_gpu_temperature_celsius", "gauge", "GPU core temperature.", "temperature_c", {}),
            ("gpufleet_gpu_ecc_errors_total", "counter",
             "ECC errors by type (corrected, uncorrected) and scope (volatile: since the driver loaded; aggregate: "
             "lifetime).", "ecc_volatile_corrected", {"type": "corrected", "scope": "volatile"}),
            ("gpufleet_gpu_ecc_errors_total", "counter", "", "ecc_volatile_uncorrected",
             {"type": "uncorrected", "scope": "volatile"}),
            ("gpufleet_gpu_ecc_errors_total", "counter", "", "ecc_aggregate_corrected",
             {"type": "corrected", "scope": "aggregate"}),
            ("gpufleet_gpu_ecc_errors_total", "counter", "", "ecc_aggregate_uncorrected",
             {"type": "uncorrected", "scope": "aggregate"}),
            ("gpufleet_gpu_retired_pages", "gauge",
             "Retired framebuffer pages by cause (pre-Ampere GPUs; sbe single-bit, dbe double-bit).",
             "retired_pages_sbe", {"cause": "sbe"}),
            ("gpufleet_gpu_retired_pages", "gauge", "", "retired_pages_dbe", {"cause": "dbe"}),
            ("gpufleet_gpu_retired_pages_pending", "gauge", "1: a page retirement waits for the next driver reload.",
             "retired_pages_pending", {}),
            ("gpufleet_gpu_remapped_rows", "gauge",
             "Rows remapped by cause (Ampere and newer; correctable, uncorrectable).",
             "remapped_rows_correctable", {"cause": "correctable"}),
            ("gpufleet_gpu_remapped_rows", "gauge", "", "remapped_rows_uncorrectable", {"cause": "uncorrectable"}),
            ("gpufleet_gpu_remapped_rows_pending", "gauge", "1: a row remap waits for the next GPU reset.",
             "remapped_rows_pending", {}),
            ("gpufleet_gpu_remapped_rows_failure", "gauge", "1: a row remap failed (the GPU could not remap a row).",
             "remapped_rows_failure", {}),
        )
        for name, kind, help_text, key, extra in simple:
            value = _number(row.get(key))
            if value is not None:
                fams.get(name, kind, help_text).add(value, **dict(labels, **extra))
        for level in HISTOGRAM_LEVELS:
            value = _number(row.get("remap_banks_" + level))
            if value is not None:
                fams.get("gpufleet_gpu_remap_banks", "gauge",
                         "Memory banks by how many spare rows they have left for remapping (max: all, none: no "
                         "spare row left).").add(value, availability=level, **labels)
        reasons = row.get("throttle_reasons")
        if reasons is not None:
            active = set(reasons)
            for _bit, name in THROTTLE_BITS:
                fams.get("gpufleet_gpu_throttle_reason_active", "gauge",
                         "1: the clocks are held down for this reason (nvidia-smi clocks_event_reasons).").add(
                    1 if name in active else 0, reason=name, **labels)
    return bool(out["gpus"])


def _ran(res):
    return res is not None and not res.error and not res.timed_out


def collect_nvlink(fams, nvidia_smi, timeout_s, log, runner=run_tool):
    """NVLink links (state, speed, error counters) and each GPU's fabric registration. True when nvidia-smi answered
    (a node without NVLink answers with no links, and gets no NVLink metrics)."""
    if not nvidia_smi:
        return False
    ident = QueryGpu(nvidia_smi, (("index", ("index",)), ("pci", ("pci.bus_id",)), ("uuid", ("uuid",))), timeout_s,
                     runner=runner).run()
    by_uuid = dict((g["uuid"], g) for g in ident["gpus"] if g.get("uuid"))
    by_index = dict((g["index"], g) for g in ident["gpus"] if g.get("index") is not None)

    def labels_of(block):
        gpu = by_uuid.get(block.get("uuid")) or by_index.get(block.get("index"))
        if gpu is None or not normalize_pci(gpu.get("pci")):
            return None
        return {"pci": normalize_pci(gpu["pci"]), "gpu": str(gpu["index"])}

    status = runner([nvidia_smi, "nvlink", "--status"], timeout_s)
    if not _ran(status):
        log("nvidia-smi nvlink --status: %s" % (status.error or "timed out after %ss" % timeout_s))
        return False
    links = parse_nvlink_status(status.stdout)
    for block in links["gpus"]:
        labels = labels_of(block)
        if labels is None:
            continue
        entries = block["links"] or ([] if not block["all_inactive"] else [])
        if block["all_inactive"] and not block["links"]:
            fams.get("gpufleet_nvlink_gpu_all_links_down", "gauge",
                     "1: nvidia-smi says all NVLinks of this GPU are inactive.").add(1, **labels)
        for link in entries:
            fams.get("gpufleet_nvlink_link_up", "gauge",
                     "1: the NVLink is active (nvidia-smi nvlink --status); 0: <inactive>.").add(
                1 if link["up"] else 0, link=str(link["link"]), **labels)
            if link["speed_gbps"] is not None:
                fams.get("gpufleet_nvlink_link_speed_gbps", "gauge", "Current speed of the NVLink, GB/s.").add(
                    link["speed_gbps"], link=str(link["link"]), **labels)
    if any(block["links"] or block["all_inactive"] for block in links["gpus"]):
        errors = runner([nvidia_smi, "nvlink", "--errorcounters"], timeout_s)
        if _ran(errors):
            for block in parse_nvlink_errors(errors.stdout)["gpus"]:
                labels = labels_of(block)
                if labels is None:
                    continue
                for link, counters in sorted(block["links"].items()):
                    for kind, value in sorted(link_totals(counters).items()):
                        if value is not None:
                            fams.get("gpufleet_nvlink_errors_total", "counter",
                                     "NVLink error counter of the link since the driver loaded, by type (crc, replay, "
                                     "recovery).").add(value, link=str(link), type=kind, **labels)
        else:
            log("nvidia-smi nvlink --errorcounters: %s" % (errors.error or "timed out after %ss" % timeout_s))
    q = runner([nvidia_smi, "-q"], timeout_s)
    fabric_gpus = 0
    if _ran(q):
        for block in parse_q(q.stdout)["gpus"]:
            fabric = q_fabric(block["entries"])
            gpu = next((g for g in ident["gpus"] if normalize_pci(g.get("pci")) == block.get("pci")), None)
            if fabric["state"] is None or gpu is None:
                continue
            fabric_gpus += 1
            complete = fabric["state"] == "completed" and (fabric["status"] or "").lower() == "success"
            fams.get("gpufleet_gpu_fabric_complete", "gauge",
                     "1: the GPU is registered with the NVLink fabric (nvidia-smi -q Fabric State Completed, Status "
                     "Success); 0: not (CUDA fails with error 802 on an NVSwitch machine).").add(
                1 if complete else 0, pci=block["pci"], gpu=str(gpu["index"]), state=fabric["state"])
    else:
        log("nvidia-smi -q: %s" % (q.error or "timed out after %ss" % timeout_s))
    systemctl = shutil.which("systemctl")
    if systemctl:
        res = runner([systemctl, "show", FM_SERVICE, "--property=LoadState", "--property=ActiveState"], timeout_s)
        props = parse_systemctl_show(res.stdout) if _ran(res) else {}
        if props.get("LoadState") == "loaded" or fabric_gpus:
            fams.get("gpufleet_fabric_manager_active", "gauge",
                     "1: the NVSwitch fabric manager's service is active; 0: not (or not installed).").add(
                1 if props.get("ActiveState") == "active" else 0, service=FM_SERVICE)
    return True


def _nvme_controllers(cfg):
    """The configured controllers, plus every one in /sys/class/nvme when nvme_discover is on."""
    found = sorted("/dev/" + os.path.basename(p) for p in glob.glob("/sys/class/nvme/nvme*")) if cfg["nvme_discover"] else []
    return found + [d for d in cfg["nvme_devices"] or [] if d not in found]


def collect_storage(fams, paths, mounts_file, log):
    """statvfs and the mount state of each checkpoint path. Returns (ok, NVMe controllers beneath the paths)."""
    if not paths:
        return True, []
    mounts = read_mounts(mounts_file)
    controllers = []
    ok = True
    for path in paths:
        resolved = os.path.realpath(path)
        try:
            st = os.statvfs(resolved)
        except OSError as exc:
            log("checkpoint path %s: statvfs failed: %s (create the directory, or fix the path)"
                % (path, exc.strerror or exc))
            fams.get("gpufleet_checkpoint_path_ok", "gauge", "1: the checkpoint path exists and statvfs answers.").add(
                0, path=path)
            ok = False
            continue
        fams.get("gpufleet_checkpoint_path_ok", "gauge", "1: the checkpoint path exists and statvfs answers.").add(
            1, path=path)
        fams.get("gpufleet_checkpoint_size_bytes", "gauge", "Size of the filesystem holding the checkpoint path.").add(
            st.f_blocks * st.f_frsize, path=path)
        fams.get("gpufleet_checkpoint_free_bytes", "gauge",
                 "Bytes a non-root trainer can still write there (statvfs f_bavail).").add(st.f_bavail * st.f_frsize,
                                                                                             path=path)
        if st.f_files > 0:  # btrfs and some network filesystems have no inode limit and report 0
            fams.get("gpufleet_checkpoint_inodes", "gauge", "Inodes of the filesystem holding the checkpoint path.").add(
                st.f_files, path=path)
            fams.get("gpufleet_checkpoint_free_inodes", "gauge", "Inodes a non-root trainer can still use (f_favail).").add(
                st.f_favail, path=path)
        mount = find_mount(mounts["mounts"], resolved)
        if mount is None:
            log("checkpoint path %s: no entry of %s holds it: its read-only state is unknown" % (path, mounts_file))
            continue
        fams.get("gpufleet_checkpoint_read_only", "gauge",
                 "1: the filesystem holding the checkpoint path is mounted read-only (now, from the mount table).").add(
            1 if mount["read_only"] else 0, path=path, device=mount["source"], mountpoint=mount["target"])
        for dev in backing_devices(mount["source"]) or [mount["source"]]:
            nv = nvme_devices_for_source(dev)
            if nv and nv["controller"] not in controllers:
                controllers.append(nv["controller"])
    return ok, controllers


def collect_nvme(fams, nvme, devices, timeout_s, log, runner=run_tool):
    if not devices:
        return True
    if not nvme:
        log("nvme-cli not found: NVMe wear and critical warnings not collected (apt-get install nvme-cli)")
        return False
    ok = True
    for device in devices:
        res = runner([nvme, "smart-log", device, "-o", "json"], timeout_s)
        if res.error or res.timed_out or res.rc != 0:
            why = res.error or ("timed out after %ss" % timeout_s if res.timed_out else
                                "exit %s: %s" % (res.rc, (res.stderr or res.stdout or "").strip()[:200]))
            log("nvme smart-log %s: %s" % (device, why))
            ok = False
            continue
        health = parse_nvme_smart_log(res.stdout)
        for problem in health["problems"]:
            log("nvme smart-log %s: %s" % (device, problem["message"]))
        labels = {"device": device}
        if health["percent_used"] is not None:
            fams.get("gpufleet_nvme_percent_used", "gauge",
                     "NVMe wear: percentage of the rated write endurance used (can exceed 100).").add(
                health["percent_used"], **labels)
        if health["available_spare_pct"] is not None:
            fams.get("gpufleet_nvme_available_spare_percent", "gauge", "NVMe spare capacity left.").add(
                health["available_spare_pct"], **labels)
        if health["critical_warning"] is not None:
            active = set(health["critical_warning_flags"])
            for _bit, flag, _text in CRITICAL_WARNING_BITS:
                fams.get("gpufleet_nvme_critical_warning", "gauge",
                         "1: the NVMe reports this critical warning (smart-log critical_warning bits).").add(
                    1 if flag in active else 0, flag=flag, **labels)
        if health["media_errors"] is not None:
            fams.get("gpufleet_nvme_media_errors_total", "counter", "NVMe unrecovered data integrity errors.").add(
                health["media_errors"], **labels)
        if health["critical_warning"] is None and health["percent_used"] is None:
            ok = False
    return ok


def collect_infiniband(fams, root, expected_gbps, log):
    """Each InfiniBand port's state, rate, width and error counters (ib_sysfs). None (nothing written) on a node
    without InfiniBand (no root); else True when every port read whole."""
    if not os.path.isdir(root):
        return None
    read = ib_sysfs.read_ports(root)
    for problem in read["problems"]:
        log("infiniband: %s" % problem["message"])
    for port in read["ports"]:
        where = {"hca": port["hca"], "port": str(port["port"])}
        if port["state_name"] is not None or port["phys_state"] is not None:
            up = port["state_name"] == "ACTIVE" and port["phys_state"] == "LinkUp"
            fams.get("gpufleet_ib_port_up", "gauge", "1: the InfiniBand port is ACTIVE and LinkUp.").add(
                1 if up else 0, state=port["state_name"] or "unknown", phys_state=port["phys_state"] or "unknown",
                **where)
        if port["rate_gbps"] is not None:
            fams.get("gpufleet_ib_port_rate_gbps", "gauge", "The port's rate, Gb/s (sysfs rate).").add(
                port["rate_gbps"], **where)
            fams.get("gpufleet_ib_port_width_lanes", "gauge", "The lanes the port runs on (4X: 4).").add(
                port["width"], **where)
        if expected_gbps is not None:
            fams.get("gpufleet_ib_port_expected_rate_gbps", "gauge", "The rate the port should run at, Gb/s "
                     "(configured).").add(expected_gbps, **where)
        for name, value in sorted(port["counters"].items()):
            if value is None:
                continue  # N/A (no PMA): unknown, never a zero
            if name == "link_downed":
                fams.get("gpufleet_ib_port_link_downed_total", "counter", "Times the port's link failed to recover "
                         "and went down (sysfs counters/link_downed): flaps.").add(value, **where)
            else:
                fams.get("gpufleet_ib_port_errors_total", "counter", "The port's error counters (sysfs counters/; "
                         "they saturate).").add(value, counter=name, **where)
    return not read["problems"]


def collect(cfg, log, runner=run_tool, clock=time.time):
    """All families of one run (never raises for a source that cannot be read)."""
    fams = Families()
    up = fams.get("gpufleet_health_collector_up", "gauge",
                  "1: this source of the health collector answered at its last run.")
    nvidia_smi = shutil.which(cfg["nvidia_smi"]) if cfg["nvidia_smi"] else None
    up.add(1 if collect_gpus(fams, nvidia_smi, cfg["tool_timeout_seconds"], log, runner) else 0, collector="gpu")
    if nvidia_smi:
        up.add(1 if collect_nvlink(fams, nvidia_smi, cfg["tool_timeout_seconds"], log, runner) else 0,
               collector="nvlink")
    storage_ok, under_paths = collect_storage(fams, cfg["checkpoint_paths"], cfg["mounts_file"], log)
    up.add(1 if storage_ok else 0, collector="checkpoint_storage")
    devices = _nvme_controllers(cfg)
    for ctrl in under_paths:
        if ctrl not in devices:
            devices.append(ctrl)
    nvme = shutil.which(cfg["nvme"]) if cfg["nvme"] else None
    up.add(1 if collect_nvme(fams, nvme, devices, cfg["tool_timeout_seconds"], log, runner) else 0, collector="nvme")
    ib = collect_infiniband(fams, cfg["infiniband_root"], cfg["ib_expected_rate_gbps"], log)
    if ib is not None:
        up.add(1 if ib else 0, collector="infiniband")
    fams.get("gpufleet_health_last_run_timestamp_seconds", "gauge",
             "When the health collector last finished.").add(clock())
    return fams.items


def main(argv=None, log=None):
    log = log or (lambda m: (sys.stderr.write(m.rstrip() + "\n"), sys.stderr.flush()))
    parser = argparse.ArgumentParser(prog="gpufleet-node-health",
                                     description="Write GPU, checkpoint storage and NVMe health metrics once.")
    parser.add_argument("--config", default="/etc/gpufleet/monitoring.json", help="JSON configuration file")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        log("gpufleet-node-health: %s" % exc)
        return 2
    path = os.path.join(cfg["metrics_directory"], HEALTH_PROM)
    families = collect(cfg, log)
    try:
        atomic_write(path, render(families))
    except OSError as exc:
        log("cannot write %s: %s (the metrics directory must be writable; see the gpufleet-xid-watcher status)"
            % (path, exc.strerror or exc))
        return 1
    return 0
