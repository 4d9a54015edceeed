# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parsers for `nvidia-smi nvlink` output and the -q "Fabric" section (stdlib only: runs on the node; none raises).

  parse_nvlink_status(text)   nvidia-smi nvlink -s / --status: each link's state and current speed
  parse_nvlink_errors(text)   nvidia-smi nvlink -e / --errorcounters: each link's error counters
  q_fabric(entries)           the "Fabric" section of one GPU of parse_q() (nvidia_smi.py reads -q once for all)

Both nvlink formats print one block per GPU under a header `GPU <index>: <name> (UUID: GPU-...)` (the UUID part is
absent on some products, e.g. `GPU 0: NVIDIA GB300`), then one tab-indented line per link:

  status   `\t Link 0: 26.562 GB/s`   `\t Link 3: <inactive>`   (a link that is down)
           `NVML: Unable to retrieve NVLink information as all links are inActive`   (every link of the GPU down)
           a header with nothing after it: the GPU has no NVLink (a PCIe card)
  errors   `\t Link 0: Replay Errors: 0` / `Recovery Errors` / `CRC Errors`, blank lines between links; GeForce and
           RTX cards split CRC into `CRC Flit Errors` and `CRC Data Errors`; any other `Link N: <name>: <value>`
           counter is kept under its own snake_case name, so a counter a newer driver adds is never dropped.
Lines naming a lost GPU (`Unable to determine the device handle ...`) become problems through the nvidia_smi message
classifier; anything else unreadable is counted in `unparsed`.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi import (
    NOT_AVAILABLE,
    classify_message,
    convert_value,
)

_GPU_RE = re.compile(r"^GPU\s+(\d+)\s*:\s*(.*?)\s*(?:\(UUID:\s*(GPU-[0-9A-Za-z-]+)\s*\))?\s*$")
_LINK_SPEED_RE = re.compile(r"^\s*Link\s+(\d+)\s*:\s*([0-9]+(?:\.[0-9]+)?)\s*GB/s\s*$", re.I)
_LINK_INACTIVE_RE = re.compile(r"^\s*Link\s+(\d+)\s*:\s*<\s*inactive\s*>\s*$", re.I)
_LINK_COUNTER_RE = re.compile(r"^\s*Link\s+(\d+)\s*:\s*([A-Za-z][A-Za-z0-9 ._-]*?)\s*:\s*(\S.*?)\s*$")
_ALL_INACTIVE_RE = re.compile(r"all links are in\s*active", re.I)
MAX_SAMPLES = 5

# The counters the judge adds up, by the names the parser gives them.
CRC_COUNTERS = ("crc_errors", "crc_flit_errors", "crc_data_errors")
REPLAY_COUNTERS = ("replay_errors",)
RECOVERY_COUNTERS = ("recovery_errors",)


def _unparsed():
    return {"count": 0, "samples": []}


def _note(unparsed, line):
    unparsed["count"] += 1
    if len(unparsed["samples"]) < MAX_SAMPLES:
        unparsed["samples"].append(line.strip()[:300])


def _lines(text):
    if text is None:
        return []
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return str(text).replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _header(line):
    match = _GPU_RE.match(line.strip())
    if not match:
        return None
    return {"index": int(match.group(1)), "name": match.group(2) or None, "uuid": match.group(3)}


def _counter_name(text):
    return re.sub(r"[^a-z0-9]+", "_", text.strip().lower()).strip("_")


def _counter_value(text):
    """A counter read whole (nvidia_smi.convert_value): "-1", "1e3" or "12abc" are unreadable, never a count."""
    value, status = convert_value(text, "int")
    return value, ("unreadable" if status == "lost" else status)


def _guard(fn, text, empty):
    try:
        return fn(text)
    except Exception as exc:  # a parser bug never takes the module down: it is reported instead
        out = empty()
        out["problems"].append({"kind": "parser_error", "message": "%s failed: %r" % (fn.__name__, exc), "line": "",
                                "pci": None, "index": None})
        return out


def _empty():
    return {"gpus": [], "problems": [], "unparsed": _unparsed()}


def parse_nvlink_status(text):
    """{"gpus": [{index, name, uuid, links: [{link, up, speed_gbps, line}], all_inactive, lines}], "problems",
    "unparsed"}. A GPU with no link lines and no all-inactive message has no NVLink (links == [])."""
    return _guard(_parse_status, text, _empty)


