# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The judgement layer (controller side): per-host results -> verdict per node and per GPU, evidence and the action.

Pure Python, no Ansible imports: the action plugin hands in plain dicts (one host's variables), so every rule is
table-testable. All thresholds live in DEFAULTS, each overridable per host/group from inventory variables of the same
name and type-checked (docs/rules.md lists them). Inputs are read defensively: a missing key, a module that returned
`error`, a task that failed or was skipped never raises here and never reads as a pass.

Verdict order for nodes and GPUs: pass < warn < error < fail, and `unreachable` for a node that dropped out. A proven
failure outranks "could not run": it carries evidence and a concrete action, while error only says "unknown".
"""

from __future__ import annotations

import math
import re
from datetime import datetime

SEVERITY_ORDER = ("pass", "warn", "error", "fail", "unreachable")
_RANK = {v: i for i, v in enumerate(SEVERITY_ORDER)}

# Checks the playbooks register as gpufleet_result_<name>; others are judged generically.
KNOWN_CHECKS = ("gpu_burn", "dcgm_diag", "nccl_test", "train_dryrun", "checkpoint_storage", "samples", "env")
# Results that only carry facts already read elsewhere (xid_facts before the burn): not a check of their own.
_FACT_ONLY_RESULTS = ("xid_before",)

# NCCL all_reduce busbw references for one 8-GPU node, GB/s (signals.md section 4 and the field guide). Matched as a
# case-insensitive substring of the GPU name, longest key first. PCIe consumer cards are platform dependent: low.
NCCL_REFERENCE_BUSBW_GBPS = {
    "H200": 480.0,
    "H100": 370.0,
    "A100": 230.0,
    "L40S": 40.0,
    "RTX 5090": 50.0,
    "RTX 4090": 25.0,
}

# name -> (default, kind, description). kind drives validation: number, int, fraction, list_int, list_str, rails,
# gbps_map, choice:<a|b>, bool.
THRESHOLDS = {
    "gpufleet_psu_rails": ({}, "rails", "PSU rail -> GPU indices it feeds, e.g. {A: [0,1,2,3], B: [4,5,6,7]}"),
    "gpufleet_psu_loss_window_s": (5.0, "number", "GPUs of one rail lost within this many seconds = that PSU"),
    "gpufleet_lost_xids": ([79], "list_int", "XIDs meaning the GPU fell off the bus"),
    "gpufleet_rma_xids": ([48, 63, 64], "list_int", "XIDs that mean replace the card (RMA)"),
    "gpufleet_ecc_leak_xids": ([92], "list_int", "XIDs of a slow single-bit ECC leak (warn)"),
    "gpufleet_retired_pages_rma": (58, "int", "retired pages (SBE+DBE) at which the card is near the 64-page limit"),
    "gpufleet_remapped_rows_rma": (460, "int", "uncorrectable remapped rows near the 512-remap limit"),
    "gpufleet_ecc_corrected_rise": (1, "int", "rise of volatile corrected ECC during the run that warns"),
    "gpufleet_temp_max_c": (85.0, "number", "GPU temperature limit, C"),
    "gpufleet_temp_sustained_s": (300.0, "number", "seconds above the limit that fail (field guide: 5 minutes)"),
    "gpufleet_load_util_min_pct": (50.0, "number", "utilisation from which a sample counts as under load"),
    "gpufleet_nccl_min_busbw_gbps": (None, "number", "NCCL busbw floor for this host/group, GB/s (overrides the model default)"),
    "gpufleet_nccl_min_busbw_fraction": (0.7, "fraction", "share of the model's reference busbw required"),
    "gpufleet_nccl_reference_busbw_gbps": ({}, "gbps_map", "extra/overriding references: GPU name substring -> GB/s"),
    "gpufleet_busy_gpu_severity": ("warn", "choice:warn|fail", "severity of a GPU running someone else's process"),
    "gpufleet_busy_ignore_processes": ([], "list_str", "process names that do not make a GPU busy"),
    "gpufleet_expected_gpus": (None, "int", "GPUs the node must show; fewer = a GPU is missing"),
}
DEFAULTS = {name: spec[0] for name, spec in THRESHOLDS.items()}

_TYPE_WORDS = {
    "number": "a number (e.g. 85)",
    "int": "an integer (e.g. 8)",
    "fraction": "a number between 0 and 1 (e.g. 0.7)",
    "list_int": "a list of integers (e.g. [48, 63, 64])",
    "list_str": "a list of strings",
    "rails": "a mapping of rail name to a list of GPU indices (e.g. {A: [0, 1, 2, 3], B: [4, 5, 6, 7]})",
    "gbps_map": "a mapping of GPU name to GB/s (e.g. {'RTX 5090': 50})",
    "bool": "true or false",
}

MAX_EVIDENCE = 20
MAX_SERIES_POINTS = 240
MAX_TIMELINE = 300
_THERMAL_WORDS = ("thermal",)


# --------------------------------------------------------------------------------------------------------------------
# small readers


def worst(verdicts, default="pass"):
    best = default
    for verdict in verdicts:
        if _RANK.get(verdict, _RANK["error"]) > _RANK.get(best, 0):
            best = verdict if verdict in _RANK else "error"
    return best


def rank(verdict):
    return _RANK.get(verdict, _RANK["error"])


def _first(mapping, *keys, default=None):
    if not isinstance(mapping, dict):
        return default
    for key in keys:
        value = mapping.get(key)
        if value is not None:
            return value
    return default


def _num(value):
    """A number from module data (ints, floats, numeric strings); None for anything else, bools included."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.strip().rstrip("%").strip()
        try:
            number = float(text)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _int(value):
    number = _num(value)
    return int(number) if number is not None else None


def _truthy(value):
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "true", "1", "y", "on", "enabled", "pending")
    return bool(value)


def _as_list(value):
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _strs(value, limit=MAX_EVIDENCE):
    out = []
    for item in _as_list(value):
        if item is None:
            continue
        text = item if isinstance(item, str) else str(item)
        text = text.rstrip("\r\n")[:400]
        if text and text not in out:
            out.append(text)
        if len(out) >= limit:
            break
    return out


def _norm_pci(value):
    """Lowercase dddd:bb:dd from any spelling (pci.py is node-side; this mirrors it for the controller)."""
    if value is None:
        return None
    match = re.match(r"^(?:PCI:)?\s*(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?$",
                     str(value).strip())
    if not match:
        return None
    domain = int(match.group(1) or "0", 16)
    if domain > 0xFFFF:
        return None
    return "%04x:%02x:%02x" % (domain, int(match.group(2), 16), int(match.group(3), 16))


def _time_s(value):
    """Seconds (epoch, or since boot) from a number or an ISO time; None when unknown."""
    number = _num(value)
    if number is not None:
        return number / 1e6 if number > 1e14 else number  # journald microseconds
    if isinstance(value, str):
        text = value.strip().replace(",", ".")
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError:
            return None
    return None


def _event_time(event):
    for key in ("time_s", "timestamp_s", "time", "timestamp", "realtime", "monotonic_s", "uptime_s", "ts"):
        if key in event:
            seconds = _time_s(event.get(key))
            if seconds is not None:
                return seconds
    return None


# --------------------------------------------------------------------------------------------------------------------
# thresholds


