"""Stand-in for nvidia-smi: --query-gpu / --query-compute-apps csv, --help-query-gpu, -q, -L, topo -m, plain table.

Driver generations (scenario driver.generation): "current" (R535+: pcie.link.gen.gpucurrent, clocks_event_reasons.*,
gpu_recovery_action, "Clocks Event Reasons" in -q) and "legacy" (R470-era: only pcie.link.gen.current,
clocks_throttle_reasons.*, "Clocks Throttle Reasons"). An unknown field aborts the whole query like the real tool.
"""

import sys
import time

from . import fabric
from .gpu import View

NA = "[N/A]"
EXIT_INVALID_ARG = 2
EXIT_GPU_LOST = 15
ALL = ("current", "legacy")
CUR = ("current",)


def lost_message(gpu):
    # Exactly the real wording (docs/signals.md section 2); the PCI address uses the 4-hex-digit domain, upper case.
    return ("Unable to determine the device handle for GPU %s: GPU is lost. Reboot the system to recover this GPU"
            % ("0000:%s:00.0" % gpu["bus"].upper()))


def _yes(b):
    return "Yes" if b else "No"


def _active(b):
    return "Active" if b else "Not Active"


def _ecc_field(kind, scope, part):
    def get(v, g):
        e = v.ecc(g)
        if e is None:
            return NA
        total = e["%s_%s" % (kind, scope)]
        if part == "total":
            return str(total)
        if part in ("dram", "device_memory"):
            return str(total - int(total * e["sram_corrected_share"]) if kind == "corrected" else total)
        if part == "sram":
            return str(int(total * e["sram_corrected_share"]) if kind == "corrected" else 0)
        return NA
    return get


def _ecc_counter(feature, key, fmt=str):
    """A counter of the ECC state that only cards with `feature` (remapped_rows, retired_pages) report."""
    def get(v, g):
        if not g[feature]:
            return NA
        e = v.ecc(g)
        return fmt(e[key]) if e else NA
    return get


def _remap(key, fmt=str):
    return _ecc_counter("remapped_rows", key, fmt)


def _retired(key, fmt=str):
    return _ecc_counter("retired_pages", key, fmt)


def _hist(level):
    def get(v, g):
        if not g["remapped_rows"]:
            return NA
        e = v.ecc(g)
        return str(e["remap_histogram"][level]) if e else NA
    return get


def _reason(bit):
    return lambda v, g: _active(v.throttle_mask(g) & bit)


