# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parsers for nvidia-smi output (stdlib only: runs on the node). One pure function per format, none raises.

  parse_query_gpu(text, fields)      --query-gpu=<fields> --format=csv[,noheader][,nounits]
  parse_compute_apps(text, fields)   --query-compute-apps=<fields> --format=csv[,noheader][,nounits]
  parse_q(text)                      -q (indented "key : value" tree)
  parse_help_query_gpu(text)         --help-query-gpu (the field names this driver accepts)
  parse_tool_messages(text)          error lines nvidia-smi prints instead of (or among) data rows

Traps handled (nvidia-smi(1) and public bug reports): six spellings of "no value" (all become None, never a string), names
with commas (the CSV is not quoted), a rejected field name aborting the whole query, a lost GPU printing an error line
among the other GPUs' rows, "Clocks Throttle Reasons" (old drivers) vs "Clocks Event Reasons", "Remapped Rows : N/A"
on consumer cards.

A lost GPU is named in several wordings (issue reports of NVIDIA drivers 2015-2026), all read as {kind: lost, pci, index}:
  Unable to determine the device handle for GPU 0000:C1:00.0: GPU is lost. Reboot the system to recover this GPU
  Unable to determine the device handle for GPU0000:4F:00.0: Unknown Error         (no space)
  Unable to determine the device handle for GPU0: 0000:01:00.0: Unknown Error      (index, then bus id)
  Unable to determine the device handle for gpu 0000:23:00.0: Unknown Error        (lowercase, nvidia-smi -L)
  Unable to determine the device handle for GPU3: Unknown Error                    (index only)
  ... insufficiently powered. / This may be because ... / attached, or ...        (the reason over three lines)
  ... for gpu 0000:01:00.0: / GPU is lost. Reboot ...                              (the reason on the next line)
A row of --query-gpu output is a GPU only when it has the requested number of cells, a valid index and a valid PCI bus
id; anything else (a wrapper printing junk with exit 0, a row cut short) is an unparsable_output problem, never a GPU.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci

# The card or driver does not have the value: None, and nothing to report.
NOT_AVAILABLE = frozenset(
    [
        "",
        "n/a",
        "[n/a]",
        "[not supported]",
        "not supported",
        "[requested functionality has been deprecated]",
    ]
)
# The value exists but could not be read: None, and reported as unreadable_field (permissions, a sick GPU).
UNREADABLE = frozenset(["[insufficient permissions]", "[unknown error]", "[gpu requires reset]"])
LOST_VALUES = frozenset(["[gpu is lost]"])

# nvmlClocksEventReasons bits (nvml.h); the same names are used when decoding the -q per-reason "Active" lines.
THROTTLE_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
_Q_REASON_NAMES = {
    "idle": "gpu_idle",
    "gpu idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "display clock setting": "display_clock_setting",
}

# gpu_recovery_action (R550+; XID 154): the driver's spellings and NVML's numbers, to one snake_case name.
_RECOVERY_ACTIONS = {
    "none": "none",
    "0": "none",
    "reset": "gpu_reset",
    "gpu reset": "gpu_reset",
    "1": "gpu_reset",
    "reboot": "node_reboot",
    "node reboot": "node_reboot",
    "2": "node_reboot",
    "drain p2p": "drain_p2p",
    "3": "drain_p2p",
    "drain and reset": "drain_and_reset",
    "drain p2p and reset": "drain_and_reset",
    "4": "drain_and_reset",
}