def resolve_thresholds(host, hostvars):
    """(thresholds, errors): inventory overrides checked against THRESHOLDS; a bad value keeps the default.

    Each error names the host, the variable, the expected type and what was found.
    """
    values = dict(DEFAULTS)
    sources = {name: "default" for name in DEFAULTS}
    errors = []
    for name, (_default, kind, _desc) in THRESHOLDS.items():
        if name not in hostvars or hostvars.get(name) is None:
            continue
        raw = hostvars[name]
        ok, value = _check_kind(kind, raw)
        if ok:
            values[name] = value
            sources[name] = "inventory %s" % name
        else:
            expected = _TYPE_WORDS.get(kind) or "one of " + ", ".join(kind.split(":", 1)[1].split("|"))
            errors.append("host %s: inventory variable %s must be %s, got %s %r; fix it in host_vars/group_vars "
                          "(defaults: docs/rules.md)" % (host, name, expected, type(raw).__name__, raw))
    values["_sources"] = sources
    return values, errors


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_kind(kind, raw):
    if kind == "number":
        return (_is_number(raw) and raw >= 0), (float(raw) if _is_number(raw) else None)
    if kind == "int":
        ok = (isinstance(raw, int) and not isinstance(raw, bool)) or (_is_number(raw) and float(raw).is_integer())
        return (ok and raw >= 0), (int(raw) if ok else None)
    if kind == "fraction":
        return (_is_number(raw) and 0 < raw <= 1), (float(raw) if _is_number(raw) else None)
    if kind == "bool":
        return isinstance(raw, bool), raw
    if kind == "list_int":
        ok = isinstance(raw, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in raw)
        return ok, (list(raw) if ok else None)
    if kind == "list_str":
        ok = isinstance(raw, (list, tuple)) and all(isinstance(x, str) for x in raw)
        return ok, (list(raw) if ok else None)
    if kind == "rails":
        ok = isinstance(raw, dict) and all(
            isinstance(v, (list, tuple)) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            for v in raw.values())
        return ok, ({str(k): list(v) for k, v in raw.items()} if ok else None)
    if kind == "gbps_map":
        ok = isinstance(raw, dict) and all(_is_number(v) and v > 0 for v in raw.values())
        return ok, ({str(k): float(v) for k, v in raw.items()} if ok else None)
    if kind.startswith("choice:"):
        choices = kind.split(":", 1)[1].split("|")
        return raw in choices, raw
    return False, None


def nccl_threshold(gpu_names, thresholds):
    """(min_busbw_gbps or None, where it came from): inventory floor, else reference x fraction for the GPU model."""
    sources = thresholds.get("_sources", {})
    explicit = thresholds.get("gpufleet_nccl_min_busbw_gbps")
    if explicit is not None:
        return float(explicit), sources.get("gpufleet_nccl_min_busbw_gbps", "inventory gpufleet_nccl_min_busbw_gbps")
    table = dict(NCCL_REFERENCE_BUSBW_GBPS)
    overrides = thresholds.get("gpufleet_nccl_reference_busbw_gbps") or {}
    table.update(overrides)
    fraction = thresholds.get("gpufleet_nccl_min_busbw_fraction") or DEFAULTS["gpufleet_nccl_min_busbw_fraction"]
    fraction_src = "inventory" if sources.get("gpufleet_nccl_min_busbw_fraction", "default") != "default" else "default"
    names = [n for n in gpu_names if n]
    for key in sorted(table, key=len, reverse=True):
        if any(key.lower() in name.lower() for name in names):
            ref = table[key]
            where = "inventory gpufleet_nccl_reference_busbw_gbps" if key in overrides else "built-in"
            return (round(ref * fraction, 2),
                    "%s reference for %s (%g GB/s) x %s fraction %g" % (where, key, ref, fraction_src, fraction))
    model = names[0] if names else "unknown GPU"
    return None, "no baseline for %s: set gpufleet_nccl_min_busbw_gbps for this group" % model


# --------------------------------------------------------------------------------------------------------------------
# result reading


def _facts(hv, name):
    """A fact module's key, whether injected as a variable or kept under ansible_facts (INJECT_FACT_VARS=false)."""
    value = hv.get(name)
    if value is None and isinstance(hv.get("ansible_facts"), dict):
        value = hv["ansible_facts"].get(name)
    return value


def result_state(res):
    """(state, reason) of a registered result: ok | skipped | failed | unreachable | error | missing."""
    if res is None:
        return "missing", "no result"
    if not isinstance(res, dict):
        return "error", "result is not a mapping: %r" % (res,)
    if res.get("unreachable"):
        return "unreachable", str(res.get("msg") or "host unreachable")
    if res.get("failed") and res.get("verdict") in (None, "error"):
        return "failed", str(res.get("msg") or "; ".join(_strs(res.get("reasons"))) or "task failed")
    if res.get("skipped") and "verdict" not in res:
        return "skipped", str(res.get("skip_reason") or res.get("msg") or "skipped")
    if res.get("verdict") == "error":
        reason = "; ".join(_strs(res.get("reasons"))) or _first(res.get("tool") or {}, "error") or "could not run"
        return "error", str(reason)
    if res.get("verdict") == "skipped":
        return "skipped", "; ".join(_strs(res.get("reasons"))) or "skipped by the module"
    return "ok", ""


def _figures(res):
    figures = {}
    if not isinstance(res, dict):
        return figures
    for key, value in res.items():
        if key in ("changed", "rc", "failed", "attempts", "finished", "started"):
            continue
        if _is_number(value) or (isinstance(value, str) and key.endswith(("_gbps", "_s", "_c", "_w"))
                                  and _num(value) is not None):
            figures[key] = _num(value)
    return figures


# --------------------------------------------------------------------------------------------------------------------
# the node


class _Node:
    def __init__(self, host, hv, thresholds):
        self.host = host
        self.hv = hv
        self.t = thresholds
        self.findings = []
        self.checks = {}
        self.gpus = {}  # index -> gpu dict
        self.pci_index = {}
        self.series = {}
        self.timeline = []

    # GPUs -------------------------------------------------------------------------------------------------------
    def gpu(self, index=None, pci=None):
        pci = _norm_pci(pci)
        if index is None and pci is not None:
            index = self.pci_index.get(pci)
        if index is None:
            return None
        gpu = self.gpus.get(index)
        if gpu is None:
            gpu = {"index": index, "pci": pci, "serial": None, "name": None, "uuid": None, "metrics": {}}
            self.gpus[index] = gpu
        if pci and not gpu.get("pci"):
            gpu["pci"] = pci
        if gpu.get("pci"):
            self.pci_index.setdefault(gpu["pci"], index)
        return gpu

    def label(self, index=None, pci=None):
        pci = _norm_pci(pci)
        if index is None and pci:
            index = self.pci_index.get(pci)
        if index is None:
            return "%s GPU at PCI %s" % (self.host, pci or "?")
        gpu = self.gpus.get(index) or {}
        where = gpu.get("pci") or pci
        return "%s GPU %s%s" % (self.host, index, " (%s)" % where if where else "")

    def metric(self, index, key, value):
        gpu = self.gpu(index)
        if gpu is not None and value is not None:
            gpu["metrics"][key] = value

    def add(self, severity, code, message, action, evidence=None, gpu=None, pci=None, check=None):
        pci = _norm_pci(pci)
        if gpu is None and pci:
            gpu = self.pci_index.get(pci)
        if gpu is not None and pci is None:
            pci = (self.gpus.get(gpu) or {}).get("pci")
        finding = {"severity": severity, "code": code, "gpu": gpu, "pci": pci, "check": check,
                   "message": message, "action": action, "evidence": _strs(evidence)}
        self.findings.append(finding)
        if gpu is not None:
            self.gpu(gpu, pci)
        return finding

    def set_check(self, name, verdict, reasons=None, figures=None):
        self.checks[name] = {"verdict": verdict, "reasons": _strs(reasons), "figures": dict(figures or {})}