# (names: primary first then aliases, unit, getter(view, gpu) -> text, driver generations that know it, help text)
FIELDS = [
    (("timestamp",), None, lambda v, g: time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(v.clock_now))
     + ".%03d" % int((v.clock_now % 1) * 1000), ALL, "The timestamp of when the query was made."),
    (("driver_version",), None, lambda v, g: v.node.scen["driver"]["version"], ALL,
     "The version of the installed NVIDIA display driver."),
    (("count",), None, lambda v, g: str(len(v.node.gpus)), ALL, "The number of NVIDIA GPUs in the system."),
    (("name", "gpu_name"), None, lambda v, g: g["name"], ALL, "The official product name of the GPU."),
    (("serial", "gpu_serial"), None, lambda v, g: g["serial"] or NA, ALL, "The serial number of the board."),
    (("uuid", "gpu_uuid"), None, lambda v, g: g["uuid"], ALL, "The globally unique immutable identifier of the GPU."),
    (("pci.bus_id", "gpu_bus_id"), None, lambda v, g: g["pci_bus_id"], ALL,
     "PCI bus id as \"domain:bus:device.function\", in hex."),
    (("pci.domain",), None, lambda v, g: "0x0000", ALL, "PCI domain number, in hex."),
    (("pci.bus",), None, lambda v, g: "0x" + g["bus"].upper(), ALL, "PCI bus number, in hex."),
    (("pci.device",), None, lambda v, g: "0x00", ALL, "PCI device number, in hex."),
    (("pci.device_id",), None, lambda v, g: "0x%s10DE" % g["pci_device_id"].upper(), ALL, "PCI vendor device id."),
    (("index",), None, lambda v, g: str(g["index"]), ALL, "Zero based index of the GPU."),
    (("minor_number",), None, lambda v, g: str(g["index"]), ALL, "The minor number for the device."),
    (("vbios_version",), None, lambda v, g: g["vbios"], ALL, "The BIOS of the GPU board."),
    (("inforom.img", "inforom.image"), None, lambda v, g: g.get("inforom_image") or "G500.0200.00.05", ALL,
     "Global version of the infoROM image."),
    (("compute_cap",), None, lambda v, g: g["compute_cap"], ALL, "The CUDA Compute Capability."),
    (("persistence_mode",), None, lambda v, g: "Enabled", ALL, "The current persistence mode for the GPU."),
    (("pstate",), None, lambda v, g: v.pstate(g), ALL, "The current performance state for the GPU."),
    (("ecc.mode.current",), None, lambda v, g: "Enabled" if g["ecc"] else NA, ALL, "The ECC mode."),
    (("ecc.mode.pending",), None, lambda v, g: "Enabled" if g["ecc"] else NA, ALL, "The ECC mode after reboot."),
    (("mig.mode.current",), None, lambda v, g: "Disabled" if g["mig"] else NA, ALL, "The MIG mode."),
    (("gpu_recovery_action",), None, lambda v, g: g.get("recovery_action", "None"), CUR,
     "The recovery action the driver recommends (None, Reset, Reboot, Drain P2P, Drain and Reset)."),
    (("pcie.link.gen.current",), None, lambda v, g: str(v.pcie_gen(g)), ALL, "The current PCI-E link generation."),
    (("pcie.link.gen.gpucurrent",), None, lambda v, g: str(v.pcie_gen(g)), CUR,
     "The current PCI-E link generation of the GPU."),
    (("pcie.link.gen.max",), None, lambda v, g: str(g["pcie_gen_max"]), ALL, "The maximum PCI-E link generation."),
    (("pcie.link.gen.gpumax",), None, lambda v, g: str(g["pcie_gen_max"]), CUR,
     "The maximum PCI-E link generation supported by the GPU."),
    (("pcie.link.gen.hostmax",), None, lambda v, g: str(g["pcie_gen_max"]), CUR,
     "The maximum PCI-E link generation supported by the root port."),
    (("pcie.link.width.current",), None, lambda v, g: str(v.pcie_width(g)), ALL, "The current PCI-E link width."),
    (("pcie.link.width.max",), None, lambda v, g: str(g["pcie_width_max"]), ALL, "The maximum PCI-E link width."),
    (("fan.speed",), "%", lambda v, g: (str(min(100, 30 + int(v.temperature_c(g) - g["idle_temp_c"])))
                                        if g["fan"] else NA), ALL, "The fan speed value."),
    (("temperature.gpu",), None, lambda v, g: str(v.temperature_c(g)), ALL, "Core GPU temperature, in degrees C."),
    # Consumer cards print a bare N/A here (no brackets): one of the spellings parsers must accept.
    (("temperature.memory",), None, lambda v, g: ("N/A" if v.memory_temperature_c(g) is None
                                                  else str(v.memory_temperature_c(g))), ALL, "HBM temperature."),
    (("power.draw",), "W", lambda v, g: "%.2f" % v.power_w(g), ALL, "The last measured power draw, in watts."),
    (("power.draw.average",), "W", lambda v, g: "%.2f" % v.power_w(g), CUR, "Average power draw, in watts."),
    (("power.draw.instant",), "W", lambda v, g: "%.2f" % v.power_w(g), CUR, "Instant power draw, in watts."),
    (("power.limit",), "W", lambda v, g: "%.2f" % g["power_limit_w"], ALL, "The software power limit, in watts."),
    (("enforced.power.limit",), "W", lambda v, g: "%.2f" % g["power_limit_w"], ALL, "The enforced power limit."),
    (("clocks.current.sm", "clocks.sm"), "MHz", lambda v, g: str(v.clocks_sm_mhz(g)), ALL, "Current SM clock."),
    (("clocks.max.sm", "clocks.max.sm"), "MHz", lambda v, g: str(g["clocks_sm_max_mhz"]), ALL, "Max SM clock."),
    (("utilization.gpu",), "%", lambda v, g: str(v.utilization(g)), ALL, "GPU utilization."),
    (("utilization.memory",), "%", lambda v, g: str(int(v.utilization(g) * 0.6)), ALL, "Memory utilization."),
    (("memory.total",), "MiB", lambda v, g: str(g["memory_total_mib"]), ALL, "Total installed GPU memory."),
    (("memory.reserved",), "MiB", lambda v, g: str(g["memory_reserved_mib"]), ALL, "Memory reserved by the driver."),
    (("memory.used",), "MiB", lambda v, g: str(v.memory_used_mib(g)), ALL, "Total memory allocated."),
    (("memory.free",), "MiB", lambda v, g: str(g["memory_total_mib"] - g["memory_reserved_mib"]
                                               - v.memory_used_mib(g)), ALL, "Total free memory."),
]

_REASONS = [("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4), ("hw_slowdown", 0x8),
            ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20), ("hw_thermal_slowdown", 0x40),
            ("hw_power_brake_slowdown", 0x80)]
for _prefix, _gens in (("clocks_event_reasons", CUR), ("clocks_throttle_reasons", ALL)):
    FIELDS.append(((_prefix + ".active",), None, lambda v, g: "0x%016X" % v.throttle_mask(g), _gens,
                   "Bitmask of active clock event reasons."))
    FIELDS.append(((_prefix + ".supported",), None, lambda v, g: "0x00000000000001FF", _gens,
                   "Bitmask of supported clock event reasons."))
    for _name, _bit in _REASONS:
        FIELDS.append(((_prefix + "." + _name,), None, _reason(_bit), _gens, "Clock event reason " + _name + "."))