# Value kinds of the query fields this collection reads; anything else stays a stripped string.
_INT = "int"
_FLOAT = "float"
_BOOL = "bool"
_BITMASK = "bitmask"
_PCI = "pci"
_LOWER = "lower"
_RECOVERY = "recovery"
FIELD_KINDS = {
    "index": _INT,
    "pci.bus_id": _PCI,
    "gpu_bus_id": _PCI,
    "temperature.gpu": _INT,
    "temperature.memory": _INT,
    "power.draw": _FLOAT,
    "power.draw.instant": _FLOAT,
    "power.draw.average": _FLOAT,
    "power.limit": _FLOAT,
    "memory.used": _INT,
    "memory.total": _INT,
    "utilization.gpu": _INT,
    "utilization.memory": _INT,
    "pcie.link.gen.current": _INT,
    "pcie.link.gen.gpucurrent": _INT,
    "pcie.link.gen.max": _INT,
    "pcie.link.gen.gpumax": _INT,
    "pcie.link.width.current": _INT,
    "pcie.link.width.max": _INT,
    "ecc.mode.current": _LOWER,
    "ecc.errors.corrected.volatile.total": _INT,
    "ecc.errors.uncorrected.volatile.total": _INT,
    "ecc.errors.corrected.aggregate.total": _INT,
    "ecc.errors.uncorrected.aggregate.total": _INT,
    "retired_pages.sbe": _INT,
    "retired_pages.dbe": _INT,
    "retired_pages.single_bit_ecc.count": _INT,
    "retired_pages.double_bit.count": _INT,
    "retired_pages.pending": _BOOL,
    "remapped_rows.correctable": _INT,
    "remapped_rows.uncorrectable": _INT,
    "remapped_rows.pending": _BOOL,
    "remapped_rows.failure": _BOOL,
    "clocks_event_reasons.active": _BITMASK,
    "clocks_throttle_reasons.active": _BITMASK,
    "persistence_mode": _BOOL,
    "gpu_recovery_action": _RECOVERY,
    "pid": _INT,
    "used_gpu_memory": _INT,
    "used_memory": _INT,
    "pci.baseclass": _BITMASK,  # "PCI Base Classcode, in hex" (0x3: display controller)
    "pci.subclass": _BITMASK,
    "ecc.errors.uncorrected.aggregate.sram.thresholdexceeded": _BOOL,
}
_FIELD_KINDS_LOWER = dict((name.lower(), kind) for name, kind in FIELD_KINDS.items())
# Free-text columns: the only ones that may contain ", " (the CSV is not quoted), so extra cells are merged back here.
FREE_TEXT_FIELDS = ("name", "process_name")

_TRUE = frozenset(["enabled", "yes", "true", "1", "active", "on"])
_FALSE = frozenset(["disabled", "no", "false", "0", "not active", "off"])
# The units nvidia-smi prints after a number (csv without nounits, -q): "45 %", "250.00 W", "16x", "0 KB/s".
NUMBER_UNITS = ("%", "W", "mW", "C", "V", "mV", "J", "mJ", "B", "KiB", "MiB", "GiB", "KB", "MB", "GB", "Hz", "MHz", "GHz",
                "s", "ms", "us", "ns", "x", "KB/s", "MB/s", "GB/s")
# A whole cell: digits with an optional fraction and one of those units. No sign, exponent, hex or trailing text:
# "-3", "1e309", "0x10" and "12abc" are not numbers nvidia-smi writes, and a prefix of them must never pass as a value
# (a negative error count would pass every limit).
_NUMBER_RE = re.compile(r"\A\s*([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*(?:%s)?\s*\Z"
                        % "|".join(re.escape(u) for u in sorted(NUMBER_UNITS, key=len, reverse=True)))
_UNIT_SUFFIX_RE = re.compile(r"\s*\[[^\]]*\]\s*$")  # "memory.used [MiB]" in a csv header

_REJECTED_FIELD_RE = re.compile(r'Field "([^"]*)" is not a valid field to query')
_BUS_ID = r"(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
# The bus id is tried before the index so that "GPU0000:4F:00.0" is a bus id, not GPU 0 (alternation order matters).
_DEVICE_HANDLE_RE = re.compile(
    r"Unable to (?:determine|detect) the device handle for GPU\s*"
    r"(?:(?P<pci>" + _BUS_ID + r")|(?P<index>\d+)(?:\s*:\s*(?P<pci2>" + _BUS_ID + r"))?)"
    r"\s*:?\s*(?P<reason>.*)$",
    re.I,
)
_PCI_IN_TEXT_RE = re.compile(r"\b((?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\b")
_TOOL_ERROR_PREFIXES = (
    "nvidia-smi has failed",
    "failed to initialize nvml",
    "no devices were found",
    "unable to determine",
    "unable to query",
    "driver/library version mismatch",
    "error:",
)

MAX_SAMPLES = 5


def _unparsed():
    return {"count": 0, "samples": []}


def _note_unparsed(unparsed, line):
    unparsed["count"] += 1
    if len(unparsed["samples"]) < MAX_SAMPLES:
        unparsed["samples"].append(line[:300])


def _problem(kind, message, line, pci=None, index=None, **extra):
    item = {"kind": kind, "message": message, "line": line[:500], "pci": pci, "index": index}
    item.update(extra)
    return item