def _read_gpus(node):
    for item in _as_list(_facts(node.hv, "gpufleet_gpus")):
        if not isinstance(item, dict):
            continue
        index = _int(item.get("index"))
        if index is None:
            continue
        gpu = node.gpu(index, item.get("pci"))
        for key in ("serial", "name", "uuid"):
            if item.get(key) is not None:
                gpu[key] = str(item[key])
        for key in ("temperature_c", "power_w", "pcie_gen_current", "pcie_gen_max", "pcie_width_current",
                    "pcie_width_max", "ecc_volatile_corrected", "ecc_volatile_uncorrected", "retired_pages_sbe",
                    "retired_pages_dbe", "remapped_rows_correctable", "remapped_rows_uncorrectable",
                    "memory_total_mib"):
            if _num(item.get(key)) is not None:
                gpu["metrics"].setdefault(key, _num(item.get(key)))


def _results(node):
    """gpufleet_result_<name> -> result dict, from variables and from the collected fact names."""
    out = {}
    for key, value in node.hv.items():
        if isinstance(key, str) and key.startswith("gpufleet_result_"):
            out[key[len("gpufleet_result_"):]] = value
    return out


# --------------------------------------------------------------------------------------------------------------------
# rules: XID and lost GPUs


def _xid_events(node, results):
    events, seen = [], set()
    sources = [_facts(node.hv, "gpufleet_xid")]
    before = results.get("xid_before")
    if isinstance(before, dict):
        sources.insert(0, _first(before.get("ansible_facts") or {}, "gpufleet_xid") or before.get("gpufleet_xid"))
    lost = []
    for xid in sources:
        if not isinstance(xid, dict):
            continue
        for event in _as_list(xid.get("events")):
            if not isinstance(event, dict):
                continue
            key = (event.get("line") or event.get("raw") or event.get("message"), event.get("xid"),
                   str(event.get("pci")), str(_event_time(event)))
            if key in seen:
                continue
            seen.add(key)
            events.append(event)
        lost.extend(_as_list(xid.get("lost_gpus")))
    return events, lost


_BUCKET_WORDS = {
    "RESTART_APP": "restart the application; the GPU is fine unless it repeats",
    "RESET_GPU": "reset the GPU (nvidia-smi -r, or reboot) and rerun the checks",
    "RESTART_BM": "power-cycle the node (the GPU is gone from PCIe until then) and rerun the checks",
    "RESTART_VM": "restart the VM and rerun the checks",
    "CHECK_MECHANICALS": "check the GPU power cables and riser seating",
    "CONTACT_SUPPORT": "contact NVIDIA support with the kernel log",
    "UPDATE_SWFW": "update the driver/firmware",
    "WORKFLOW_XID_48": "reset the GPU, then check the SRAM threshold; RMA the card if it is exceeded",
    "WORKFLOW_NVLINK_ERR": "reset the GPU and check the NVLink/NVSwitch fabric",
}


def _catalog_action(event):
    action = _first(event, "action", "immediate_action", "resolution")
    if isinstance(action, dict):
        action = _first(action, "immediate", "investigatory")
    if not action:
        return "look the code up in NVIDIA's XID catalog"
    return _BUCKET_WORDS.get(str(action), str(action))


def _event_line(event):
    return str(_first(event, "line", "raw", "message", "text", default="XID %s at %s" % (event.get("xid"),
                                                                                          event.get("pci"))))


def _infer_lost_indices(node, lost):
    """A lost GPU is missing from gpufleet_gpus (contracts): nvidia-smi numbers GPUs in PCI bus order, so when every
    known GPU's index equals its position among known+lost addresses, the lost ones get their position as index."""
    missing = [e for e in lost.values() if e["index"] is None and e["pci"]]
    if not missing:
        return
    known = {g["pci"]: i for i, g in node.gpus.items() if g.get("pci")}
    order = sorted(set(known) | {e["pci"] for e in missing})
    if any(order.index(pci) != index for pci, index in known.items()):
        return
    for e in missing:
        e["index"] = order.index(e["pci"])
        e["why"] += ", index %d inferred from PCI bus order" % e["index"]
        node.gpu(e["index"], e["pci"])


