"""The simulated kernel log: records, boot noise, scenario history, and the driver's message shapes.

A record is one JSON line in <state>/kernel.jsonl: seq, boot (id), rt (realtime µs), mono (µs since that boot),
prio (syslog level), and msg (str) or raw (a list of byte values, for a line that is not valid UTF-8).
journalctl and dmesg render the same records, so both tell the same story.
"""

import hashlib

# Background lines every node has (non-NVRM): a reader must skip them without counting them as unparsed events.
BOOT_NOISE = [
    (0.000000, 5, "Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14) 12.2.0, "
                  "GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22)"),
    (0.000000, 6, "Command line: BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-amd64 root=UUID=5f1c2e0a-7b7e-4c1e-9a51-2f3c1d0e9b11 "
                  "ro quiet pcie_aspm=off iommu=pt"),
    (0.004211, 6, "DMI: {platform}"),
    (0.412337, 6, "ACPI: PCI Root Bridge [PC00] (domain 0000 [bus 00-14])"),
    (1.208841, 6, "pci 0000:00:01.0: PCI bridge to [bus 01]"),
    (2.530119, 5, "audit: type=2000 audit(1723210000.520:1): state=initialized audit_enabled=0 res=1"),
    (3.118020, 6, "nvme nvme0: pci function 0000:c4:00.0"),
    (3.401557, 6, "nvme nvme0: 64/0/0 default/read/poll queues"),
    (3.402909, 6, " nvme0n1: p1 p2"),
    (4.881231, 6, "EXT4-fs (nvme0n1p2): mounted filesystem 5f1c2e0a-7b7e-4c1e-9a51-2f3c1d0e9b11 with ordered data mode. "
                  "Quota mode: none."),
    (6.009112, 4, "nvidia: loading out-of-tree module taints kernel."),
    (6.009501, 4, "nvidia: module license 'NVIDIA' taints kernel."),
    (6.051276, 6, "nvidia-nvlink: Nvlink Core is being initialized, major device number 236"),
    (6.902344, 6, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  {driver}  Release Build  "
                  "(dvs-builder@U22-I3-AE18-23-3)  Tue Mar 25 19:36:42 UTC 2025"),
    (7.115071, 6, "nvidia-modeset: Loading NVIDIA UNIX Open Kernel Mode Setting Driver for x86_64  {driver}  "
                  "Release Build  (dvs-builder@U22-I3-AE18-23-3)  Tue Mar 25 19:29:05 UTC 2025"),
    (7.203390, 6, "[drm] [nvidia-drm] [GPU ID 0x0000{bus0}00] Loading driver"),
    (9.771021, 6, "igb 0000:c5:00.0 eno1: igb: eno1 NIC Link is Up 1000 Mbps Full Duplex, Flow Control: RX/TX"),
    (11.402113, 6, "usb 1-4: new high-speed USB device number 3 using xhci_hcd"),
    # Not UTF-8 (a Latin-1 0xe9): journald serialises such a MESSAGE as an array of byte values.
    (11.563207, 6, b"usb 1-4: Manufacturer: G\xe9n\xe9rique KVM"),
    (14.100021, 6, "Bluetooth: Core ver 2.22"),
    (23.001777, 6, "nvidia_uvm: module uses symbols nvUvmInterfaceDisableAccessCntr from proprietary module nvidia, "
                   "inheriting taint."),
]
PERIODIC_NOISE = [
    (4, "perf: interrupt took too long (2504 > 2500), lowering kernel.perf_event_max_sample_rate to 79750"),
    (5, "audit: type=1400 audit(1723212345.123:42): apparmor=\"DENIED\" operation=\"open\" class=\"file\" "
        "profile=\"/usr/sbin/chronyd\" name=\"/etc/gpufleet/\" pid=1093 comm=\"chronyd\" requested_mask=\"r\""),
    (6, "igb 0000:c5:00.0 eno1: Reset adapter"),
    (4, "TCP: request_sock_TCP: Possible SYN flooding on port 29500. Sending cookies.  Check SNMP counters."),
    (6, "systemd-journald[612]: Data hash table of /var/log/journal/{machine}/system.journal has a fill level at "
        "75.0 (8533 of 11377 items, 6553600 file size, 768 bytes per hash table item), suggesting rotation."),
    (3, "mce: [Hardware Error]: Machine check events logged"),
]


def hex_seed(*parts):
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()


def record(node, boot, rt, msg, prio):
    rec = {"boot": boot["id"], "rt": int(rt * 1e6), "mono": max(0, int((rt - boot["start"]) * 1e6)), "prio": prio}
    if isinstance(msg, bytes):
        try:
            rec["msg"] = msg.decode("utf-8")
        except UnicodeDecodeError:
            rec["raw"] = list(msg)
    else:
        rec["msg"] = msg
    return rec


def message_bytes(rec):
    if "raw" in rec:
        return bytes(rec["raw"])
    return rec.get("msg", "").encode("utf-8")


def _fmt(text, node):
    if isinstance(text, bytes):
        return text
    return text.format(platform=node.scen["platform"].get("dmi", "Supermicro SYS-421GE-TNRT/X13DEG-OA, BIOS 2.1 "
                                                                     "02/21/2024"),
                       driver=node.scen["driver"]["version"], bus0=node.gpus[0]["bus"] if node.gpus else "00",
                       machine=hex_seed(node.scen["node"], node.scen["name"], "machine")[:32])


