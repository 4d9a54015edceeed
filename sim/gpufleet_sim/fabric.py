"""The NVLink fabric of a simulated node: NVSwitches, the fabric manager, each GPU's links and their error counters.

Scenario keys (all optional; an NVSwitch model gets a healthy fabric by default):
  fabric_manager: {installed (true), version (the driver's), active (true), enabled (true), package,
                   nscq_version (the fabric manager's), service ("nvidia-fabricmanager")}
  nvlink: {nvswitch (the model's), fabric_health_rows ("bandwidth": the Health block of older drivers, Bandwidth
           alone; "full": current drivers' Summary, Bandwidth and condition rows), gpus: {"<index>": {down: [links],
           all_inactive: bool, slow: {"<link>": GB/s}, counters: {"<link>": {crc_base, replay_base, recovery_base,
           crc_per_load_hour, replay_per_load_hour, recovery_per_load_hour}}, fabric_health: {"<row label>": value}
           (e.g. {"Summary": "Unhealthy", "Route Unhealthy": "True"}: the rows nvidia-smi -q prints)}}}
What follows from them, as on a real HGX: with the fabric manager missing, stopped, or at another version than the
driver, no GPU registers with the fabric (nvidia-smi -q Fabric State "In Progress"), every NVLink stays untrained
(<inactive>), the topology matrix shows PCIe paths, and CUDA fails with error 802 "system not yet initialized"
(torchrun, gpu_burn, all_reduce_perf). Counters grow with simulated time under load, like the PCIe replays.
"""

import os

SERVICE = "nvidia-fabricmanager"
NOT_READY = "system not yet initialized"


def nvswitch(node):
    cfg = node.scen.get("nvlink") or {}
    if "nvswitch" in cfg:
        return bool(cfg["nvswitch"])
    return bool(node.model.get("nvswitch_bus_ids"))


def _branch_package(version, name):
    """NVIDIA's CUDA repository names: <name>-<branch> up to branch 579, <name> from 580 on."""
    branch = int(version.split(".")[0])
    return name if branch >= 580 else "%s-%d" % (name, branch)


def fabric_manager(node):
    """The fabric manager's package and service as the node would report them (None: not installed)."""
    driver = node.scen["driver"]["version"]
    default_installed = nvswitch(node)
    cfg = node.scen.get("fabric_manager") or {}
    if not cfg.get("installed", default_installed):
        return None
    version = cfg.get("version", driver)
    return {
        "service": cfg.get("service", SERVICE),
        "package": cfg.get("package", _branch_package(version, "nvidia-fabricmanager")),
        "version": version,
        "nscq_package": _branch_package(cfg.get("nscq_version", version), "libnvidia-nscq"),
        "nscq_version": cfg.get("nscq_version", version),
        # The real daemon refuses to run with another driver version, or without an NVSwitch to manage: it exits at
        # start.
        "active": bool(cfg.get("active", True)) and version == driver and nvswitch(node),
        "enabled": bool(cfg.get("enabled", True)),
        "mismatch": version != driver,
        "nothing_to_do": version == driver and not nvswitch(node),
    }


def fm_journal(node):
    """[(seconds after boot, identifier, priority, message)] of the fabric manager's unit in this boot, as the daemon
    and systemd write them (the start-up lines the collection reads: NVIDIA's wording, quoted in public reports)."""
    fm = fabric_manager(node)
    if fm is None:
        return []
    unit = fm["service"] + ".service"
    out = [(20.0, "systemd", 6, "Starting NVIDIA fabric manager service...")]
    failed = [(20.6, "systemd", 5, "%s: Control process exited, code=exited, status=1/FAILURE" % unit),
              (20.6, "systemd", 4, "%s: Failed with result 'exit-code'." % unit),
              (20.7, "systemd", 3, "Failed to start NVIDIA fabric manager service.")]
    if fm["mismatch"]:
        out.append((20.5, "nv-fabricmanager", 3, "fabric manager NVIDIA GPU driver interface version %s don't match "
                    "with driver version %s. Please update with matching NVIDIA driver package." % (
                        fm["version"], node.scen["driver"]["version"])))
        return out + failed
    if fm["nothing_to_do"]:
        out.append((20.5, "nv-fabricmanager", 3, "request to query NVSwitch device information from NVSwitch driver "
                    "failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]"))
        return out + failed
    if not fm["active"]:  # stopped by an operator (or never started: disabled)
        return out + [(21.0, "systemd", 6, "Started NVIDIA fabric manager service."),
                      (3600.0, "systemd", 6, "Stopping NVIDIA fabric manager service..."),
                      (3601.0, "systemd", 6, "%s: Deactivated successfully." % unit),
                      (3601.0, "systemd", 6, "Stopped NVIDIA fabric manager service.")]
    return out + [(21.0, "systemd", 6, "Started NVIDIA fabric manager service.")]