def _parse_status(text):
    out = _empty()
    current = None
    for line in _lines(text):
        if not line.strip():
            continue
        head = _header(line)
        if head is not None:
            current = dict(head, links=[], all_inactive=False, lines=[line.strip()])
            out["gpus"].append(current)
            continue
        message = classify_message(line)
        if _ALL_INACTIVE_RE.search(line) and current is not None:
            current["all_inactive"] = True
            current["lines"].append(line.strip())
            continue
        if message is not None:
            out["problems"].append(message)
            continue
        speed = _LINK_SPEED_RE.match(line)
        inactive = None if speed else _LINK_INACTIVE_RE.match(line)
        if current is None or not (speed or inactive):
            _note(out["unparsed"], line)
            continue
        link = int((speed or inactive).group(1))
        current["links"].append({"link": link, "up": bool(speed),
                                 "speed_gbps": float(speed.group(2)) if speed else None, "line": line.strip()})
        current["lines"].append(line.strip())
    return out


def parse_nvlink_errors(text):
    """{"gpus": [{index, name, uuid, links: {link: {counter: value}}, lines}], "problems", "unparsed"}; a value the
    driver prints as N/A is None, an unreadable one is None and a problem (kind unreadable_field)."""
    return _guard(_parse_errors, text, _empty)


def _parse_errors(text):
    out = _empty()
    current = None
    for line in _lines(text):
        if not line.strip():
            continue
        head = _header(line)
        if head is not None:
            current = dict(head, links={}, lines=[])
            out["gpus"].append(current)
            continue
        message = classify_message(line)
        if message is not None:
            out["problems"].append(message)
            continue
        match = _LINK_COUNTER_RE.match(line)
        if current is None or not match:
            _note(out["unparsed"], line)
            continue
        link, name = int(match.group(1)), _counter_name(match.group(2))
        value, status = _counter_value(match.group(3))
        if status == "unreadable":
            out["problems"].append({"kind": "unreadable_field", "message": "GPU %s link %s %s: %s" % (
                current["index"], link, name, match.group(3)), "line": line.strip(), "pci": None,
                "index": current["index"]})
        current["links"].setdefault(link, {})[name] = value
        current["lines"].append(line.strip())
    return out


def link_totals(counters):
    """{crc, replay, recovery} of one link's counters (None where the driver reports none of that kind)."""
    def total(names):
        values = [counters.get(n) for n in names if counters.get(n) is not None]
        return sum(values) if values else None
    return {"crc": total(CRC_COUNTERS), "replay": total(REPLAY_COUNTERS), "recovery": total(RECOVERY_COUNTERS)}


# -q "Fabric" section: State is the GPU's registration with the NVLink fabric; Status must be read only when State is
# Completed (NVML's nvmlGpuFabricInfo_t). N/A on GPUs that are not part of an NVSwitch fabric. Health (NVML's
# healthSummary and healthMask, nvmlGpuFabricInfo_v3_t): Summary Healthy / Unhealthy / Limited Capacity, Bandwidth
# Full / Degraded, then one row per condition (route recovery in progress, route unhealthy, access timeout recovery:
# True / False; incorrect configuration: None or the configuration fault). Older drivers print Bandwidth alone, or
# Summary and Bandwidth; a row a driver does not print is None.
_FABRIC_KEYS = (
    ("state", "fabric/state"),
    ("status", "fabric/status"),
    ("clique_id", "fabric/cliqueid"),
    ("cluster_uuid", "fabric/clusteruuid"),
    ("health_summary", "fabric/health/summary"),
    ("health_bandwidth", "fabric/health/bandwidth"),
    ("health_route_recovery", "fabric/health/route recovery in progress"),
    ("health_route_unhealthy", "fabric/health/route unhealthy"),
    ("health_access_timeout_recovery", "fabric/health/access timeout recovery"),
    ("health_incorrect_configuration", "fabric/health/incorrect configuration"),
    ("health_partition_assigned", "fabric/health/partition assigned"),
)
# The health rows nvlink_facts returns (as fabric_<name>) and judge_nvlink reads.
FABRIC_HEALTH = ("health_summary", "health_bandwidth", "health_route_recovery", "health_route_unhealthy",
                 "health_access_timeout_recovery", "health_incorrect_configuration")


def fabric_state_name(text):
    """"Completed" -> "completed", "In Progress" -> "in_progress", "Not Supported"/N/A -> None."""
    if text is None:
        return None
    low = " ".join(str(text).strip().lower().split())
    if low in NOT_AVAILABLE or low.startswith("["):
        return None
    return re.sub(r"[^a-z0-9]+", "_", low).strip("_") or None


def q_fabric(entries):
    """{state, status, clique_id, cluster_uuid, health_<row> (see _FABRIC_KEYS), raw} from one GPU's parse_q
    entries; state is snake_case (completed, in_progress, not_started) or None when the GPU reports none."""
    lowered = {}
    for key, value in (entries or {}).items():
        lowered.setdefault(str(key).lower(), value)
    out = {"raw": {}}
    for name, path in _FABRIC_KEYS:
        value = lowered.get(path)
        if value is not None:
            out["raw"][name] = value
        text = None if value is None or value.strip().lower() in NOT_AVAILABLE else value.strip()
        out[name] = text
    out["state"] = fabric_state_name(out["state"])
    return out