for _kind in ("corrected", "uncorrected"):
    for _scope in ("volatile", "aggregate"):
        for _part in ("total", "dram", "sram", "device_memory", "register_file", "l1_cache", "l2_cache",
                      "texture_memory", "cbu"):
            FIELDS.append((("ecc.errors.%s.%s.%s" % (_kind, _scope, _part),), None,
                           _ecc_field(_kind, _scope, _part), ALL, "ECC error counter."))
FIELDS += [
    (("ecc.errors.uncorrected.aggregate.sram.thresholdExceeded",), None,
     lambda v, g: (_yes(v.ecc(g)["sram_threshold_exceeded"]) if g["sram_threshold"] and v.ecc(g) else NA), CUR,
     "Whether the SRAM uncorrectable error threshold was exceeded."),
    (("retired_pages.single_bit_ecc.count", "retired_pages.sbe"), None, _retired("retired_sbe"), ALL,
     "Pages retired for multiple single bit ECC errors."),
    (("retired_pages.double_bit.count", "retired_pages.dbe"), None, _retired("retired_dbe"), ALL,
     "Pages retired for a double bit ECC error."),
    (("retired_pages.pending",), None, _retired("retired_pending", _yes), ALL, "Page retirement pending reboot."),
    (("remapped_rows.correctable",), None, _remap("remapped_rows_correctable"), ALL, "Rows remapped: correctable."),
    (("remapped_rows.uncorrectable",), None, _remap("remapped_rows_uncorrectable"), ALL, "Rows remapped: uncorr."),
    (("remapped_rows.pending",), None, _remap("remapped_rows_pending", _yes), ALL, "Row remapping pending."),
    (("remapped_rows.failure",), None, _remap("remapped_rows_failure", _yes), ALL, "Row remapping failed."),
]
for _level in ("max", "high", "partial", "low", "none"):
    FIELDS.append((("remapped_rows.histogram." + _level,), None, _hist(_level), ALL, "Bank remap availability."))

COMPUTE_APP_FIELDS = [
    (("timestamp",), None), (("gpu_name",), None), (("gpu_bus_id",), None), (("gpu_serial",), None),
    (("gpu_uuid",), None), (("pid",), None), (("process_name", "name"), None),
    (("used_gpu_memory", "used_memory"), "MiB"),
]


def _field_index(generation):
    index = {}
    for names, unit, getter, gens, _help in FIELDS:
        if generation in gens:
            for n in names:
                index[n] = (names[0], unit, getter)
    return index


class Args:
    def __init__(self):
        self.query_gpu = None
        self.query_apps = None
        self.fmt = None
        self.ids = None
        self.q = False
        self.display = None
        self.list = False
        self.help_query_gpu = False
        self.help_query_apps = False
        self.topo = False
        self.nvlink = None  # "status" | "errors" | "" (nvlink without a known action)
        self.loop_s = None
        self.reset = False
        self.xml = False
        self.bad = None


def parse_args(argv):
    a = Args()
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, _, inline = arg.partition("=")

        def value(inline=inline):
            nonlocal i
            if inline:
                return inline
            i += 1
            return argv[i] if i < len(argv) else ""
        if key in ("--query-gpu",):
            a.query_gpu = value()
        elif key in ("--query-compute-apps",):
            a.query_apps = value()
        elif key in ("--format",):
            a.fmt = value()
        elif key in ("-i", "--id"):
            a.ids = value()
        elif key in ("-q", "--query"):
            a.q = True
        elif key in ("-x", "--xml-format"):
            a.xml = True
        elif key in ("-d", "--display"):
            a.display = value()
        elif key in ("-L", "--list-gpus"):
            a.list = True
        elif key == "--help-query-gpu":
            a.help_query_gpu = True
        elif key == "--help-query-compute-apps":
            a.help_query_apps = True
        elif key in ("-l", "--loop"):
            a.loop_s = float(value() or 5)
        elif key in ("-lms", "--loop-ms"):
            a.loop_s = float(value() or 1000) / 1000.0
        elif key in ("-r", "--gpu-reset"):
            a.reset = True
        elif key == "topo":
            a.topo = True
        elif key == "-m" and a.topo:
            pass
        elif key == "nvlink":
            a.nvlink = ""
        elif key in ("-s", "--status") and a.nvlink is not None:
            a.nvlink = "status"
        elif key in ("-e", "--errorcounters") and a.nvlink is not None:
            a.nvlink = "errors"
        else:
            a.bad = arg
        i += 1
    return a


def _select(node, ids):
    if not ids:
        return list(node.gpus)
    out = []
    for token in ids.split(","):
        token = token.strip()
        for g in node.gpus:
            if token == str(g["index"]) or token == g["uuid"] or token.upper() in (g["pci_bus_id"], g["pci_bus_id"][4:]):
                out.append(g)
    return out