MAX_UNPARSABLE = MAX_SAMPLES  # unparsable_output problems named one by one; the rest are counted in one more


def _unparsable(problems, tool, line, why):
    """An unparsable_output problem for one line, bounded so that a flood of junk stays a handful of problems."""
    named = [p for p in problems if p["kind"] == "unparsable_output" and not p.get("more")]
    if len(named) < MAX_UNPARSABLE:
        problems.append(_problem("unparsable_output", "%s printed a line that is not a GPU row (%s): %s"
                                 % (tool, why, line.strip()[:200]), line))
        return
    more = next((p for p in problems if p.get("more")), None)
    if more is None:
        more = _problem("unparsable_output", "", line, more=0)
        problems.append(more)
    more["more"] += 1
    more["message"] = "%s printed %d more line(s) that are not GPU rows" % (tool, more["more"])


def _lines(text):
    if text is None:
        return []
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        text = str(text)
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _number(text, kind):
    """The whole cell as a non-negative number (int kinds: integral), or None."""
    match = _NUMBER_RE.match(text)
    if not match:
        return None
    whole, _dot, fraction = match.group(1).partition(".")
    if kind == _INT:
        return int(whole) if fraction.strip("0") == "" else None
    return float(match.group(1))


def convert_value(raw, kind):
    """(value, status) for one cell: status is "ok", "na" (not supported), "unreadable" or "lost". Never raises."""
    text = (raw or "").strip()
    low = text.lower()
    if low in NOT_AVAILABLE:
        return None, "na"
    if low in LOST_VALUES:
        return None, "lost"
    if low in UNREADABLE or (low.startswith("[") and low.endswith("]")):
        return None, "unreadable"
    if kind in (_INT, _FLOAT):
        value = _number(text, kind)
        return (value, "ok") if value is not None else (None, "unreadable")
    if kind == _BOOL:
        if low in _TRUE:
            return True, "ok"
        if low in _FALSE:
            return False, "ok"
        return None, "unreadable"
    if kind == _BITMASK:
        try:
            return int(text, 16) if low.startswith("0x") else int(text), "ok"
        except ValueError:
            return None, "unreadable"
    if kind == _PCI:
        value = normalize_pci(text)
        return (value, "ok") if value else (None, "unreadable")
    if kind == _LOWER:
        return low, "ok"
    if kind == _RECOVERY:
        return normalize_recovery_action(text), "ok"
    return text, "ok"


def normalize_recovery_action(text):
    """"Drain and Reset" / "4" -> "drain_and_reset"; unknown spellings become snake_case, never dropped."""
    if text is None:
        return None
    low = " ".join(str(text).strip().lower().split())
    if low in NOT_AVAILABLE or (low.startswith("[") and low.endswith("]")):
        return None
    if low in _RECOVERY_ACTIONS:
        return _RECOVERY_ACTIONS[low]
    return re.sub(r"[^a-z0-9]+", "_", low).strip("_") or None


def decode_throttle_mask(mask):
    """Names of the active bits, in bit order; unknown bits as "bit_0x..." so a new reason is never lost."""
    if mask is None:
        return None
    names = []
    known = 0
    for bit, name in THROTTLE_BITS:
        known |= bit
        if mask & bit:
            names.append(name)
    rest = mask & ~known
    bit = 1
    while rest and bit <= rest:
        if rest & bit:
            names.append("bit_0x%x" % bit)
            rest &= ~bit
        bit <<= 1
    return names


def field_name_from_header(cell):
    """ "memory.used [MiB]" -> "memory.used"."""
    return _UNIT_SUFFIX_RE.sub("", cell).strip()


def classify_message(line):
    """A problem dict for an nvidia-smi error line, or None when the line is not one."""
    stripped = line.strip()
    if not stripped:
        return None
    match = _REJECTED_FIELD_RE.search(stripped)
    if match:
        return _problem("rejected_field", stripped, stripped, field=match.group(1))
    low = stripped.lower()
    match = _DEVICE_HANDLE_RE.search(stripped)
    if match:
        # Whatever the reason (GPU is lost, Unknown Error, Not Found, insufficiently powered), NVML has no handle:
        # nothing can be read from this GPU, so it is lost to the node; the reason says what to do about it.
        index = match.group("index")
        return _problem("lost", stripped, stripped, pci=normalize_pci(match.group("pci") or match.group("pci2")),
                        index=int(index) if index is not None else None, reason=match.group("reason").strip())
    if "gpu is lost" in low or "fallen off the bus" in low:
        found = _PCI_IN_TEXT_RE.search(stripped)
        return _problem("lost", stripped, stripped, pci=normalize_pci(found.group(1)) if found else None)
    if low.startswith(_TOOL_ERROR_PREFIXES) or "couldn't communicate with the nvidia driver" in low:
        return _problem("tool_error", stripped, stripped)
    return None