def _boot_noise(node, boot, rng, until):
    out = []
    for offset, prio, text in BOOT_NOISE:
        out.append(record(node, boot, boot["start"] + offset, _fmt(text, node), prio))
    for gpu in node.gpus:
        out.append(record(node, boot, boot["start"] + 6.2 + gpu["index"] * 0.011,
                          "nvidia %s: enabling device (0000 -> 0002)" % gpu["pci_sysfs"], 6))
    # A few periodic lines spread over the boot's lifetime (hours apart), deterministic per node.
    t = boot["start"] + 3600 * rng.uniform(2, 9)
    while t < until:
        prio, text = PERIODIC_NOISE[rng.randrange(len(PERIODIC_NOISE))]
        out.append(record(node, boot, t, _fmt(text, node), prio))
        t += 3600 * rng.uniform(5, 20)
    return out


def gpu_fields(gpu):
    return {"pci_xid": gpu["pci_xid"], "pci_sysfs": gpu["pci_sysfs"], "pci_bus_id": gpu["pci_bus_id"],
            "uuid": gpu["uuid"], "serial": gpu["serial"] or "0", "index": gpu["index"], "bus": gpu["bus"],
            "device_id": gpu["pci_device_id"]}


def history_lines(node, item):
    """Lines of one scenario history item: {"message"} or {"lines": [...]} templated with a GPU, or {"xid", "gpu"}."""
    gpu = node.gpus[int(item.get("gpu", 0))] if node.gpus else {}
    fields = gpu_fields(gpu) if gpu else {}
    if "xid" in item:
        return xid_event_lines(gpu, int(item["xid"]), item.get("body", ""), item.get("pid"), item.get("name"),
                               first=item.get("first", False))
    lines = item.get("lines") or [item.get("message", "")]
    return [line.format(**fields) for line in lines]


def initial_records(node, boots, now):
    import random  # here: only a node's first call writes its kernel log

    rng = random.Random(hex_seed(node.scen["node"], node.scen["name"], "noise"))
    records = []
    history = node.scen["kernel_log"].get("history", [])
    for i, boot in enumerate(boots):
        back = len(boots) - 1 - i  # 0 = current boot
        end = boot["end"] or now
        records += _boot_noise(node, boot, rng, end - 60)
        for item in history:
            if int(item.get("boot", 0)) != -back:
                continue
            ago = float(item.get("ago_s", 0))
            at = (end - ago) if back == 0 else (boot["start"] + max(60.0, (end - boot["start"]) - ago))
            step = float(item.get("spacing_s", 0.000412))
            for j, line in enumerate(history_lines(node, item)):
                records.append(record(node, boot, at + j * step, line, int(item.get("prio", 4))))
        if back:
            records.append(record(node, boot, end - 1.5, "reboot: Restarting system", 0))
    records.sort(key=lambda r: r["rt"])
    return records


def xid_line(gpu, xid, body, pid=None, name=None):
    """The driver's krcReportXid format: `NVRM: Xid (PCI:dddd:bb:dd): N, pid=..., name=..., body`."""
    pid = "'<unknown>'" if pid is None else pid
    name = "<unknown>" if name is None else name
    return "NVRM: Xid (PCI:%s): %d, pid=%s, name=%s, %s" % (gpu["pci_xid"], xid, pid, name, body)


def identity_lines(gpu):
    """Printed by the driver before the first Xid of a GPU in this boot: maps PCI -> UUID/serial, not events."""
    return ["NVRM: GPU at PCI:%s: %s" % (gpu["pci_xid"], gpu["uuid"]),
            "NVRM: GPU Board Serial Number: %s" % (gpu["serial"] or "0")]


def xid_event_lines(gpu, xid, body, pid=None, name=None, first=False):
    return (identity_lines(gpu) if first else []) + [xid_line(gpu, xid, body, pid, name)]


def fallen_off_bus_lines(gpu, style):
    """A lost GPU as the driver reports it. style: xid, xid+single, xid+multiline, multiline, single."""
    out = []
    if style.startswith("xid"):
        out += identity_lines(gpu)
        out.append(xid_line(gpu, 79, "GPU has fallen off the bus."))
    if style.endswith("single"):
        out.append("NVRM: GPU %s: GPU has fallen off the bus." % gpu["pci_sysfs"])
    if style.endswith("multiline"):
        out += ["NVRM: The NVIDIA GPU %s" % gpu["pci_sysfs"],
                "NVRM: (PCI ID: 10de:%s) installed in this system has" % gpu["pci_device_id"],
                "NVRM: fallen off the bus and is not responding to commands."]
    return out


CRASH_DUMP_LINES = ["NVRM: A GPU crash dump has been created. If possible, please run",
                    "NVRM: nvidia-bug-report.sh as root to collect this data before",
                    "NVRM: the NVIDIA kernel module is unloaded."]


def cursor(info, rec):
    x = int(hex_seed(rec["seq"], rec["rt"])[:16], 16)
    return "s=%s;i=%x;b=%s;m=%x;t=%x;x=%016x" % (info["seqnum_id"], rec["seq"], rec["boot"], rec["mono"], rec["rt"], x)