def main(node, argv, out=sys.stdout, err=sys.stderr):
    a = parse_args(argv)
    if a.bad:
        err.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
        return EXIT_INVALID_ARG
    if a.help_query_gpu:
        return help_query_gpu(node, out)
    if a.help_query_apps:
        out.write('List of valid properties to query for the switch "--query-compute-apps=":\n\n')
        for names, _u in COMPUTE_APP_FIELDS:
            out.write(" or ".join('"%s"' % n for n in names) + "\n\n")
        return 0
    while True:
        if a.reset:
            return gpu_reset(node, a, out)
        if a.query_gpu is not None:
            rc = query_gpu(node, a, out)
        elif a.query_apps is not None:
            rc = query_apps(node, a, out)
        elif a.q and a.xml:
            rc = query_xml(node, a, out)
        elif a.q:
            rc = query_tree(node, a, out)
        elif a.list:
            rc = list_gpus(node, a, out)
        elif a.topo:
            rc = topo(node, out)
        elif a.nvlink is not None:
            rc = nvlink(node, a, out, err)
        else:
            rc = table(node, out)
        if a.loop_s is None or rc == EXIT_INVALID_ARG:
            return rc
        out.flush()
        time.sleep(a.loop_s)


def _format_flags(fmt):
    flags = [f.strip() for f in (fmt or "").split(",") if f.strip()]
    if not flags or flags[0] != "csv" or any(f not in ("csv", "noheader", "nounits") for f in flags):
        return None
    return "noheader" not in flags, "nounits" not in flags


def query_gpu(node, a, out):
    flags = _format_flags(a.fmt)
    if flags is None:
        out.write('"--format=" switch is missing or invalid. Please run \'nvidia-smi -h\' for help.\n')
        return EXIT_INVALID_ARG
    header, units = flags
    index = _field_index(node.scen["driver"].get("generation", "current"))
    names = [f.strip() for f in a.query_gpu.split(",") if f.strip()]
    for n in names:
        if n not in index:
            # One unknown name aborts the whole query (the field sets differ between drivers).
            out.write('Field "%s" is not a valid field to query.\n\n' % n)
            return EXIT_INVALID_ARG
    view = View(node)
    broken = node.scen.get("nvidia_smi", {}).get("output", "")
    if broken == "junk":
        # A broken or wrong binary on PATH: exit 0 with lines that are not rows of the query.
        out.write("NVIDIA-SMI has encountered an unexpected condition\n#### ?? ####\nok ok ok\n")
        return 0
    if header:
        out.write(", ".join(_header(index[n][0] if n == index[n][0] else n, index[n][1], units) for n in names) + "\n")
    rc = 0
    gpus = list(_select(node, a.ids))
    if broken.startswith("rows:"):
        gpus = gpus[:int(broken.split(":", 1)[1])]  # output that stops early (a hung driver call killed)
    for g in gpus:
        if g["index"] in view.lost:
            out.write(lost_message(g) + "\n")
            rc = EXIT_GPU_LOST
            continue
        cells = []
        for n in names:
            _primary, unit, getter = index[n]
            value = getter(view, g)
            if units and unit and not value.startswith("[") and value != "N/A":
                value = "%s %s" % (value, unit)
            cells.append(value)
        out.write(", ".join(cells) + "\n")
    return rc


def _header(name, unit, units):
    return "%s [%s]" % (name, unit) if unit and units else name


# --gpu-reset's wording and exit codes as the real tool prints them (NVIDIA/NVSentinel#1690, NVIDIA/gpu-operator#118):
# success says so per GPU and exits 0; a GPU with any client (a process, persistenced, Fabric Manager) is refused,
# exit 255; a lost GPU cannot be reached at all.
IN_USE = ("1 device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, "
          "graphics application such as an X server, or a monitoring application such as another instance of "
          "nvidia-smi). Please first kill all processes using this device and all compute applications running in the "
          "system.")
EXIT_RESET_REFUSED = 255


def gpu_reset(node, a, out):
    """nvidia-smi --gpu-reset [-i ID]: reset the GPU(s) that no process holds; pending remaps are applied."""
    view = View(node)
    gpus = _select(node, a.ids)
    if not gpus:
        out.write("No devices were found\n")
        return 6
    lost = [g for g in gpus if g["index"] in view.lost]
    if lost:
        out.write(lost_message(lost[0]) + "\n")
        return EXIT_GPU_LOST
    busy = [g for g in gpus if view.processes(g)]
    if busy:
        out.write("The following GPUs could not be reset:\n")
        for g in busy:
            out.write("  GPU %s: In use by another client\n" % g["pci_bus_id"])
        out.write("\n" + IN_USE + "\n")
        return EXIT_RESET_REFUSED
    for g in gpus:
        node.mark_reset(g["index"])
        out.write("GPU %s was successfully reset.\n" % g["pci_bus_id"])
    return 0


