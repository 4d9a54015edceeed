"""Stand-ins for `nvme smart-log <dev> -o json`, `nvme list -o json` and `smartctl -j -a <dev>` (docs/signals.md section 7).

The scenario's storage.devices list the node's NVMe controllers; storage.nvme_cli "1.x" prints the big counters as
floats like nvme-cli 1.x did. The checkpoint filesystem's mount state is not a tool here: the node's state directory
holds a /proc/mounts-format file (<state>/mounts) in which the checkpoint directory is a mount of
storage.checkpoint.device (read-only for checkpoint_readonly); see state.write_mounts and sim/README.md.
"""

import json
import os
import sys
import time

DEFAULT_DEVICES = [
    {"name": "nvme0", "model": "SAMSUNG MZ1L21T9HCLS-00A07", "serial": "S666NE0T100231", "firmware": "GDC7302Q",
     "size_bytes": 1920383410176, "temperature_c": 36, "percent_used": 1, "data_units_written": 11834021,
     "data_units_read": 20917736, "power_on_hours": 9120, "power_cycles": 38, "unsafe_shutdowns": 7},
    {"name": "nvme1", "model": "SAMSUNG MZQL27T6HBLA-00A07", "serial": "S6CKNT0W800412", "firmware": "GDC5902Q",
     "size_bytes": 7681501126656, "temperature_c": 41, "percent_used": 4, "data_units_written": 390441276,
     "data_units_read": 188102551, "power_on_hours": 9118, "power_cycles": 38, "unsafe_shutdowns": 7},
]


def devices(node):
    out = []
    overrides = {d["name"]: d for d in node.scen["storage"].get("devices", [])}
    for base in DEFAULT_DEVICES:
        dev = dict(base)
        dev.update(overrides.pop(base["name"], {}))
        out.append(dev)
    out += list(overrides.values())
    return out


def _find(node, path):
    name = os.path.basename(path.rstrip("/"))
    for dev in devices(node):
        if name == dev["name"] or (name.startswith(dev["name"] + "n") and name[len(dev["name"]) + 1:][:1].isdigit()):
            return dev
    return None


def _health(dev):
    return {
        "critical_warning": int(dev.get("critical_warning", 0)),
        "temperature_k": int(dev.get("temperature_c", 38)) + 273,
        "avail_spare": int(dev.get("avail_spare", 100)),
        "spare_thresh": int(dev.get("spare_thresh", 10)),
        "percent_used": int(dev.get("percent_used", 2)),
        "data_units_read": int(dev.get("data_units_read", 1000000)),
        "data_units_written": int(dev.get("data_units_written", 1000000)),
        "host_read_commands": int(dev.get("data_units_read", 1000000)) * 31,
        "host_write_commands": int(dev.get("data_units_written", 1000000)) * 17,
        "controller_busy_time": int(dev.get("power_on_hours", 1000)) // 3,
        "power_cycles": int(dev.get("power_cycles", 10)),
        "power_on_hours": int(dev.get("power_on_hours", 1000)),
        "unsafe_shutdowns": int(dev.get("unsafe_shutdowns", 0)),
        "media_errors": int(dev.get("media_errors", 0)),
        "num_err_log_entries": int(dev.get("num_err_log_entries", 0)),
    }


def main(node, tool, argv, out=sys.stdout, err=sys.stderr):
    if tool == "smartctl":
        return smartctl(node, argv, out, err)
    return nvme(node, argv, out, err)


def _want_json(argv):
    for i, a in enumerate(argv):
        if a in ("-o", "--output-format") and i + 1 < len(argv) and argv[i + 1] == "json":
            return True
        if a in ("-ojson", "--output-format=json"):
            return True
    return False