def rule_xid_and_lost(node, results):
    t = node.t
    events, lost_entries = _xid_events(node, results)
    lost = {}  # key (index or pci) -> {"index", "pci", "time", "evidence"}

    def mark_lost(index, pci, when, line, why):
        pci = _norm_pci(pci)
        if index is None and pci:
            index = node.pci_index.get(pci)
        key = index if index is not None else pci
        if key is None:
            key = "?%d" % len(lost)
        entry = lost.setdefault(key, {"index": index, "pci": pci, "time": when, "evidence": [], "why": why})
        if when is not None and (entry["time"] is None or when < entry["time"]):
            entry["time"] = when
        if line:
            entry["evidence"].append(line)

    for xid_facts in (_facts(node.hv, "gpufleet_xid"),):
        ids = xid_facts.get("gpu_ids") if isinstance(xid_facts, dict) else None
        for pci, info in (ids.items() if isinstance(ids, dict) else []):
            index = node.pci_index.get(_norm_pci(pci))
            if index is not None and isinstance(info, dict):
                for key in ("uuid", "serial"):
                    if info.get(key) and not node.gpus[index].get(key):
                        node.gpus[index][key] = str(info[key])
    rma, leak, other = {}, {}, []
    for event in events:
        code = _int(event.get("xid"))
        index = _int(event.get("index", event.get("gpu")))
        pci = _norm_pci(event.get("pci"))
        when = _event_time(event)
        line = _event_line(event)
        if index is None and pci:
            index = node.pci_index.get(pci)
        node.timeline.append({"time_s": when, "xid": code, "gpu": index, "pci": pci,
                              "severity": str(event.get("severity") or ""), "message": line[:300]})
        if event.get("counted") is False:  # correlated with another event (XID 45 after 79): on the timeline only
            continue
        if code in t["gpufleet_lost_xids"] or event.get("lost") is True:
            mark_lost(index, pci, when, line, "XID %s" % code if code is not None else "fell off the bus")
        elif code in t["gpufleet_rma_xids"]:
            rma.setdefault((index, pci), []).append((code, line))
        elif code in t["gpufleet_ecc_leak_xids"]:
            leak.setdefault((index, pci), []).append((code, line))
        elif str(event.get("severity") or "").lower() in ("critical", "fatal", "unknown", "warning", "warn"):
            other.append((index, pci, code, line, event))

    for entry in lost_entries:
        if isinstance(entry, dict):
            mark_lost(_int(entry.get("index")), entry.get("pci"), _event_time(entry),
                      _first(entry, "line", "evidence", "message", default="xid_facts lost_gpus: %s" % entry), "lost")
        else:
            mark_lost(None, entry, None, "xid_facts lost_gpus: %s (fell off the bus)" % entry, "lost")
    problems = _as_list(_facts(node.hv, "gpufleet_gpu_problems"))
    for name in ("samples", "gpu_burn", "facts"):  # a GPU lost during the burn shows in the sampler's problems
        if isinstance(results.get(name), dict):
            problems += _as_list(results[name].get("problems"))
    # Other tools say it too ("GPU 3 (00000000:C1:00.0) is inaccessible: GPU is lost" from dcgmi, NCCL, torch).
    for name, res in sorted(results.items()):
        if not isinstance(res, dict):
            continue
        for line in _strs(res.get("reasons"), 60) + _strs(res.get("evidence"), 60):
            low = line.lower()
            if "gpu is lost" in low or "fallen off the bus" in low:
                match = re.search(r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)", line)
                if match:
                    mark_lost(None, match.group(1), None, "%s: %s" % (name, line), "lost (%s)" % name)
    for problem in problems:
        if not isinstance(problem, dict):
            continue
        text = " ".join(str(problem.get(k) or "") for k in ("kind", "message", "line"))
        if str(problem.get("kind")) == "lost" or "is lost" in text.lower() or "fallen off" in text.lower():
            pci = problem.get("pci")
            if pci is None:
                match = re.search(r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)", text)
                pci = match.group(1) if match else None
            mark_lost(_int(problem.get("index")), pci, None, problem.get("line") or problem.get("message"), "lost")

    _infer_lost_indices(node, lost)

    # PSU rails: the GPUs of one rail lost together (in a short window, or the whole rail in this run).
    rails = t["gpufleet_psu_rails"] or {}
    window = t["gpufleet_psu_loss_window_s"]
    psu_of = {}
    for rail, members in sorted(rails.items()):
        on_rail = [e for e in lost.values() if e["index"] in members]
        if len(on_rail) < 2:
            continue
        times = [e["time"] for e in on_rail if e["time"] is not None]
        span = (max(times) - min(times)) if len(times) == len(on_rail) else None
        whole = len({e["index"] for e in on_rail}) >= len(set(members))
        if whole or (span is not None and span <= window):
            indices = sorted({e["index"] for e in on_rail})
            how = "within %.3f s" % span if span is not None else "in the same run"
            node.add("fail", "PSU_RAIL_LOSS",
                     "%s: GPUs %s (PSU %s rail%s) were lost together %s" % (
                         node.host, ", ".join(map(str, indices)), rail, ", the whole rail" if whole else "", how),
                     "replace/check PSU %s on %s; split rails are not redundancy (use 1+1 hot-swap PSUs)" % (
                         rail, node.host),
                     evidence=[line for e in on_rail for line in e["evidence"]], check="xid")
            for e in on_rail:
                psu_of[e["index"]] = rail
    if not rails:
        timed = sorted((e for e in lost.values() if e["time"] is not None), key=lambda e: e["time"])
        if len(timed) >= 2 and timed[-1]["time"] - timed[0]["time"] <= window:
            node.add("fail", "GPU_GROUP_LOST",
                     "%s: %d GPUs fell off the bus within %.3f s" % (
                         node.host, len(timed), timed[-1]["time"] - timed[0]["time"]),
                     "check the PSU/power feed these GPUs share on %s (set gpufleet_psu_rails to name the PSU); "
                     "split rails are not redundancy" % node.host,
                     evidence=[line for e in timed for line in e["evidence"]], check="xid")

    for entry in lost.values():
        label = node.label(entry["index"], entry["pci"])
        rail = psu_of.get(entry["index"])
        if rail is not None:
            action = "replace/check PSU %s first (its rail lost several GPUs at once); then retest this GPU" % rail
        else:
            action = "reseat the riser and recable GPU power before any RMA (%s), then rerun the burn-in" % label
        node.add("fail", "GPU_LOST", "%s fell off the bus (%s)" % (label, entry["why"]), action,
                 evidence=entry["evidence"], gpu=entry["index"], pci=entry["pci"], check="xid")

    for (index, pci), items in rma.items():
        codes = sorted({c for c, _ in items})
        node.add("fail", "XID_RMA", "%s logged XID %s (uncorrectable memory error / page retirement / remap)" % (
            node.label(index, pci), ", ".join(map(str, codes))),
            "replace the card (RMA) with this evidence: %s" % node.label(index, pci),
            evidence=[line for _, line in items], gpu=index, pci=pci, check="xid")
    for (index, pci), items in leak.items():
        node.add("warn", "ECC_LEAK", "%s logged %d single-bit ECC XID(s) %s" % (
            node.label(index, pci), len(items), ", ".join(sorted({str(c) for c, _ in items}))),
            "slow ECC leak: schedule replacement, watch %s (volatile ECC and XID 92 rate)" % node.label(index, pci),
            evidence=[line for _, line in items], gpu=index, pci=pci, check="xid")
    for index, pci, code, line, event in other:
        severity = str(event.get("severity")).lower()
        node.add("fail" if severity in ("critical", "fatal") else "warn", "XID_OTHER",
                 "%s logged XID %s (%s, catalog severity %s)" % (
                     node.label(index, pci), code, event.get("mnemonic") or event.get("description") or "?", severity),
                 "%s (NVIDIA XID catalog, XID %s)" % (_catalog_action(event), code),
                 evidence=[line], gpu=index, pci=pci, check="xid")

    expected = t["gpufleet_expected_gpus"]
    count = _int(_facts(node.hv, "gpufleet_gpu_count"))
    if expected is not None and count is not None and count < expected and not lost:
        node.add("fail", "GPU_MISSING", "%s shows %d GPUs, %d expected" % (node.host, count, expected),
                 "reseat the risers and recable GPU power of the missing GPUs on %s, check lspci, then rerun" % node.host,
                 evidence=["gpufleet_gpu_count=%d" % count], check="gpu_facts")
    node.timeline = node.timeline[:MAX_TIMELINE]


# --------------------------------------------------------------------------------------------------------------------
# rules: memory health and busy GPUs from the facts