def query_apps(node, a, out):
    flags = _format_flags(a.fmt)
    if flags is None:
        out.write('"--format=" switch is missing or invalid. Please run \'nvidia-smi -h\' for help.\n')
        return EXIT_INVALID_ARG
    header, units = flags
    index = {}
    for names, unit in COMPUTE_APP_FIELDS:
        for n in names:
            index[n] = (names[0], unit)
    names = [f.strip() for f in a.query_apps.split(",") if f.strip()]
    for n in names:
        if n not in index:
            out.write('Field "%s" is not a valid field to query.\n\n' % n)
            return EXIT_INVALID_ARG
    view = View(node)
    if header:
        out.write(", ".join(_header(n, index[n][1], units) for n in names) + "\n")
    rc = 0
    for g in _select(node, a.ids):
        if g["index"] in view.lost:
            out.write(lost_message(g) + "\n")
            rc = EXIT_GPU_LOST
            continue
        for pid, pname, mem in view.processes(g):
            values = {"timestamp": time.strftime("%Y/%m/%d %H:%M:%S.000", time.localtime(view.now)),
                      "gpu_name": g["name"], "gpu_bus_id": g["pci_bus_id"], "gpu_serial": g["serial"] or NA,
                      "gpu_uuid": g["uuid"], "pid": str(pid), "process_name": pname,
                      "used_gpu_memory": "%d MiB" % mem if units else str(mem)}
            out.write(", ".join(values[index[n][0]] for n in names) + "\n")
    return rc


def help_query_gpu(node, out):
    gen = node.scen["driver"].get("generation", "current")
    out.write('List of valid properties to query for the switch "--query-gpu=":\n\n')
    for names, _unit, _getter, gens, text in FIELDS:
        if gen in gens:
            out.write(" or ".join('"%s"' % n for n in dict.fromkeys(names)) + "\n" + text + "\n\n")
    return 0


def list_gpus(node, a, out):
    lost = node.lost()
    rc = 0
    for g in _select(node, a.ids):
        if g["index"] in lost:
            out.write(lost_message(g) + "\n")
            rc = EXIT_GPU_LOST
            continue
        out.write("GPU %d: %s (UUID: %s)\n" % (g["index"], g["name"], g["uuid"]))
    return rc


# ---- -q -----------------------------------------------------------------------------------------------------
def _kv(lines, indent, key, value=None):
    if value is None:
        lines.append(" " * indent + key)
    else:
        lines.append((" " * indent + key).ljust(42) + ": " + str(value))


def query_xml(node, a, out):
    """-q -x: the identity part of the real XML log (nvsmi_device_v12.dtd element names), one <gpu> per GPU."""
    from xml.sax.saxutils import escape

    view = View(node)
    lines = ['<?xml version="1.0" ?>', '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">', "<nvidia_smi_log>",
             "\t<timestamp>%s</timestamp>" % time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(view.clock_now)),
             "\t<driver_version>%s</driver_version>" % node.scen["driver"]["version"],
             "\t<cuda_version>%s</cuda_version>" % node.scen["driver"]["cuda_version"],
             "\t<attached_gpus>%d</attached_gpus>" % len(node.gpus)]
    rc = 0
    for g in _select(node, a.ids):
        if g["index"] in view.lost:
            rc = EXIT_GPU_LOST
            continue
        lines += ['\t<gpu id="%s">' % g["pci_bus_id"], "\t\t<product_name>%s</product_name>" % escape(g["name"]),
                  "\t\t<serial>%s</serial>" % (g["serial"] or "N/A"), "\t\t<uuid>%s</uuid>" % g["uuid"],
                  "\t\t<vbios_version>%s</vbios_version>" % g["vbios"],
                  "\t\t<pci>", "\t\t\t<pci_bus_id>%s</pci_bus_id>" % g["pci_bus_id"], "\t\t</pci>",
                  "\t\t<temperature>", "\t\t\t<gpu_temp>%d C</gpu_temp>" % view.temperature_c(g),
                  "\t\t</temperature>", "\t</gpu>"]
    lines.append("</nvidia_smi_log>")
    out.write("\n".join(lines) + "\n")
    return rc


def query_tree(node, a, out):
    view = View(node)
    legacy = node.scen["driver"].get("generation", "current") == "legacy"
    display = set(d.strip().upper() for d in (a.display or "").split(",") if d.strip())
    lines = ["", "==============NVSMI LOG==============", ""]
    _kv(lines, 0, "Timestamp", time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(view.clock_now)))
    _kv(lines, 0, "Driver Version", node.scen["driver"]["version"])
    _kv(lines, 0, "CUDA Version", node.scen["driver"]["cuda_version"])
    lines.append("")
    _kv(lines, 0, "Attached GPUs", len(node.gpus))
    rc = 0
    for g in _select(node, a.ids):
        if g["index"] in view.lost:
            lines.append(lost_message(g))
            rc = EXIT_GPU_LOST
            continue
        lines.append("GPU " + g["pci_bus_id"])
        lines += _gpu_sections(view, g, legacy, display)
        lines.append("")
    out.write("\n".join(lines) + "\n")
    return rc


