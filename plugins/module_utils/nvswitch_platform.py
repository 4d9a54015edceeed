# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Is this an NVSwitch machine (HGX/DGX), and is it an NVLink 5 (Blackwell) one? Read from sysfs/procfs, stdlib only.

The signals NVIDIA's own GPU driver container uses to decide whether to start the fabric manager
(github.com/NVIDIA/gpu-driver-container, nvidia-driver: _assert_nvswitch_system, _assert_nvlink5_system):
  - NVLink 3/4 baseboards (A100, H100, H200): the NVSwitches are PCI devices of NVIDIA (vendor 0x10de) with class
    0x0680 "other bridge" (lspci: `Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3]`); once the
    driver is loaded they are listed in /proc/driver/nvidia-nvswitch/devices.
  - NVLink 5 (HGX/DGX B200 and later): the switches are managed through ConnectX bridge devices whose PCI VPD holds
    the keyword SW_MNG (/sys/class/infiniband/<dev>/device/vpd); the fabric manager then needs NVLSM beside it.
The PCI scan works before the driver is loaded (a fresh node), the procfs list only after. Roots are parameters so a
test or the simulator can point them at a prepared tree.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

NVIDIA_VENDOR = "0x10de"
NVSWITCH_CLASS_PREFIX = "0x0680"
NVLINK5_VPD_KEYWORD = b"SW_MNG"


def _read(path, limit=65536, binary=False):
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit)
    except (IOError, OSError):
        return None
    return data if binary else data.decode("ascii", "replace").strip().lower()


def nvswitch_pci_devices(sysfs_root="/sys"):
    """[{pci, device_id}] of NVIDIA PCI devices of class 0x0680 (NVSwitches), sorted by address."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except (IOError, OSError):
        return []
    out = []
    for name in names:
        dev = os.path.join(base, name)
        if _read(os.path.join(dev, "vendor")) != NVIDIA_VENDOR:
            continue
        if not (_read(os.path.join(dev, "class")) or "").startswith(NVSWITCH_CLASS_PREFIX):
            continue
        out.append({"pci": name.lower(), "device_id": (_read(os.path.join(dev, "device")) or "").replace("0x", "")})
    return out


def nvswitch_driver_devices(procfs_root="/proc"):
    """Entries of <procfs>/driver/nvidia-nvswitch/devices (None when the directory does not exist: no driver)."""
    path = os.path.join(procfs_root, "driver", "nvidia-nvswitch", "devices")
    try:
        return sorted(os.listdir(path))
    except (IOError, OSError):
        return None


def nvlink5_switch_bridges(sysfs_root="/sys"):
    """InfiniBand devices whose VPD carries SW_MNG: the ConnectX bridges that manage NVLink 5 switches."""
    base = os.path.join(sysfs_root, "class", "infiniband")
    try:
        names = sorted(os.listdir(base))
    except (IOError, OSError):
        return []
    out = []
    for name in names:
        vpd = _read(os.path.join(base, name, "device", "vpd"), binary=True)
        if vpd and NVLINK5_VPD_KEYWORD in vpd:
            out.append(name)
    return out


def detect(sysfs_root="/sys", procfs_root="/proc"):
    """{nvswitch: bool, nvlink5: bool, generation: "nvlink5"|"nvswitch"|None, nvswitch_pci: [...],
    nvswitch_driver_devices: [...] or None, nvlink5_bridges: [...], evidence: [lines]}."""
    pci = nvswitch_pci_devices(sysfs_root)
    proc = nvswitch_driver_devices(procfs_root)
    bridges = nvlink5_switch_bridges(sysfs_root)
    evidence = ["NVSwitch PCI device %s (10de:%s, class 0680)" % (d["pci"], d["device_id"]) for d in pci]
    if proc:
        evidence.append("%s/driver/nvidia-nvswitch/devices: %s" % (procfs_root.rstrip("/"), " ".join(proc)))
    evidence += ["%s/class/infiniband/%s/device/vpd holds SW_MNG (NVLink 5 switch management)" % (
        sysfs_root.rstrip("/"), b) for b in bridges]
    nvlink5 = bool(bridges)
    nvswitch = nvlink5 or bool(pci) or bool(proc)
    return {"nvswitch": nvswitch, "nvlink5": nvlink5,
            "generation": "nvlink5" if nvlink5 else ("nvswitch" if nvswitch else None),
            "nvswitch_pci": [d["pci"] for d in pci], "nvswitch_driver_devices": proc, "nvlink5_bridges": bridges,
            "evidence": evidence}