def ready(node):
    """True when CUDA can initialise: not an NVSwitch node, or its fabric manager runs at the driver's version."""
    if not nvswitch(node):
        return True
    fm = fabric_manager(node)
    return bool(fm and fm["active"])


def _gpu_cfg(node, gpu):
    return ((node.scen.get("nvlink") or {}).get("gpus") or {}).get(str(gpu["index"])) or {}


def link_count(gpu):
    return int(gpu.get("nvlink_links") or 0)


def links(node, gpu):
    """[(link, speed GB/s or None when inactive)] of one GPU; [] when the GPU has no NVLink."""
    n = link_count(gpu)
    if not n:
        return []
    cfg = _gpu_cfg(node, gpu)
    trained = ready(node) and not cfg.get("all_inactive")
    down = set(int(x) for x in cfg.get("down", []))
    slow = dict((int(k), float(v)) for k, v in (cfg.get("slow") or {}).items())
    out = []
    for link in range(n):
        if not trained or link in down:
            out.append((link, None))
        else:
            out.append((link, slow.get(link, float(gpu["nvlink_speed_gbps"]))))
    return out


def links_up(node, gpu):
    return sum(1 for _l, speed in links(node, gpu) if speed is not None)


def counters(node, view, gpu):
    """{link: {"Replay Errors": n, "Recovery Errors": n, "CRC Errors": n}} at this instant."""
    cfg = (_gpu_cfg(node, gpu).get("counters") or {})
    load_h = view._load_sim_s(gpu["index"]) / 3600.0
    out = {}
    for link in range(link_count(gpu)):
        c = cfg.get(str(link)) or {}
        out[link] = dict((label, int(c.get(key + "_base", 0) + c.get(key + "_per_load_hour", 0) * load_h))
                         for key, label in (("replay", "Replay Errors"), ("recovery", "Recovery Errors"),
                                            ("crc", "CRC Errors")))
    return out


def fabric_state(node, gpu):
    """(State, Status) of the -q Fabric section: N/A off an NVSwitch fabric."""
    if not nvswitch(node):
        return "N/A", "N/A"
    if ready(node):
        return "Completed", "Success"
    return "In Progress", "N/A"


# nvidia-smi -q Fabric > Health of a registered, healthy GPU on current drivers (NVML healthSummary and healthMask).
HEALTHY_ROWS = (("Summary", "Healthy"), ("Bandwidth", "Full"), ("Route Recovery in progress", "False"),
                ("Route Unhealthy", "False"), ("Access Timeout Recovery", "False"), ("Incorrect Configuration", "None"))


def fabric_health(node, gpu, state):
    """[(label, value)] of the -q Fabric > Health rows: Bandwidth alone unless the scenario asks for the full block
    (or sets a GPU's rows); N/A before the GPU is registered."""
    cfg = node.scen.get("nvlink") or {}
    overrides = _gpu_cfg(node, gpu).get("fabric_health") or {}
    rows = HEALTHY_ROWS if cfg.get("fabric_health_rows") == "full" or overrides else HEALTHY_ROWS[1:2]
    if state != "Completed":
        return [(label, "N/A") for label, _v in rows]
    return [(label, overrides.get(label, value)) for label, value in rows]


def write_platform(node):
    """<state>/sysfs and <state>/procfs: the PCI devices of the GPUs and NVSwitches (vendor, device, class) and the
    NVSwitch driver's device list, which the collection's NVSwitch detection reads (its roots are module options)."""
    base = node.path("sysfs", "bus", "pci", "devices")
    os.makedirs(base, exist_ok=True)
    devices = [(g["pci_sysfs"], g["pci_device_id"], "0x030200") for g in node.gpus]
    if nvswitch(node):
        devices += [("0000:%s:00.0" % bus, node.model.get("nvswitch_device_id") or "22a3", "0x068000")
                    for bus in node.model.get("nvswitch_bus_ids") or []]
    for address, device_id, pci_class in devices:
        dev = os.path.join(base, address)
        os.makedirs(dev, exist_ok=True)
        for name, value in (("vendor", "0x10de"), ("device", "0x" + device_id.lower()), ("class", pci_class)):
            with open(os.path.join(dev, name), "w") as fh:
                fh.write(value + "\n")
    proc = node.path("procfs", "driver", "nvidia-nvswitch", "devices")
    if nvswitch(node):
        os.makedirs(proc, exist_ok=True)
        for bus in node.model.get("nvswitch_bus_ids") or []:
            with open(os.path.join(proc, "0000:%s:00.0" % bus), "w") as fh:
                fh.write("")