def rule_memory_and_busy(node):
    t = node.t
    for item in _as_list(_facts(node.hv, "gpufleet_gpus")):
        if not isinstance(item, dict) or _int(item.get("index")) is None:
            continue
        index = _int(item.get("index"))
        label = node.label(index)
        rma = "replace the card (RMA): %s" % label
        pages = (_int(item.get("retired_pages_sbe")) or 0) + (_int(item.get("retired_pages_dbe")) or 0)
        ev = "retired_pages_sbe=%s retired_pages_dbe=%s retired_pages_pending=%s" % (
            item.get("retired_pages_sbe"), item.get("retired_pages_dbe"), item.get("retired_pages_pending"))
        if pages >= t["gpufleet_retired_pages_rma"]:
            node.add("fail", "RETIRED_PAGES_EXHAUSTED", "%s has %d retired pages (limit 64, threshold %d)" % (
                label, pages, t["gpufleet_retired_pages_rma"]), rma, [ev], gpu=index, check="gpu_facts")
        elif _truthy(item.get("retired_pages_pending")):
            node.add("fail", "RETIRED_PAGES_PENDING", "%s has a page retirement pending" % label,
                     "reset the GPU to apply it; replace the card (RMA) if pages keep retiring", [ev], gpu=index,
                     check="gpu_facts")
        uncorr = _int(item.get("remapped_rows_uncorrectable")) or 0
        rev = "remapped_rows_uncorrectable=%s remapped_rows_pending=%s remapped_rows_failure=%s" % (
            item.get("remapped_rows_uncorrectable"), item.get("remapped_rows_pending"),
            item.get("remapped_rows_failure"))
        if _truthy(item.get("remapped_rows_failure")):
            node.add("fail", "ROW_REMAP_FAILURE", "%s reports a row-remap failure (spare rows exhausted)" % label,
                     rma, [rev], gpu=index, check="gpu_facts")
        elif uncorr >= t["gpufleet_remapped_rows_rma"]:
            node.add("fail", "REMAPPED_ROWS_EXHAUSTED", "%s has %d uncorrectable remapped rows (limit 512)" % (
                label, uncorr), rma, [rev], gpu=index, check="gpu_facts")
        elif _truthy(item.get("remapped_rows_pending")):
            node.add("fail", "ROW_REMAP_PENDING", "%s has a row remap pending" % label,
                     "reset the GPU to apply the remap, rerun; replace the card (RMA) if remaps keep coming",
                     [rev], gpu=index, check="gpu_facts")
        dbe = _int(item.get("ecc_volatile_uncorrected")) or 0
        if dbe > 0:
            node.add("fail", "ECC_UNCORRECTED", "%s has %d uncorrectable ECC errors since boot" % (label, dbe), rma,
                     ["ecc_volatile_uncorrected=%d" % dbe], gpu=index, check="gpu_facts")

        ignore = set(t["gpufleet_busy_ignore_processes"])
        procs = [p for p in _as_list(item.get("processes")) if isinstance(p, dict)
                 and str(p.get("name") or "").rsplit("/", 1)[-1] not in ignore and str(p.get("name")) not in ignore]
        if procs:
            who = ", ".join("PID %s (%s, %s MiB)" % (p.get("pid"), p.get("name"), p.get("used_memory_mib"))
                            for p in procs)
            node.add(t["gpufleet_busy_gpu_severity"], "GPU_BUSY", "%s is busy: %s" % (label, who),
                     "stop %s or wait for it, then rerun; a neighbour process is the usual cause of CUDA OOM" % who,
                     ["pid=%s name=%s used_memory_mib=%s" % (p.get("pid"), p.get("name"), p.get("used_memory_mib"))
                      for p in procs], gpu=index, check="gpu_facts")
    refused = node.hv.get("gpufleet_refused_reason")
    if refused:
        node.add("error", "CHECKS_REFUSED", "%s: %s" % (node.host, refused),
                 "stop the processes on the busy GPUs (or set gpufleet_force=true) and rerun the burn-in",
                 [str(refused)], check="gpu_facts")


# --------------------------------------------------------------------------------------------------------------------
# rules: samples under load (temperature, throttling, PCIe, ECC rise)


_UTIL_KEYS = ("utilization_gpu_pct", "utilization_pct", "gpu_util_pct", "util_pct", "utilization_gpu")
_TIME_KEYS = ("t_s", "elapsed_s", "time_s", "timestamp_s", "timestamp", "time", "ts")


def _iter_samples(res):
    """Yield (index, pci, t, sample) from the shapes a sampler may use: a flat list with `index`, frames with
    `gpus`, or per-GPU series (`gpus: [{index, samples: [...]}]` or a mapping keyed by index)."""
    if not isinstance(res, dict):
        return
    container = res.get("samples")
    if isinstance(container, dict):
        for key, rows in container.items():
            for i, row in enumerate(_as_list(rows)):
                if isinstance(row, dict):
                    yield _int(row.get("index", key)), row.get("pci"), _sample_time(row, i), row
        return
    if isinstance(container, list):
        for i, row in enumerate(container):
            if not isinstance(row, dict):
                continue
            if isinstance(row.get("gpus"), list):
                when = _sample_time(row, i)
                for g in row["gpus"]:
                    if isinstance(g, dict):
                        yield _int(g.get("index")), g.get("pci"), when, g
            else:
                yield _int(row.get("index")), row.get("pci"), _sample_time(row, i), row
        return
    for g in _as_list(res.get("gpus")):
        if isinstance(g, dict) and isinstance(g.get("samples"), list):
            for i, row in enumerate(g["samples"]):
                if isinstance(row, dict):
                    yield _int(g.get("index")), g.get("pci"), _sample_time(row, i), row


def _sample_time(row, i):
    for key in _TIME_KEYS:
        if key in row:
            seconds = _time_s(row.get(key))
            if seconds is not None:
                return seconds
    return None


def _per_gpu_samples(node, res):
    per = {}
    interval = _num(_first(res, "interval_s", "sample_interval_s")) if isinstance(res, dict) else None
    for index, pci, when, row in _iter_samples(res):
        if index is None and pci:
            index = node.pci_index.get(_norm_pci(pci))
        if index is None:
            continue
        per.setdefault(index, []).append((when, row))
    for rows in per.values():
        if all(w is None for w, _ in rows):
            step = interval or 1.0
            rows[:] = [(i * step, r) for i, (_, r) in enumerate(rows)]
        else:
            rows[:] = [(w, r) for w, r in rows if w is not None]
            rows.sort(key=lambda x: x[0])
    return per, interval