def _continuation_lines(problem):
    """How many following lines continue this message: nvidia-smi wraps two device-handle reasons over lines."""
    if problem.get("reason") is None:
        return 0
    if problem["reason"] == "":
        return 1  # "... for gpu 0000:01:00.0:" then "GPU is lost. Reboot the system to recover this GPU"
    if "insufficiently powered" in problem["reason"].lower():
        return 2  # "This may be because not all required external power cables are" / "attached, or ... properly."
    return 0


def _messages(lines):
    """(line, problem or None) for each line; lines that continue a wrapped message are folded into it."""
    last = None
    expect = 0
    for line in lines:
        item = classify_message(line)
        # The wrapped reason may itself read as a message ("GPU is lost. Reboot ..."): it still belongs to `last`.
        continues = item is None or (item["kind"] == "lost" and item["pci"] is None and "reason" not in item)
        if expect and continues and last is not None and line.strip():
            last["message"] = (last["message"] + " " + line.strip()).strip()
            last["reason"] = (last["reason"] + " " + line.strip()).strip()
            last["line"] = (last["line"] + "\n" + line.strip())[:500]
            expect -= 1
            continue
        last, expect = (item, _continuation_lines(item)) if item is not None else (None, 0)
        yield line, item


def parse_tool_messages(text):
    """Error lines in nvidia-smi output: {"problems": [...], "rejected_fields": [names]}. Never raises."""
    problems = []
    rejected = []
    for _line, item in _messages(_lines(text)):
        if item is None:
            continue
        if item["kind"] == "rejected_field":
            if item["field"] not in rejected:
                rejected.append(item["field"])
        else:
            problems.append(item)
    return {"problems": problems, "rejected_fields": rejected}


def _split_row(line, nfields, fields):
    """Cells of one CSV row, merging the extra cells of a free-text column back together; None if it cannot fit."""
    parts = line.split(",")
    if len(parts) == nfields:
        return [p.strip() for p in parts]
    if len(parts) < nfields:
        return None
    free = [i for i, name in enumerate(fields) if name in FREE_TEXT_FIELDS]
    if len(free) != 1:
        return None
    i = free[0]
    extra = len(parts) - nfields
    merged = ",".join(parts[i:i + extra + 1]).strip()
    return [p.strip() for p in parts[:i]] + [merged] + [p.strip() for p in parts[i + extra + 1:]]


# Field names as the header prints them: NVIDIA's own spelling, camelCase for some (pci.baseClass,
# encoder.stats.sessionCount, dramEncryption.mode.current, ecc.errors.uncorrected.aggregate.sram.thresholdExceeded).
_HEADER_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def _looks_like_header(cells, fields):
    names = [field_name_from_header(c) for c in cells]
    if fields is None:
        return all(_HEADER_NAME_RE.match(n or "-") for n in names) and names
    # No two fields differ only in case, so the header names the requested fields whatever the caller's spelling.
    return [n.lower() for n in names] == [f.lower() for f in fields]


def _parse_csv(text, fields):
    """Rows of an nvidia-smi csv: (fields, rows, problems, unparsed, header_seen), in the order printed.

    rows: [(line, cells, None)] or, for a line that is neither a message, the header nor a row with the requested
    cell count, [(line, None, why)]."""
    problems = []
    unparsed = _unparsed()
    rows = []
    header_seen = False
    row_seen = False  # the header comes before the first row; junk before it does not hide it
    fields = list(fields) if fields else None
    for line, message in _messages(_lines(text)):
        if not line.strip():
            continue
        if message is not None:
            problems.append(message)
            continue
        if not header_seen and not row_seen:
            cells = [c.strip() for c in line.split(",")]
            header = _looks_like_header(cells, fields)
            if header:
                fields = fields or [field_name_from_header(c) for c in cells]
                header_seen = True
                continue
        if fields is None:
            _note_unparsed(unparsed, line)
            rows.append((line, None, "no header line names the fields"))
            continue
        cells = _split_row(line, len(fields), fields)
        if cells is None:
            _note_unparsed(unparsed, line)
            rows.append((line, None, "expected %d comma-separated fields, got %d" % (len(fields), len(line.split(",")))))
            continue
        rows.append((line, cells, None))
        row_seen = True
    return fields or [], rows, problems, unparsed, header_seen