def _gpu_sections(view, g, legacy, display):
    def want(*tags):
        return not display or any(t in display for t in tags)
    s = []
    if not display:
        _kv(s, 4, "Product Name", g["name"])
        _kv(s, 4, "Product Brand", g["brand"])
        _kv(s, 4, "Product Architecture", g["architecture"])
        _kv(s, 4, "Persistence Mode", "Enabled")
        _kv(s, 4, "MIG Mode")
        _kv(s, 8, "Current", "Disabled" if g["mig"] else "N/A")
        _kv(s, 8, "Pending", "Disabled" if g["mig"] else "N/A")
        _kv(s, 4, "Serial Number", g["serial"] or "N/A")
        _kv(s, 4, "GPU UUID", g["uuid"])
        _kv(s, 4, "Minor Number", g["index"])
        _kv(s, 4, "VBIOS Version", g["vbios"])
        if not legacy:
            _kv(s, 4, "GPU Recovery Action", g.get("recovery_action", "None"))
            state, status = fabric.fabric_state(view.node, g)
            _kv(s, 4, "Fabric")
            _kv(s, 8, "State", state)
            _kv(s, 8, "Status", status)
            on_fabric = state != "N/A"
            _kv(s, 8, "CliqueId", 0 if on_fabric else "N/A")
            _kv(s, 8, "ClusterUUID", "00000000-0000-0000-0000-000000000000" if on_fabric else "N/A")
            _kv(s, 8, "Health")
            for label, value in fabric.fabric_health(view.node, g, state):
                _kv(s, 12, label, value)
        _kv(s, 4, "PCI")
        _kv(s, 8, "Bus", "0x" + g["bus"].upper())
        _kv(s, 8, "Device", "0x00")
        _kv(s, 8, "Domain", "0x0000")
        _kv(s, 8, "Device Id", "0x%s10DE" % g["pci_device_id"].upper())
        _kv(s, 8, "Bus Id", g["pci_bus_id"])
        _kv(s, 8, "GPU Link Info")
        _kv(s, 12, "PCIe Generation")
        _kv(s, 16, "Max", g["pcie_gen_max"])
        _kv(s, 16, "Current", view.pcie_gen(g))
        if not legacy:
            _kv(s, 16, "Device Current", view.pcie_gen(g))
            _kv(s, 16, "Device Max", g["pcie_gen_max"])
            _kv(s, 16, "Host Max", g["pcie_gen_max"])
        _kv(s, 12, "Link Width")
        _kv(s, 16, "Max", "%dx" % g["pcie_width_max"])
        _kv(s, 16, "Current", "%dx" % view.pcie_width(g))
        _kv(s, 8, "Bridge Chip")
        _kv(s, 12, "Type", "N/A")
        _kv(s, 12, "Firmware", "N/A")
        _kv(s, 8, "Replays Since Reset", view.pcie_replays(g))
        _kv(s, 8, "Replay Number Rollovers", 0)
        _kv(s, 8, "Tx Throughput", "%d KB/s" % (812000 if view.under_load(g["index"]) else 0))
        _kv(s, 8, "Rx Throughput", "%d KB/s" % (790000 if view.under_load(g["index"]) else 0))
        _kv(s, 4, "Fan Speed", ("%d %%" % (30 + max(0, view.temperature_c(g) - g["idle_temp_c"]))) if g["fan"] else "N/A")
        _kv(s, 4, "Performance State", view.pstate(g))
        mask = view.throttle_mask(g)
        _kv(s, 4, "Clocks Throttle Reasons" if legacy else "Clocks Event Reasons")
        _kv(s, 8, "Idle", _active(mask & 0x1))
        _kv(s, 8, "Applications Clocks Setting", _active(mask & 0x2))
        _kv(s, 8, "SW Power Cap", _active(mask & 0x4))
        _kv(s, 8, "HW Slowdown", _active(mask & 0x8))
        _kv(s, 12, "HW Thermal Slowdown", _active(mask & 0x40))
        _kv(s, 12, "HW Power Brake Slowdown", _active(mask & 0x80))
        _kv(s, 8, "Sync Boost", _active(mask & 0x10))
        _kv(s, 8, "SW Thermal Slowdown", _active(mask & 0x20))
        _kv(s, 8, "Display Clock Setting", "Not Active")
    if want("MEMORY"):
        used = view.memory_used_mib(g)
        _kv(s, 4, "FB Memory Usage")
        _kv(s, 8, "Total", "%d MiB" % g["memory_total_mib"])
        _kv(s, 8, "Reserved", "%d MiB" % g["memory_reserved_mib"])
        _kv(s, 8, "Used", "%d MiB" % used)
        _kv(s, 8, "Free", "%d MiB" % (g["memory_total_mib"] - g["memory_reserved_mib"] - used))
    if not display:
        _kv(s, 4, "Compute Mode", "Default")
        _kv(s, 4, "Utilization")
        _kv(s, 8, "Gpu", "%d %%" % view.utilization(g))
        _kv(s, 8, "Memory", "%d %%" % int(view.utilization(g) * 0.6))
    e = view.ecc(g)
    if want("ECC"):
        _kv(s, 4, "ECC Mode")
        _kv(s, 8, "Current", "Enabled" if g["ecc"] else "N/A")
        _kv(s, 8, "Pending", "Enabled" if g["ecc"] else "N/A")
        _kv(s, 4, "ECC Errors")
        for scope in ("volatile", "aggregate"):
            _kv(s, 8, scope.capitalize())
            if e is None:
                for key in ("SRAM Correctable", "SRAM Uncorrectable", "DRAM Correctable", "DRAM Uncorrectable"):
                    _kv(s, 12, key, "N/A")
                continue
            corr, unc = e["corrected_" + scope], e["uncorrected_" + scope]
            sram = int(corr * e["sram_corrected_share"])
            _kv(s, 12, "SRAM Correctable", sram)
            _kv(s, 12, "SRAM Uncorrectable Parity", 0)
            _kv(s, 12, "SRAM Uncorrectable SEC-DED", 0)
            _kv(s, 12, "DRAM Correctable", corr - sram)
            _kv(s, 12, "DRAM Uncorrectable", unc)
        if g["sram_threshold"] and e is not None:
            _kv(s, 12, "SRAM Threshold Exceeded", _yes(e["sram_threshold_exceeded"]))
    if want("PAGE_RETIREMENT"):
        _kv(s, 4, "Retired Pages")
        ok = g["retired_pages"] and e is not None
        _kv(s, 8, "Single Bit ECC", e["retired_sbe"] if ok else "N/A")
        _kv(s, 8, "Double Bit ECC", e["retired_dbe"] if ok else "N/A")
        _kv(s, 8, "Pending Page Blacklist", _yes(e["retired_pending"]) if ok else "N/A")
    if want("ROW_REMAPPER"):
        if g["remapped_rows"] and e is not None:
            _kv(s, 4, "Remapped Rows")
            _kv(s, 8, "Correctable Error", e["remapped_rows_correctable"])
            _kv(s, 8, "Uncorrectable Error", e["remapped_rows_uncorrectable"])
            _kv(s, 8, "Pending", _yes(e["remapped_rows_pending"]))
            _kv(s, 8, "Remapping Failure Occurred", _yes(e["remapped_rows_failure"]))
            _kv(s, 8, "Bank Remap Availability Histogram")
            for level in ("max", "high", "partial", "low", "none"):
                _kv(s, 12, level.capitalize(), "%d bank(s)" % e["remap_histogram"][level])
        else:
            _kv(s, 4, "Remapped Rows", "N/A")  # consumer cards: a key with a value and no children
    if want("TEMPERATURE"):
        _kv(s, 4, "Temperature")
        _kv(s, 8, "GPU Current Temp", "%d C" % view.temperature_c(g))
        _kv(s, 8, "GPU Shutdown Temp", "%d C" % g["shutdown_temp_c"])
        _kv(s, 8, "GPU Slowdown Temp", "%d C" % g["slowdown_temp_c"])
        _kv(s, 8, "GPU Max Operating Temp", "%d C" % (g["slowdown_temp_c"] - 3))
        mt = view.memory_temperature_c(g)
        _kv(s, 8, "Memory Current Temp", "N/A" if mt is None else "%d C" % mt)
    if want("POWER"):
        _kv(s, 4, "GPU Power Readings" if not legacy else "Power Readings")
        _kv(s, 8, "Power Draw", "%.2f W" % view.power_w(g))
        _kv(s, 8, "Current Power Limit", "%.2f W" % g["power_limit_w"])
        _kv(s, 8, "Default Power Limit", "%.2f W" % g["power_limit_w"])
    if want("PIDS") or not display:
        procs = view.processes(g)
        if not procs:
            _kv(s, 4, "Processes", "None")
        else:
            _kv(s, 4, "Processes")
            for pid, name, mem in procs:
                _kv(s, 8, "GPU instance ID", "N/A")
                _kv(s, 8, "Compute instance ID", "N/A")
                _kv(s, 8, "Process ID", pid)
                _kv(s, 12, "Type", "C")
                _kv(s, 12, "Name", name)
                _kv(s, 12, "Used GPU Memory", "%d MiB" % mem)
    return s


