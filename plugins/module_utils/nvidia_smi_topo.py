# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parser for `nvidia-smi topo -m` (the GPU/NIC connection matrix); stdlib only, never raises.

The format (nvidia-smi's own output, also when piped):
  - the header row starts with a tab and names the columns: GPU0..GPUn, NIC0..NICn (older drivers: mlx5_0 ...),
    then CPU Affinity, NUMA Affinity and (newer drivers) GPU NUMA ID; the header is wrapped in ANSI underline codes
    (ESC[4m ... ESC[0m) even when the output is not a terminal;
  - one tab-separated row per device, cells padded with spaces (` X `, `NV18`, `SYS `); a GPU row has the affinity
    columns after the device cells, with an empty cell before GPU NUMA ID; NIC rows end in empty cells;
  - then `Legend:` (X, SYS, NODE, PHB, PXB, PIX, NV#) and, with NICs, `NIC Legend:` lines `NIC0: mlx5_0`.
A cell is X (self), NV<n> (n bonded NVLinks), or a PCIe path: PIX, PXB, PHB, NODE, SYS (SOC on old drivers). Only the
device columns are read by position; the affinity cells are read around the empty one.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEVICE_RE = re.compile(r"^(?:GPU\d+|NIC\d+|mlx\d+_\d+|[a-z]+\d*_\d+)$")
_GPU_RE = re.compile(r"^GPU(\d+)$")
_NV_RE = re.compile(r"^NV(\d+)$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
PCIE_CODES = ("PIX", "PXB", "PHB", "NODE", "SYS", "SOC")
MAX_SAMPLES = 5


def strip_ansi(text):
    return _ANSI_RE.sub("", text)


def cell_kind(code):
    """("self"|"nvlink"|"pcie"|"unknown", number of NVLinks or None) of one matrix cell."""
    code = (code or "").strip()
    if code == "X":
        return "self", None
    match = _NV_RE.match(code)
    if match:
        return "nvlink", int(match.group(1))
    if code in PCIE_CODES:
        return "pcie", None
    return "unknown", None


def _cells(line, tabbed):
    if tabbed:
        return [c.strip() for c in line.split("\t")]
    return line.split()


def parse_topo_matrix(text):
    """{"devices": [column names], "gpus": [indices], "matrix": {row: {column: code}}, "pairs": [{a, b, code, kind,
    nvlinks}] (GPU pairs, a < b), "affinity": {gpu index: {cpu, numa, gpu_numa_id}}, "nics": {NIC0: mlx5_0},
    "interconnect": "nvlink"|"pcie"|"mixed"|None, "problems", "unparsed"}."""
    try:
        return _parse(text)
    except Exception as exc:  # a parser bug is reported, never raised
        out = _empty()
        out["problems"].append({"kind": "parser_error", "message": "topo parser failed: %r" % (exc,), "line": ""})
        return out


def _empty():
    return {"devices": [], "gpus": [], "matrix": {}, "pairs": [], "affinity": {}, "nics": {}, "interconnect": None,
            "problems": [], "unparsed": {"count": 0, "samples": []}}


def _note(out, line):
    out["unparsed"]["count"] += 1
    if len(out["unparsed"]["samples"]) < MAX_SAMPLES:
        out["unparsed"]["samples"].append(line.strip()[:300])


def _parse(text):
    out = _empty()
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = strip_ansi(str(text or "")).replace("\r\n", "\n").split("\n")
    tabbed = False
    legend = False
    for line in lines:
        if not line.strip():
            continue
        stripped = line.strip()
        if stripped.endswith("Legend:"):
            legend = True
            continue
        if legend:
            nic = _NIC_LEGEND_RE.match(line)
            if nic:
                out["nics"][nic.group(1)] = nic.group(2)
            continue  # "X    = Self", "NV#  = ..." explain the codes
        if not out["devices"]:
            tabbed = "\t" in line
            names = _cells(line, tabbed)
            names = [n for n in names if n]
            devices = []
            for name in names:
                if not _DEVICE_RE.match(name):
                    break
                devices.append(name)
            if devices and _GPU_RE.match(devices[0]):
                out["devices"] = devices
                continue
            _note(out, line)
            continue
        cells = _cells(line, tabbed)
        if not cells or cells[0] not in out["devices"]:
            _note(out, line)
            continue
        row, values = cells[0], cells[1:1 + len(out["devices"])]
        if len(values) < len(out["devices"]):
            out["problems"].append({"kind": "unparsable_output", "message": "topo -m row %s has %d cells for %d "
                                    "devices" % (row, len(values), len(out["devices"])), "line": line.strip()[:300]})
            continue
        out["matrix"][row] = dict((name, values[i]) for i, name in enumerate(out["devices"]))
        gpu = _GPU_RE.match(row)
        if gpu:
            rest = [c for c in cells[1 + len(out["devices"]):] if c]
            out["affinity"][int(gpu.group(1))] = {
                "cpu": rest[0] if len(rest) > 0 else None,
                "numa": rest[1] if len(rest) > 1 else None,
                "gpu_numa_id": rest[2] if len(rest) > 2 else None,
            }
    gpus = sorted(int(_GPU_RE.match(d).group(1)) for d in out["devices"] if _GPU_RE.match(d))
    out["gpus"] = gpus
    kinds = set()
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            code = (out["matrix"].get("GPU%d" % a) or {}).get("GPU%d" % b)
            if code is None:
                continue
            kind, nvlinks = cell_kind(code)
            kinds.add(kind)
            out["pairs"].append({"a": a, "b": b, "code": code, "kind": kind, "nvlinks": nvlinks})
            if kind == "unknown":
                out["problems"].append({"kind": "unknown_code", "message": "topo -m: GPU%d-GPU%d is %r, not a code "
                                        "of the legend" % (a, b, code), "line": code})
    if out["devices"] and not out["matrix"]:
        out["problems"].append({"kind": "unparsable_output", "message": "topo -m printed a header but no rows",
                                "line": ""})
    if "nvlink" in kinds and "pcie" in kinds:
        out["interconnect"] = "mixed"
    elif "nvlink" in kinds:
        out["interconnect"] = "nvlink"
    elif "pcie" in kinds:
        out["interconnect"] = "pcie"
    return out