def parse_query_gpu(text, fields=None):
    """Parse --query-gpu csv output.

    fields: the names requested, in order (noheader output); None reads them from the csv header line.
    Returns {"fields", "gpus": [{"values": {field: value}, "status": {field: status}, "raw": line}],
    "problems", "rejected_fields", "unparsed"}. A row with a "[GPU is lost]" cell is a lost GPU, not a GPU.
    """
    try:
        return _parse_query_gpu(text, fields)
    except Exception as exc:  # a parser bug must never take the module down: report it instead
        return {"fields": list(fields or []), "gpus": [], "rejected_fields": [], "unparsed": _unparsed(),
                "problems": [_problem("parser_error", "query-gpu parser failed: %r" % (exc,), "")]}


def field_kind(name):
    """The value kind of a query field, whatever the spelling's case (None: a stripped string)."""
    return _FIELD_KINDS_LOWER.get((name or "").lower())


def _identity_columns(fields):
    """(position of index, position of the PCI bus id) in the requested fields; None where not requested."""
    lowered = [f.lower() for f in fields]
    index = lowered.index("index") if "index" in lowered else None
    pci = next((lowered.index(f) for f in ("pci.bus_id", "gpu_bus_id") if f in lowered), None)
    return index, pci


def _parse_query_gpu(text, fields):
    fields, rows, problems, unparsed, _header = _parse_csv(text, fields)
    rejected = [p["field"] for p in problems if p["kind"] == "rejected_field"]
    problems = [p for p in problems if p["kind"] != "rejected_field"]
    tool = "nvidia-smi --query-gpu"
    at_index, at_pci = _identity_columns(fields)
    complete = [line for line, cells, _why in rows if cells is not None]
    if complete and (at_index is None or at_pci is None):
        problems.append(_problem("unparsable_output", "%s was asked for %s without index and pci.bus_id: its %d row(s) "
                                 "cannot be tied to a GPU" % (tool, ",".join(fields), len(complete)), complete[0]))
        rows = [row for row in rows if row[1] is None]
    gpus = []
    for line, cells, why in rows:
        if cells is None:
            _unparsable(problems, tool, line, why)
            continue
        values = {}
        status = {}
        for i, name in enumerate(fields):
            values[name], status[name] = convert_value(cells[i], field_kind(name))
        index, pci = values[fields[at_index]], values[fields[at_pci]]
        if not isinstance(index, int) or index < 0:
            index = None
        if "lost" in status.values():
            problems.append(_problem("lost", "nvidia-smi reports the GPU as lost: " + line.strip(), line, pci=pci,
                                     index=index))
            continue
        if index is None:
            _unparsable(problems, tool, line, "no valid GPU index (%r)" % cells[at_index])
            _note_unparsed(unparsed, line)
            continue
        if pci is None:
            _unparsable(problems, tool, line, "no valid PCI bus id (%r)" % cells[at_pci])
            _note_unparsed(unparsed, line)
            continue
        for i, name in enumerate(fields):
            if status[name] == "unreadable":
                problems.append(_problem("unreadable_field", "%s: %s" % (name, cells[i]), line, pci=pci, index=index,
                                         field=name))
        gpus.append({"index": index, "pci": pci, "values": values, "status": status, "raw": line})
    return {"fields": fields, "gpus": gpus, "problems": problems, "rejected_fields": rejected, "unparsed": unparsed}


COMPUTE_APPS_FIELDS = ("gpu_bus_id", "gpu_uuid", "pid", "process_name", "used_gpu_memory")


def parse_compute_apps(text, fields=COMPUTE_APPS_FIELDS):
    """Parse --query-compute-apps csv (header optional; empty or header-only = idle).

    Returns {"processes": [{"pci", "gpu_uuid", "pid", "name", "used_memory_mib", "raw"}], "problems", "unparsed"}.
    """
    try:
        return _parse_compute_apps(text, fields)
    except Exception as exc:
        return {"processes": [], "unparsed": _unparsed(),
                "problems": [_problem("parser_error", "compute-apps parser failed: %r" % (exc,), "")]}