# ---- topo -m, plain table --------------------------------------------------------------------------------------
def topo(node, out):
    n = len(node.gpus)
    up = [fabric.links_up(node, g) for g in node.gpus]
    ul, reset = "\x1b[4m", "\x1b[0m"
    cols = ["GPU%d" % i for i in range(n)] + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    out.write("\t" + "\t".join(ul + c + reset for c in cols) + "\n")
    for i in range(n):
        cells = []
        for j in range(n):
            if i == j:
                cells.append(" X ")
            elif up[i] and up[j]:
                # Bonded links between the pair: through the switches every GPU reaches every peer on all its links.
                cells.append("NV%d" % min(up[i], up[j]))
            else:
                cells.append("NODE" if (i < n // 2) == (j < n // 2) else "SYS ")
        numa = 0 if i < n // 2 else 1
        cpus = "0-47,96-143" if numa == 0 else "48-95,144-191"
        out.write("GPU%d\t" % i + "\t".join(cells) + "\t%s\t%d\t\tN/A\n" % (cpus, numa))
    out.write("\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA "
              "nodes (e.g., QPI/UPI)\n  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host "
              "Bridges within a NUMA node\n  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically "
              "the CPU)\n  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
              "  PIX  = Connection traversing at most a single PCIe bridge\n  NV#  = Connection traversing a bonded set "
              "of # NVLinks\n")
    return 0


def nvlink(node, a, out, err):
    """nvlink -s (each link's speed or <inactive>) and nvlink -e (Replay/Recovery/CRC counters), -i selects GPUs."""
    if a.nvlink not in ("status", "errors"):
        err.write("Invalid combination of input arguments. Please run 'nvidia-smi nvlink -h' for help.\n")
        return EXIT_INVALID_ARG
    view = View(node)
    rc = 0
    for g in _select(node, a.ids):
        if g["index"] in view.lost:
            out.write(lost_message(g) + "\n")
            rc = EXIT_GPU_LOST
            continue
        out.write("GPU %d: %s (UUID: %s)\n" % (g["index"], g["name"], g["uuid"]))
        links = fabric.links(node, g)
        if a.nvlink == "status":
            if links and fabric.links_up(node, g) == 0 and (node.scen.get("nvlink") or {}).get("gpus", {}).get(
                    str(g["index"]), {}).get("all_inactive"):
                out.write("NVML: Unable to retrieve NVLink information as all links are inActive\n")
                continue
            for link, speed in links:
                out.write("\t Link %d: %s\n" % (link, "<inactive>" if speed is None else "%s GB/s" % _speed(speed)))
        else:
            for link, values in sorted(fabric.counters(node, view, g).items()):
                for label in ("Replay Errors", "Recovery Errors", "CRC Errors"):
                    out.write("\t Link %d: %s: %d\n" % (link, label, values[label]))
                out.write("\n")
    return rc


def _speed(value):
    """26.562 -> "26.562", 25.0 -> "25" (as nvidia-smi prints them)."""
    return ("%.3f" % value).rstrip("0").rstrip(".")


def table(node, out):
    view = View(node)
    lost = [g for g in node.gpus if g["index"] in view.lost]
    if lost:
        # The plain table gives up entirely when a GPU is lost.
        for g in lost:
            out.write(lost_message(g) + "\n")
        return EXIT_GPU_LOST
    drv = node.scen["driver"]
    bar = "+-----------------------------------------+------------------------+----------------------+"
    out.write(time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(view.now)) + "       \n")
    out.write("+-----------------------------------------------------------------------------------------+\n")
    head = " NVIDIA-SMI %-26s Driver Version: %-14s CUDA Version: %s" % (drv["version"], drv["version"],
                                                                          drv["cuda_version"])
    out.write("|" + head.ljust(89) + "|\n")
    out.write("|" + bar[1:] + "\n")
    out.write("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n")
    out.write("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n")
    out.write("|                                         |                        |               MIG M. |\n")
    out.write(bar.replace("-", "=").replace("+", "|") + "\n")
    for g in node.gpus:
        e = view.ecc(g)
        fan = ("%d%%" % (30 + max(0, view.temperature_c(g) - g["idle_temp_c"]))) if g["fan"] else "N/A"
        left1 = ("%3d  %s" % (g["index"], g["name"][:26])).ljust(35) + "On".rjust(4)
        left2 = "%3s  %3dC    %-4s" % (fan, view.temperature_c(g), view.pstate(g))
        left2 += ("%dW / %4dW" % (view.power_w(g), g["power_limit_w"])).rjust(39 - len(left2))
        mid2 = ("%dMiB / %6dMiB" % (view.memory_used_mib(g), g["memory_total_mib"])).rjust(22)
        right1 = (str(e["uncorrected_volatile"]) if e else "N/A").rjust(20)
        right2 = ("%d%%" % view.utilization(g)).rjust(8) + "Default".rjust(12)
        out.write("| %s | %s | %s |\n" % (left1, ("%s %s" % (g["pci_bus_id"], "Off".rjust(5))).rjust(22), right1))
        out.write("| %s | %s | %s |\n" % (left2, mid2, right2))
        out.write("| %39s | %22s | %20s |\n" % ("", "", "Disabled" if g["mig"] else "N/A"))
        out.write(bar + "\n")
    out.write("\n+-----------------------------------------------------------------------------------------+\n")
    out.write("| Processes:                                                                              |\n")
    out.write("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n")
    out.write("|        ID   ID                                                               Usage      |\n")
    out.write("|=========================================================================================|\n")
    rows = [(g, p) for g in node.gpus for p in view.processes(g)]
    if not rows:
        out.write("|  No running processes found                                                             |\n")
    for g, (pid, name, mem) in rows:
        out.write("|  %3d   N/A  N/A  %12d      C   %-34s %8dMiB |\n" % (g["index"], pid, name[-34:], mem))
    out.write("+-----------------------------------------------------------------------------------------+\n")
    return 0