def nvme(node, argv, out, err):
    if not argv or argv[0] in ("help", "--help", "-h"):
        out.write("usage: nvme <command> [<device>] [<args>]\n")
        return 0
    if argv[0] in ("version", "--version"):
        out.write("nvme version %s\n" % node.scen["storage"].get("nvme_cli", "2.4"))
        return 0
    if argv[0] == "list":
        return _nvme_list(node, argv, out)
    if argv[0] != "smart-log":
        err.write("nvme: unknown or unsupported command '%s' (gpufleet-sim)\n" % argv[0])
        return 1
    paths = [a for a in argv[1:] if a.startswith("/dev/") or a.startswith("nvme")]
    if not paths:
        err.write("smart-log: no device given\n")
        return 1
    dev = _find(node, paths[0])
    if dev is None:
        err.write("Failed to open %s: No such file or directory\n" % paths[0])
        return 1
    h = _health(dev)
    if not _want_json(argv):
        out.write("Smart Log for NVME device:%s namespace-id:ffffffff\n" % dev["name"])
        out.write("critical_warning\t\t\t: %d\n" % h["critical_warning"])
        out.write("temperature\t\t\t\t: %d C (%d Kelvin)\n" % (h["temperature_k"] - 273, h["temperature_k"]))
        out.write("available_spare\t\t\t\t: %d%%\n" % h["avail_spare"])
        out.write("percentage_used\t\t\t\t: %d%%\n" % h["percent_used"])
        out.write("media_errors\t\t\t\t: %d\n" % h["media_errors"])
        return 0
    doc = [("critical_warning", h["critical_warning"]), ("temperature", h["temperature_k"]),
           ("avail_spare", h["avail_spare"]), ("spare_thresh", h["spare_thresh"]),
           ("percent_used", h["percent_used"]), ("endurance_grp_critical_warning_summary", 0),
           ("data_units_read", h["data_units_read"]), ("data_units_written", h["data_units_written"]),
           ("host_read_commands", h["host_read_commands"]), ("host_write_commands", h["host_write_commands"]),
           ("controller_busy_time", h["controller_busy_time"]), ("power_cycles", h["power_cycles"]),
           ("power_on_hours", h["power_on_hours"]), ("unsafe_shutdowns", h["unsafe_shutdowns"]),
           ("media_errors", h["media_errors"]), ("num_err_log_entries", h["num_err_log_entries"]),
           ("warning_temp_time", 0), ("critical_comp_time", 0), ("temperature_sensor_1", h["temperature_k"]),
           ("temperature_sensor_2", h["temperature_k"] + 6), ("thm_temp1_trans_count", 0),
           ("thm_temp2_trans_count", 0), ("thm_temp1_total_time", 0), ("thm_temp2_total_time", 0)]
    if str(node.scen["storage"].get("nvme_cli", "2.4")).startswith("1."):
        # nvme-cli 1.x stored the 128-bit counters as long double and printed them as floats.
        big = {"data_units_read", "data_units_written", "host_read_commands", "host_write_commands",
               "controller_busy_time", "power_cycles", "power_on_hours", "unsafe_shutdowns", "media_errors",
               "num_err_log_entries"}
        body = ",\n".join('  "%s" : %s' % (k, ("%.6f" % v) if k in big else str(v)) for k, v in doc)
        out.write("{\n" + body + "\n}\n")
    else:
        out.write(json.dumps(dict(doc), indent=2) + "\n")
    return 0


def _nvme_list(node, argv, out):
    devs = devices(node)
    if not _want_json(argv):
        out.write("Node                  Generic               SN                   Model                                    "
                  "Namespace Usage                      Format           FW Rev  \n")
        for i, d in enumerate(devs):
            out.write("/dev/%sn1          /dev/ng%dn1            %-20s %-40s 1         %6.2f  TB / %6.2f  TB    512   B "
                      "+  0 B   %s\n" % (d["name"], i, d["serial"], d["model"], d["size_bytes"] / 1e12 * 0.6,
                                        d["size_bytes"] / 1e12, d["firmware"]))
        return 0
    doc = {"Devices": [{"NameSpace": 1, "DevicePath": "/dev/%sn1" % d["name"], "GenericPath": "/dev/ng%dn1" % i,
                        "Firmware": d["firmware"], "Index": i, "ModelNumber": d["model"], "SerialNumber": d["serial"],
                        "UsedBytes": int(d["size_bytes"] * 0.6), "MaximumLBA": d["size_bytes"] // 512,
                        "PhysicalSize": d["size_bytes"], "SectorSize": 512} for i, d in enumerate(devs)]}
    out.write(json.dumps(doc, indent=2) + "\n")
    return 0