def _parse_compute_apps(text, fields):
    fields, rows, problems, unparsed, _header = _parse_csv(text, fields)
    processes = []
    for line, cells, _why in rows:
        if cells is None:
            continue
        if line.strip().lower().startswith("no running processes"):
            continue
        cell = dict((name, cells[i]) for i, name in enumerate(fields))
        pid, pid_status = convert_value(cell.get("pid"), _INT)
        if pid is None:
            _note_unparsed(unparsed, line)
            continue
        memory_raw = cell.get("used_gpu_memory", cell.get("used_memory"))
        memory, _status = convert_value(memory_raw, _INT)
        name = cell.get("process_name") or cell.get("name")
        processes.append({
            "pci": normalize_pci(cell.get("gpu_bus_id")),
            "gpu_uuid": cell.get("gpu_uuid") or None,
            "pid": pid,
            "name": None if (name or "").lower() in NOT_AVAILABLE else name,
            "used_memory_mib": memory,
            "raw": line,
        })
    return {"processes": processes, "problems": problems, "unparsed": unparsed}


def parse_help_query_gpu(text):
    """Field names accepted by this driver's --query-gpu: {"fields": sorted list, "unparsed"}.

    The help lists each property as a line of quoted names ("pci.bus_id" or "gpu_bus_id") followed by prose.
    """
    fields = set()
    for line in _lines(text):
        stripped = line.strip()
        if stripped.startswith('"'):
            fields.update(re.findall(r'"([A-Za-z0-9_.]+)"', stripped))
    return {"fields": sorted(fields), "unparsed": _unparsed()}


_Q_KV_RE = re.compile(r"^(\s*)(\S.*?)\s+:(?:\s(.*))?$")
_Q_SECTION_RE = re.compile(r"^(\s*)(\S.*?)\s*$")
_Q_GPU_RE = re.compile(r"^GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+(?:\.[0-7])?)\s*$")


def parse_q(text):
    """Parse `nvidia-smi -q`: {"driver_version", "cuda_version", "attached_gpus", "gpus": [...], "problems", "unparsed"}.

    Each GPU: {"pci", "entries": {"Section/Sub/Key": "value"} (first occurrence wins), plus the values the csv lacks:
    "pcie_replays", "throttle_reasons", "remapped_rows_*", "retired_pages_*", ...} (see q_gpu_values).
    """
    try:
        return _parse_q(text)
    except Exception as exc:
        return {"driver_version": None, "cuda_version": None, "attached_gpus": None, "gpus": [], "unparsed": _unparsed(),
                "problems": [_problem("parser_error", "-q parser failed: %r" % (exc,), "")]}


def _parse_q(text):
    result = {"driver_version": None, "cuda_version": None, "attached_gpus": None, "gpus": [], "problems": [],
              "unparsed": _unparsed()}
    top = {}
    current = None
    stack = []  # (indent, section name)
    for line, message in _messages(_lines(text)):
        if not line.strip() or line.strip().startswith("==="):
            continue
        if message is not None:
            result["problems"].append(message)
            continue
        gpu = _Q_GPU_RE.match(line)
        if gpu:
            current = {"pci": normalize_pci(gpu.group(1)), "entries": {}}
            result["gpus"].append(current)
            stack = []
            continue
        kv = _Q_KV_RE.match(line)
        section = None if kv else _Q_SECTION_RE.match(line)
        indent = len((kv or section).group(1).expandtabs(4)) if (kv or section) else 0
        if current is None or indent == 0:
            if kv:
                top.setdefault(kv.group(2).strip(), (kv.group(3) or "").strip())
            elif current is None:
                _note_unparsed(result["unparsed"], line)
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([name for _i, name in stack])
        if kv:
            key = kv.group(2).strip()
            value = (kv.group(3) or "").strip()
            full = path + "/" + key if path else key
            current["entries"].setdefault(full, value)
            # "Remapped Rows : N/A" has no children, but a key with a value can also open a section on some drivers.
            stack.append((indent, key))
        elif section:
            stack.append((indent, section.group(2).strip()))
    result["driver_version"] = top.get("Driver Version") or None
    result["cuda_version"] = top.get("CUDA Version") or None
    attached, _status = convert_value(top.get("Attached GPUs"), _INT)
    result["attached_gpus"] = attached
    for gpu in result["gpus"]:
        gpu.update(q_gpu_values(gpu["entries"]))
    return result