def _seconds_above(points, limit, interval):
    """Seconds spent above `limit`: each sample above counts until the next sample (the last one: the median step)."""
    if not points:
        return 0.0
    steps = [b[0] - a[0] for a, b in zip(points, points[1:], strict=False) if b[0] > a[0]]
    step = sorted(steps)[len(steps) // 2] if steps else (interval or 1.0)
    total = 0.0
    for i, (when, value) in enumerate(points):
        if value is not None and value > limit:
            nxt = points[i + 1][0] - when if i + 1 < len(points) else step
            total += max(0.0, min(nxt, 3 * step))  # a gap in sampling is not evidence of heat
    return total


def _downsample(points, limit=MAX_SERIES_POINTS):
    if len(points) <= limit:
        return points
    stride = len(points) / float(limit)
    return [points[int(i * stride)] for i in range(limit)]


def rule_samples(node, results):
    t = node.t
    res = results.get("samples")
    per, interval = _per_gpu_samples(node, res) if isinstance(res, dict) else ({}, None)
    nccl = results.get("nccl_test")
    nccl_per, _ = _per_gpu_samples(node, nccl) if isinstance(nccl, dict) else ({}, None)
    temps_series = {}
    limit = t["gpufleet_temp_max_c"]
    for index in sorted(set(per) | set(nccl_per)):
        node.gpu(index)
        label = node.label(index)
        rows = per.get(index, [])
        start = rows[0][0] if rows else 0.0
        temps = [(w - start, _num(_first(r, "temperature_c", "temp_c", "temperature_gpu_c"))) for w, r in rows]
        temps = [(round(w, 3), v) for w, v in temps if v is not None]
        if temps:
            temps_series[str(index)] = _downsample([[w, v] for w, v in temps])
            node.metric(index, "temperature_max_c", max(v for _, v in temps))
            above = _seconds_above(temps, limit, interval)
            node.metric(index, "seconds_above_temp_limit_s", round(above, 1))
            hot = [r for _, r in rows if (_num(r.get("temperature_c")) or 0) > limit]
            if above >= t["gpufleet_temp_sustained_s"]:
                node.add("fail", "THERMAL_SUSTAINED",
                         "%s ran above %g C for %.0f s under load (max %g C, limit %g s)" % (
                             label, limit, above, max(v for _, v in temps), t["gpufleet_temp_sustained_s"]),
                         "fix the airflow around %s: fans, blanking panels, filters, inlet temperature, card spacing"
                         % label, [_sample_line(index, r) for r in hot[:5]], gpu=index, check="samples")
        throttled = [r for _, r in rows if _thermal_throttle(r.get("throttle_reasons"))]
        if throttled:
            node.add("warn", "THERMAL_THROTTLE", "%s throttled for temperature in %d of %d samples under load" % (
                label, len(throttled), len(rows)),
                "check the airflow around %s (fans, blanking panels, inlet temperature)" % label,
                [_sample_line(index, r) for r in throttled[:5]], gpu=index, check="samples")
        powers = [_num(r.get("power_w")) for _, r in rows if _num(r.get("power_w")) is not None]
        if powers:
            node.metric(index, "power_max_w", max(powers))
        _pcie_under_load(node, index, rows + nccl_per.get(index, []))
        corr = [(_num(r.get("ecc_volatile_corrected"))) for _, r in rows if _num(r.get("ecc_volatile_corrected"))
                is not None]
        if len(corr) >= 2 and corr[-1] - corr[0] >= t["gpufleet_ecc_corrected_rise"]:
            node.metric(index, "ecc_volatile_corrected_rise", corr[-1] - corr[0])
            node.add("warn", "ECC_CORRECTED_RISING",
                     "%s volatile corrected ECC rose from %d to %d during the run" % (label, corr[0], corr[-1]),
                     "slow ECC leak: schedule replacement, watch %s" % label,
                     ["ecc_volatile_corrected first=%d last=%d" % (corr[0], corr[-1])], gpu=index, check="samples")
    if temps_series:
        node.series["temperature_c"] = temps_series
        node.series["temperature_limit_c"] = limit


def _thermal_throttle(reasons):
    for reason in _as_list(reasons):
        name = str(reason).lower().replace(" ", "_").replace("-", "_")
        if any(word in name for word in _THERMAL_WORDS) and "not_active" not in name:
            return True
    return False


def _sample_line(index, row):
    keys = ("temperature_c", "utilization_gpu_pct", "power_w", "pcie_gen_current", "pcie_width_current",
            "throttle_reasons")
    raw = row.get("line") or row.get("raw")
    if raw:
        return str(raw)
    return "GPU %s: " % index + " ".join("%s=%s" % (k, row.get(k)) for k in keys if k in row)


def _pcie_under_load(node, index, rows):
    t = node.t
    loaded = []
    for _, r in rows:
        util = _num(_first(r, *_UTIL_KEYS))
        if util is None or util >= t["gpufleet_load_util_min_pct"]:
            loaded.append(r)
    gens = [_int(r.get("pcie_gen_current")) for r in loaded if _int(r.get("pcie_gen_current")) is not None]
    widths = [_int(r.get("pcie_width_current")) for r in loaded if _int(r.get("pcie_width_current")) is not None]
    gpu = node.gpus.get(index) or {}
    gen_max = _int(_first(loaded[0] if loaded else {}, "pcie_gen_max")) or _int(gpu.get("metrics", {}).get("pcie_gen_max"))
    width_max = (_int(_first(loaded[0] if loaded else {}, "pcie_width_max"))
                 or _int(gpu.get("metrics", {}).get("pcie_width_max")))
    if gens:
        node.metric(index, "pcie_gen_under_load", max(gens))
    if widths:
        node.metric(index, "pcie_width_under_load", max(widths))
    # The best link seen under load counts: a momentary dip is not a degraded link; never reaching max is.
    low_gen = gens and gen_max and max(gens) < gen_max
    low_width = widths and width_max and max(widths) < width_max
    if low_gen or low_width:
        label = node.label(index)
        node.add("fail", "PCIE_DEGRADED", "%s PCIe link under load is gen %s x%s, max gen %s x%s (%d samples)" % (
            label, max(gens) if gens else "?", max(widths) if widths else "?", gen_max, width_max, len(loaded)),
            "reseat or replace the riser of %s, or move the card to another slot; check the slot's BIOS link "
            "setting" % label, [_sample_line(index, r) for r in loaded[:5]], gpu=index, check="samples")


# --------------------------------------------------------------------------------------------------------------------
# rules: the checks


def _check_error(node, name, state, reason, res):
    evidence = _strs(res.get("evidence")) if isinstance(res, dict) else []
    tool = res.get("tool") if isinstance(res, dict) else None
    if isinstance(tool, dict) and tool.get("argv"):
        evidence.append("argv: %s rc=%s timed_out=%s" % (" ".join(map(str, tool["argv"])), tool.get("rc"),
                                                         tool.get("timed_out")))
    evidence = evidence or ["gpufleet_result_%s: %s" % (name, reason)]
    if name == "run":  # the playbook's rescue: the node stopped before or between its checks (see the message)
        node.add("error", "RUN_STOPPED", "%s: %s" % (node.host, reason),
                 "fix what the message names on %s (an inventory value is checked against "
                 "roles/gpufleet/meta/argument_specs.yml), then rerun" % node.host, evidence, check=name)
        return
    node.add("error", "CHECK_ERROR", "%s: %s could not run: %s" % (node.host, name, reason),
             "make %s runnable on %s (%s), then rerun; no result is not a pass" % (name, node.host, reason),
             evidence, check=name)


def _gpu_entries(res):
    return [g for g in _as_list(res.get("gpus")) if isinstance(g, dict)] if isinstance(res, dict) else []


def rule_gpu_burn(node, res):
    gflops_series = {}
    for g in _gpu_entries(res):
        index = _int(g.get("index"))
        if index is None:
            continue
        node.gpu(index, g.get("pci"))
        status = str(_first(g, "status", "verdict", default="")).lower()
        gflops = _num(_first(g, "gflops_mean", "gflops", "gflops_avg", "gflop_s", "avg_gflops"))
        errors = _int(_first(g, "errors", "errors_total", "error_count"))
        node.metric(index, "burn_gflops", gflops)
        node.metric(index, "burn_errors", errors)
        node.metric(index, "burn_gflops_max", _num(g.get("gflops_max")))
        node.metric(index, "burn_temperature_max_c", _num(_first(g, "max_temperature_c", "temperature_max_c")))
        series = _first(g, "series", "gflops_series", "frames")
        frames = [f for f in series if f is not None] if isinstance(series, list) else []
        if frames:
            pts = []
            for i, f in enumerate(frames):
                v = _num(f.get("gflops")) if isinstance(f, dict) else _num(f)
                x = _num(f.get("percent")) if isinstance(f, dict) else None
                if v is not None:
                    pts.append([x if x is not None else i, v])
            if pts:
                gflops_series[str(index)] = _downsample(pts)
        if status in ("ok", "pass", "passed", ""):
            continue
        mine = re.compile(r"\bGPU %d\b" % index)
        reasons = _strs(_first(g, "reasons", "reason")) or [r for r in _strs(res.get("reasons")) if mine.search(r)]
        label = node.label(index)
        node.add("fail", "BURN_FAULTY", "%s failed gpu-burn: %s%s" % (
            label, status, (" (" + "; ".join(reasons) + ")") if reasons else ""),
            "rerun gpu-burn on %s alone; if it fails again replace the card (RMA) with this evidence" % label,
            _strs(_first(g, "evidence", "lines")) or [ln for ln in _strs(res.get("evidence"), 60)
                                                      if mine.search(ln)] or _strs(reasons),
            gpu=index, check="gpu_burn")
    frames = res.get("frames") if isinstance(res, dict) else None
    if not gflops_series and isinstance(frames, list):
        for i, frame in enumerate(frames):
            if not isinstance(frame, dict):
                continue
            x = _num(frame.get("percent"))
            for j, g in enumerate(_as_list(frame.get("gpus"))):
                if isinstance(g, dict):
                    idx, v = _int(g.get("index", j)), _num(_first(g, "gflops", "gflop_s"))
                else:
                    idx, v = j, None
                if idx is not None and v is not None:
                    gflops_series.setdefault(str(idx), []).append([x if x is not None else i, v])
    if gflops_series:
        node.series["gflops"] = {k: _downsample(v) for k, v in gflops_series.items()}
    if res.get("verdict") in ("fail", "warn") and not any(f["check"] == "gpu_burn" for f in node.findings):
        node.add(res["verdict"], "BURN_FAULTY", "%s: gpu-burn %s: %s" % (
            node.host, res["verdict"], "; ".join(_strs(res.get("reasons"))) or "no reason given"),
            "rerun gpu-burn; replace the GPU it names if it fails again", _strs(res.get("evidence")),
            check="gpu_burn")


def rule_dcgm(node, res):
    for g in _gpu_entries(res):
        index = _int(g.get("index", g.get("entity_id")))
        status = str(_first(g, "status", "verdict", default="")).lower()
        if index is None or status not in ("fail", "warn"):
            continue
        label = node.label(index)
        mine = re.compile(r"\bGPU %d\b" % index)
        reasons = _strs(_first(g, "reasons", "warnings", "errors", "messages")) or \
            [r for r in _strs(res.get("reasons")) if mine.search(r)]
        tests = _strs(g.get("failed_tests") if status == "fail" else _first(g, "warned_tests", "failed_tests"))
        sev = "fail" if status == "fail" else "warn"
        action = ("rerun dcgmi diag -r 3 -i %s; if it fails again replace the card (RMA) with the DCGM log" % index
                  if sev == "fail" else "watch %s: rerun dcgmi diag at the next maintenance" % label)
        node.add(sev, "DCGM_" + sev.upper(), "%s: dcgmi diag %s%s%s" % (
            label, status, (" in " + ", ".join(tests)) if tests else "", (": " + "; ".join(reasons)) if reasons else ""),
            action, _strs(g.get("evidence")) or [e for e in _strs(res.get("evidence"), 60) if mine.search(e)]
            or reasons or ["dcgm_diag GPU %s: status=%s failed_tests=%s warned_tests=%s" % (
                index, status, g.get("failed_tests"), g.get("warned_tests"))], gpu=index, check="dcgm_diag")
    if res.get("verdict") in ("fail", "warn") and not any(f["check"] == "dcgm_diag" for f in node.findings):
        node.add(res["verdict"], "DCGM_" + res["verdict"].upper(), "%s: dcgmi diag %s: %s" % (
            node.host, res["verdict"], "; ".join(_strs(res.get("reasons"))) or "no reason given"),
            "rerun dcgmi diag -r 3 and act on the test it names", _strs(res.get("evidence")), check="dcgm_diag")


_BUSBW_KEYS = ("busbw_gbps", "busbw_large_gbps", "busbw_max_size_gbps", "largest_busbw_gbps", "peak_busbw_gbps",
               "max_busbw_gbps")


def rule_nccl(node, res):
    names = [g.get("name") for g in node.gpus.values() if g.get("name")] + _strs(res.get("gpu_names"))
    threshold, source = nccl_threshold(names, node.t)
    busbw = _num(_first(res, *_BUSBW_KEYS))
    figures = {"busbw_gbps": busbw, "min_busbw_gbps": threshold, "threshold_source": source,
               "avg_busbw_gbps": _num(res.get("avg_busbw_gbps"))}
    reasons = _strs(res.get("reasons"))
    if res.get("verdict") == "fail" and (busbw is None or threshold is None or busbw >= threshold):
        node.add("fail", "NCCL_FAIL", "%s: all_reduce_perf failed: %s" % (node.host, "; ".join(reasons) or "?"),
                 "fix what NCCL reports on %s (driver/CUDA/NCCL mismatch, a GPU in error), then rerun" % node.host,
                 _strs(res.get("evidence")), check="nccl_test")
    if busbw is None:
        node.add("error", "NCCL_NO_FIGURE", "%s: all_reduce_perf gave no bus bandwidth" % node.host,
                 "rerun nccl_test on %s and read its output; no figure is not a pass" % node.host,
                 _strs(res.get("evidence")), check="nccl_test")
    elif threshold is None:
        node.add("warn", "NCCL_NO_BASELINE", "%s: NCCL busbw %.1f GB/s, no threshold: %s" % (node.host, busbw, source),
                 "set gpufleet_nccl_min_busbw_gbps for this platform's group (burn in a known-good node first)",
                 _strs(res.get("evidence"), 5), check="nccl_test")
    elif busbw < threshold:
        node.add("fail", "NCCL_BUSBW_LOW", "%s: NCCL busbw %.1f GB/s < %.1f GB/s (%s)" % (
            node.host, busbw, threshold, source),
            "check the topology and risers on %s: nvidia-smi topo -m, PCIe gen/width of each GPU under load, "
            "reseat/replace the riser of the slow link" % node.host, _strs(res.get("evidence"), 8), check="nccl_test")
    return figures


def rule_simple_check(node, name, res):
    """Checks whose module already judged: storage, dry run, env and any future gpufleet_result_<name>."""
    verdict = res.get("verdict")
    if verdict not in ("fail", "warn"):
        return
    reasons = _strs(res.get("reasons")) or ["no reason given"]
    why = "; ".join(reasons)
    if name == "checkpoint_storage":
        code, action = "STORAGE_" + verdict.upper(), "fix the checkpoint storage on %s: %s" % (node.host, why)
    elif name == "env":
        missing = _strs(_first(res, "missing", "missing_vars") or
                        _first(_first(res, "ansible_facts", default={}).get("gpufleet_training_env") or {}, "missing"))
        if not missing:  # training_env_facts: variables [{name, status}] (ok, missing, wrong, systemd_missing, ...)
            missing = [str(v.get("name")) for v in _as_list(res.get("variables")) if isinstance(v, dict)
                       and v.get("status") in ("missing", "wrong", "systemd_missing", "unset", "deprecated")]
        what = ", ".join(missing) if missing else why
        code, action = "ENV_MISSING", ("set %s for the training user on %s (role kentino.gpufleet.training_env)"
                                       % (what, node.host))
    elif name == "train_dryrun":
        code, action = "DRYRUN_" + verdict.upper(), "fix the training entrypoint or its environment on %s: %s" % (
            node.host, why)
    else:
        code, action = "CHECK_" + verdict.upper(), "act on what %s reports on %s: %s" % (name, node.host, why)
    node.add(verdict, code, "%s: %s %s: %s" % (node.host, name, verdict, why), action,
             _strs(res.get("evidence")) or reasons, check=name)


# --------------------------------------------------------------------------------------------------------------------
# reachability and the node verdict


def reachability(hv, in_play_hosts=None):
    """(reachable, reason). in_play_hosts: True/False when the action runs in the nodes' own play, else None."""
    for key, value in hv.items():
        if isinstance(key, str) and key.startswith("gpufleet_result_") and isinstance(value, dict) \
                and value.get("unreachable"):
            return False, "unreachable during %s: %s" % (key[len("gpufleet_result_"):], value.get("msg") or "?")
    if hv.get("gpufleet_completed") is True:
        return True, ""
    if in_play_hosts is True:
        return True, ""
    stage = hv.get("gpufleet_stage")
    if in_play_hosts is False:
        return False, "dropped out of the play at stage %s (unreachable, or a task failed outside a rescue)" % (
            stage or "start")
    if stage is None:
        if not any(isinstance(k, str) and k.startswith("gpufleet_result_") for k in hv) and \
                _facts(hv, "gpufleet_gpus") is None:
            return False, "no results at all: the host was never reached (or not part of the play)"
        return True, ""
    if stage != "done":
        return False, "did not finish: stopped at stage %s (unreachable, or a task failed outside a rescue)" % stage
    return True, ""


def _last_evidence(hv):
    lines = []
    for key in sorted(hv):
        value = hv[key]
        if isinstance(key, str) and key.startswith("gpufleet_result_") and isinstance(value, dict):
            if value.get("unreachable") or value.get("failed"):
                lines.append("%s: %s" % (key, value.get("msg")))
            else:
                lines.extend(_strs(value.get("evidence"), 3))
    return lines[-8:]


def evaluate_node(host, hv, in_play_hosts=None):
    """One host's variables (plain dict) -> the report's node dict. Never raises on bad input."""
    hv = hv if isinstance(hv, dict) else {}
    thresholds, config_errors = resolve_thresholds(host, hv)
    node = _Node(host, hv, thresholds)
    for message in config_errors:
        node.add("error", "CONFIG_INVALID", message, "correct the inventory variable and rerun",
                 [message], check="config")

    rules = [("gpu_facts", lambda: _read_gpus(node))]
    results = _results(node)
    rules.append(("xid", lambda: rule_xid_and_lost(node, results)))
    rules.append(("gpu_facts", lambda: rule_memory_and_busy(node)))
    rules.append(("samples", lambda: rule_samples(node, results)))
    for name in sorted(results):
        if name in _FACT_ONLY_RESULTS:
            continue
        rules.append((name, _make_check_rule(node, name, results[name])))
    for name, rule in rules:
        try:
            rule()
        except Exception as exc:  # a rule bug must not lose the report: it shows as an error naming the rule
            node.add("error", "RULE_ERROR", "%s: rule %s crashed on this host's data: %s: %s" % (
                host, name, type(exc).__name__, exc), "report this as a kentino.gpufleet bug with report.json",
                [repr(exc)], check=name)

    reachable, why = reachability(hv, in_play_hosts)
    stage = hv.get("gpufleet_stage")
    stage = str(stage) if stage is not None else None
    if not reachable:
        node.add("unreachable", "UNREACHABLE", "%s: %s" % (host, why),
                 "bring %s back (power, network, sshd), check the BMC/console log for a crash, then rerun from "
                 "stage %s" % (host, stage or "start"), _last_evidence(hv) or [why], check="reachability")

    # Pseudo-checks that carry findings of facts (xid, gpu_facts, samples) get a verdict too.
    for finding in node.findings:
        check = finding["check"]
        if check and check not in node.checks:
            node.set_check(check, "pass")
    for name, check in node.checks.items():
        own = [f for f in node.findings if f["check"] == name]
        if own:
            verdict = worst([check["verdict"]] + [f["severity"] for f in own])
            check["verdict"] = "error" if verdict == "unreachable" else verdict  # checks have no unreachable
            for f in own:
                if f["message"] not in check["reasons"]:
                    check["reasons"].append(f["message"])
    if "xid" not in node.checks and _facts(hv, "gpufleet_xid") is not None:
        node.set_check("xid", "pass", [], {"events": len(node.timeline)})

    return _finish(node, reachable, stage)


def _make_check_rule(node, name, res):
    def rule():
        state, reason = result_state(res)
        figures = _figures(res) if isinstance(res, dict) else {}
        if state in ("missing",):
            return
        if state == "skipped":
            if isinstance(res, dict) and res.get("false_condition"):
                # Ansible's "Conditional result was False" says nothing to an operator: say why it did not run.
                refused = node.hv.get("gpufleet_refused_reason")
                reason = "not run: %s" % (refused if refused and "refused" in res["false_condition"]
                                          else "disabled (%s)" % res["false_condition"])
            node.set_check(name, "skipped", [reason], figures)
            return
        if state in ("failed", "error", "unreachable"):
            if state != "unreachable":  # the UNREACHABLE finding of the node carries it
                _check_error(node, name, state, reason, res)
            node.set_check(name, "error", [reason], figures)
            return
        if name == "gpu_burn":
            rule_gpu_burn(node, res)
        elif name == "dcgm_diag":
            rule_dcgm(node, res)
        elif name == "nccl_test":
            figures.update(rule_nccl(node, res))
        elif name == "samples":
            pass  # judged by rule_samples (needs the GPU table first)
        else:
            rule_simple_check(node, name, res)
        verdict = res.get("verdict") if res.get("verdict") in ("pass", "warn", "fail", "skipped") else "pass"
        node.set_check(name, verdict, res.get("reasons"), figures)
    return rule


def _finish(node, reachable, stage):
    findings = sorted(node.findings, key=lambda f: -rank(f["severity"]))  # stable: rule order within a severity
    gpus = []
    for index in sorted(node.gpus):
        gpu = node.gpus[index]
        own = [f for f in findings if f["gpu"] == index]
        gpus.append({"index": index, "pci": gpu.get("pci"), "serial": gpu.get("serial"), "name": gpu.get("name"),
                     "uuid": gpu.get("uuid"), "verdict": worst(f["severity"] for f in own),
                     "findings": own, "metrics": gpu["metrics"]})
    verdict = "unreachable" if not reachable else worst(f["severity"] for f in findings)
    worst_finding = findings[0] if findings else None
    if not reachable:
        # Evidence gathered before the node vanished (a PSU rail lost, a GPU off the bus) explains it best.
        worst_finding = next((f for f in findings if f["severity"] == "fail"), worst_finding)
    return {
        "host": node.host,
        "verdict": verdict,
        "stage": stage,
        "reachable": reachable,
        "worst": worst_finding,
        "action": worst_finding["action"] if worst_finding else None,
        "gpus": gpus,
        "findings": findings,
        "checks": node.checks,
        "thresholds": {k: v for k, v in node.t.items() if not k.startswith("_")},
        "threshold_sources": node.t.get("_sources", {}),
        "series": node.series,
        "xid_timeline": sorted(node.timeline, key=lambda e: (e["time_s"] is None, e["time_s"] or 0)),
    }