def smartctl(node, argv, out, err):
    paths = [a for a in argv if a.startswith("/dev/")]
    as_json = any(a == "-j" or a.startswith("--json") or (a.startswith("-") and not a.startswith("--") and "j" in a)
                  for a in argv)
    dev = _find(node, paths[0]) if paths else None
    if dev is None:
        msg = "Smartctl open device: %s failed: No such device" % (paths[0] if paths else "(none)")
        if as_json:
            out.write(json.dumps({"json_format_version": [1, 0], "smartctl": {
                "version": [7, 3], "argv": ["smartctl"] + list(argv), "exit_status": 2,
                "messages": [{"string": msg, "severity": "error"}]}}, indent=2) + "\n")
        else:
            err.write(msg + "\n")
        return 2
    h = _health(dev)
    status = 0
    failing = h["critical_warning"] != 0
    if failing:
        status |= 8  # bit 3: SMART status check returned "DISK FAILING"
    if h["num_err_log_entries"]:
        status |= 64  # bit 6: the device error log contains records of errors
    temp_c = h["temperature_k"] - 273
    now = int(time.time())
    doc = {
        "json_format_version": [1, 0],
        "smartctl": {"version": [7, 3], "svn_revision": "5338", "platform_info": "x86_64-linux-6.1.0-28-amd64",
                     "build_info": "(local build)", "argv": ["smartctl"] + list(argv), "exit_status": status},
        "local_time": {"time_t": now, "asctime": time.strftime("%a %b %d %H:%M:%S %Y %Z", time.localtime(now))},
        "device": {"name": paths[0], "info_name": paths[0], "type": "nvme", "protocol": "NVMe"},
        "model_name": dev["model"], "serial_number": dev["serial"], "firmware_version": dev["firmware"],
        "nvme_pci_vendor": {"id": 5197, "subsystem_id": 5197},
        "nvme_total_capacity": dev["size_bytes"],
        "user_capacity": {"blocks": dev["size_bytes"] // 512, "bytes": dev["size_bytes"]},
        "logical_block_size": 512,
        "smart_support": {"available": True, "enabled": True},
        "smart_status": {"passed": not failing, "nvme": {"value": h["critical_warning"]}},
        "nvme_smart_health_information_log": {
            "critical_warning": h["critical_warning"], "temperature": temp_c, "available_spare": h["avail_spare"],
            "available_spare_threshold": h["spare_thresh"], "percentage_used": h["percent_used"],
            "data_units_read": h["data_units_read"], "data_units_written": h["data_units_written"],
            "host_reads": h["host_read_commands"], "host_writes": h["host_write_commands"],
            "controller_busy_time": h["controller_busy_time"], "power_cycles": h["power_cycles"],
            "power_on_hours": h["power_on_hours"], "unsafe_shutdowns": h["unsafe_shutdowns"],
            "media_errors": h["media_errors"], "num_err_log_entries": h["num_err_log_entries"],
            "warning_temp_time": 0, "critical_comp_time": 0, "temperature_sensors": [temp_c, temp_c + 6]},
        "temperature": {"current": temp_c},
        "power_cycle_count": h["power_cycles"],
        "power_on_time": {"hours": h["power_on_hours"]},
    }
    if as_json:
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        out.write("smartctl 7.3 2022-02-28 r5338 [x86_64-linux-6.1.0-28-amd64] (local build)\n\n"
                  "SMART overall-health self-assessment test result: %s\n" % ("FAILED!" if failing else "PASSED"))
    return status