def _entry(entries, *paths):
    """First of paths present; case-insensitive because older drivers spell some keys differently ("Ecc Mode")."""
    for path in paths:
        if path.lower() in entries:
            return entries[path.lower()]
    return None


def _q_value(entries, kind, *paths):
    value, _status = convert_value(_entry(entries, *paths), kind)
    return value


def _q_throttle(entries):
    for section in ("clocks event reasons", "clocks throttle reasons"):
        prefix = section + "/"
        items = [(k[len(prefix):], v) for k, v in entries.items() if k.startswith(prefix)]
        if not items:
            continue
        names = []
        readable = False
        for key, value in items:
            state = value.strip().lower()
            if state not in ("active", "not active"):
                continue
            readable = True
            if state == "active":
                leaf = key.split("/")[-1].strip().lower()
                name = _Q_REASON_NAMES.get(leaf) or re.sub(r"[^a-z0-9]+", "_", leaf).strip("_")
                if name not in names:
                    names.append(name)
        return names if readable else None
    return None


def q_gpu_values(entries):
    """The per-GPU facts a -q block holds, under the gpu_facts key names (None where absent or N/A)."""
    lowered = {}
    for key, value in entries.items():
        lowered.setdefault(key.lower(), value)
    entries = lowered
    remapped_na = (_entry(entries, "Remapped Rows") or "").strip().lower() in NOT_AVAILABLE - {""}
    values = {
        "name": _q_value(entries, None, "Product Name"),
        "serial": _q_value(entries, None, "Serial Number"),
        "uuid": _q_value(entries, None, "GPU UUID"),
        "vbios": _q_value(entries, None, "VBIOS Version"),
        "persistence_mode": _q_value(entries, _BOOL, "Persistence Mode"),
        "recovery_action": normalize_recovery_action(_entry(entries, "GPU Recovery Action")),
        "pcie_replays": _q_value(entries, _INT, "PCI/Replays Since Reset"),
        "pcie_gen_current": _q_value(entries, _INT, "PCI/GPU Link Info/PCIe Generation/Current"),
        "pcie_gen_max": _q_value(entries, _INT, "PCI/GPU Link Info/PCIe Generation/Max"),
        "pcie_width_current": _q_value(entries, _INT, "PCI/GPU Link Info/Link Width/Current"),
        "pcie_width_max": _q_value(entries, _INT, "PCI/GPU Link Info/Link Width/Max"),
        "temperature_c": _q_value(entries, _INT, "Temperature/GPU Current Temp"),
        "power_w": _q_value(entries, _FLOAT, "GPU Power Readings/Power Draw", "Power Readings/Power Draw",
                            "GPU Power Readings/Instantaneous Power Draw", "GPU Power Readings/Average Power Draw"),
        "power_limit_w": _q_value(entries, _FLOAT, "GPU Power Readings/Current Power Limit",
                                  "GPU Power Readings/Power Limit", "Power Readings/Power Limit"),
        "memory_used_mib": _q_value(entries, _INT, "FB Memory Usage/Used"),
        "memory_total_mib": _q_value(entries, _INT, "FB Memory Usage/Total"),
        "ecc_mode": _q_value(entries, _LOWER, "ECC Mode/Current"),
        "retired_pages_sbe": _q_value(entries, _INT, "Retired Pages/Single Bit ECC"),
        "retired_pages_dbe": _q_value(entries, _INT, "Retired Pages/Double Bit ECC"),
        "retired_pages_pending": _q_value(entries, _BOOL, "Retired Pages/Pending Page Blacklist",
                                          "Retired Pages/Pending Page Retirement", "Retired Pages/Pending"),
        "remapped_rows_correctable": None if remapped_na else _q_value(entries, _INT, "Remapped Rows/Correctable Error"),
        "remapped_rows_uncorrectable": None if remapped_na else _q_value(entries, _INT, "Remapped Rows/Uncorrectable Error"),
        "remapped_rows_pending": None if remapped_na else _q_value(entries, _BOOL, "Remapped Rows/Pending"),
        "remapped_rows_failure": None if remapped_na else _q_value(entries, _BOOL, "Remapped Rows/Remapping Failure Occurred"),
        "throttle_reasons": _q_throttle(entries),
    }
    return values
