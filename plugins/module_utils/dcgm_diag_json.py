# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parse `dcgmi diag -r N -j` output; stdlib only, runs on the node (judged by judge_dcgm).

Shapes read:
  DCGM 4.x  {"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results": [{"entity_group",
             "entity_id", "status", "warnings": [{"warning", "error_id", "error_severity"}], "info"}],
             "test_summary"}]}], "runtime_error"?}, "entity_groups": [...], "metadata": {"version", ...}}
  DCGM 3.x  {"DCGM GPU Diagnostic": {"test_categories": [... results carry "gpu_id": "0" or "gpu_ids": "0,1" ...],
             "version"}, "Driver Version Detected", ...}; status case varies (PASS / Pass)
  --iterations  {"iterations": [<either shape>, ...], "Overall Result": "Pass" | "Fail"}
  no JSON at all: "Error: unable to establish a connection to the specified host: ..." (nv-hostengine not running)

Traps: 4.x serialises a WARN as "Fail" (warnings[].error_severity tells them apart); a diag that could not run says so
in runtime_error or skips every test, and must never read as a pass; exit codes are the negative DCGM status as an
unsigned byte (226 = -30 diag failure, 205 = -51 isolate).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re

# dcgmErrorSeverity_t: 0 NONE, 1 MONITOR, 2 ISOLATE, 3 UNKNOWN, 4 TRIAGE, 5 CONFIG, 6 RESET. MONITOR and CONFIG mean
# "can run work": a warning. Anything else (or no severity at all, as in 3.x) keeps the failure.
WARN_SEVERITIES = (0, 1, 5)
SEVERITY_NAMES = {0: "none", 1: "monitor", 2: "isolate", 3: "unknown", 4: "triage", 5: "config", 6: "reset"}
RC_DIAG_FAILURE = 226  # DCGM_ST_NVVS_ERROR (-30)
RC_ISOLATE = 205  # DCGM_ST_NVVS_ISOLATE_ERROR (-51)

# Test name (normalised) -> lowest level that runs it. Deployment/software checks are level 1.
TEST_LEVELS = {
    "pcie": 2, "memory": 2, "gpu_memory": 2,
    "diagnostic": 3, "targeted_stress": 3, "targeted_power": 3, "memory_bandwidth": 3, "sm_stress": 3,
    "nvbandwidth": 3, "nccl_tests": 3,
    "memtest": 4, "pulse_test": 4,
}
_HOSTENGINE_DOWN = re.compile(r"unable to establish a connection to the specified host|Unable to connect to host "
                              r"engine|Host engine connection invalid", re.I)
MAX_SAMPLES = 5
_STATUS_ORDER = ("skipped", "pass", "warn", "error", "fail")


def _list(value):
    """Lists only: a JSON value of the wrong type reads as empty instead of iterating a string or failing on a number."""
    return value if isinstance(value, list) else []


def _norm_name(name):
    text = re.sub(r"[\s\-]+", "_", str(name or "").strip().lower())
    return "memory" if text == "gpu_memory" else text


def _norm_status(value):
    text = str(value or "").strip().lower()
    if text in ("pass", "passed", "success"):
        return "pass"
    if text in ("fail", "failed", "failure"):
        return "fail"
    if text in ("warn", "warning"):
        return "warn"
    if text in ("skip", "skipped", "not run", "notrun", "not_run"):
        return "skipped"
    return None


def _worst(statuses):
    ranked = [s for s in statuses if s in _STATUS_ORDER]
    return max(ranked, key=_STATUS_ORDER.index) if ranked else None


def _as_int(value):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _warnings(raw):
    """3.x: strings or {"warning", "error_id"}; 4.x: {"warning", "error_id", "error_category", "error_severity"}."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raw = [raw]
    out = []
    for item in raw:
        if isinstance(item, dict):
            out.append({
                "message": str(item.get("warning", item.get("message", ""))).strip(),
                "error_id": _as_int(item.get("error_id")),
                "severity": _as_int(item.get("error_severity")),
                "category": _as_int(item.get("error_category")),
            })
        elif item not in (None, ""):
            out.append({"message": str(item).strip(), "error_id": None, "severity": None, "category": None})
    return out


def _info(raw):
    if raw is None:
        return []
    if not isinstance(raw, list):
        raw = [raw]
    return [str(i).strip() for i in raw if i not in (None, "")]


def _entity_ids(result):
    """(group, [ids]) of one result; group is 'GPU' for 3.x gpu_id/gpu_ids."""
    if "entity_id" in result or "entity_group" in result:
        group = result.get("entity_group")
        group = str(group).upper() if isinstance(group, str) else ("GPU" if group in (None, 1) else str(group))
        entity_id = _as_int(result.get("entity_id"))
        return group, [entity_id] if entity_id is not None else []
    if "gpu_id" in result:
        entity_id = _as_int(result.get("gpu_id"))
        return "GPU", [entity_id] if entity_id is not None else []
    if "gpu_ids" in result:
        raw = result.get("gpu_ids")
        parts = raw if isinstance(raw, list) else str(raw).split(",")
        return "GPU", [i for i in (_as_int(p) for p in parts) if i is not None]
    return "SYSTEM", []


def _result_status(result, problems, where):
    status = _norm_status(result.get("status"))
    warnings = _warnings(result.get("warnings"))
    if status is None:
        problems.append({"kind": "unknown_status", "message": "unknown status %r in %s" % (result.get("status"), where),
                         "line": json.dumps(result)[:200]})
        return "error", warnings
    if status == "fail" and warnings and all(w["severity"] in WARN_SEVERITIES for w in warnings):
        status = "warn"  # 4.x writes WARN as "Fail"; only the severities say it was a warning
    return status, warnings


def _diag_body(obj):
    if not isinstance(obj, dict):
        return None, None
    for key, fmt in (("DCGM Diagnostic", "dcgm4"), ("DCGM GPU Diagnostic", "dcgm3")):
        if isinstance(obj.get(key), dict):
            return fmt, obj[key]
    if isinstance(obj.get("test_categories"), list):
        return "bare", obj
    return None, None


def _recognised(obj):
    return isinstance(obj, dict) and (_diag_body(obj)[1] is not None or isinstance(obj.get("iterations"), list)
                                      or "runtime_error" in obj)


def _extract_json(text):
    """(object, leftover lines): the diag's JSON object in text, tolerating lines printed before or after it.

    Only a recognised object counts: in a truncated document the first decodable '{' is an inner result.
    """
    decoder = json.JSONDecoder()
    start = text.find("{")
    attempts = 0
    while start != -1 and attempts < 500:  # bounded: a log full of braces must not cost quadratic time
        attempts += 1
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        if _recognised(obj):
            return obj, (text[:start] + "\n" + text[end:]).splitlines()
        start = text.find("{", start + 1)
    return None, text.splitlines()


def parse_dcgm_diag(text):
    """dcgmi diag -j output -> dict; never raises."""
    text = text if isinstance(text, str) else ("" if text is None else str(text))
    out = {
        "format": None, "dcgm_version": None, "driver_version": None, "runtime_error": None, "iterations": None,
        "overall_result": None, "tests": [], "gpus": [], "messages": [], "hostengine_down": False,
        "unparsed": {"count": 0, "samples": []}, "problems": [],
    }
    obj, leftovers = _extract_json(text)
    for line in leftovers:
        line = line.strip()
        if not line:
            continue
        if _HOSTENGINE_DOWN.search(line):
            out["hostengine_down"] = True
        if line.lower().startswith(("error", "warning")) or _HOSTENGINE_DOWN.search(line):
            out["messages"].append(line[:300])
        else:
            out["unparsed"]["count"] += 1
            if len(out["unparsed"]["samples"]) < MAX_SAMPLES:
                out["unparsed"]["samples"].append(line[:200])
    if obj is None:
        if "{" in text:
            out["problems"].append({"kind": "json", "message": "output holds no complete DCGM diag JSON document "
                                    "(truncated or not dcgmi's)", "line": text.strip()[:200]})
        return out

    bodies = []
    if isinstance(obj.get("iterations"), list):
        out["format"] = "iterations"
        out["iterations"] = len(obj["iterations"])
        out["overall_result"] = _norm_status(obj.get("Overall Result")) or obj.get("Overall Result")
        for item in obj["iterations"]:
            fmt, body = _diag_body(item)
            if body is None:
                out["problems"].append({"kind": "iteration", "message": "iteration without diag results",
                                        "line": json.dumps(item)[:200]})
                continue
            bodies.append((item, body))
            out["format"] = "iterations-" + fmt
    else:
        fmt, body = _diag_body(obj)
        if body is None:
            out["problems"].append({"kind": "shape", "message": "JSON without 'DCGM Diagnostic' results",
                                    "line": json.dumps(obj)[:200]})
            out["runtime_error"] = _runtime_error(obj)
            return out
        out["format"] = fmt
        bodies.append((obj, body))

    tests = {}
    serials = {}
    for root, body in bodies:
        _metadata(out, root, body)
        out["runtime_error"] = out["runtime_error"] or _runtime_error(body) or _runtime_error(root)
        for group in _list(root.get("entity_groups")):
            if isinstance(group, dict) and str(group.get("entity_group", "GPU")).upper() == "GPU":
                for entity in _list(group.get("entities")):
                    if isinstance(entity, dict) and _as_int(entity.get("entity_id")) is not None:
                        serials[_as_int(entity.get("entity_id"))] = entity.get("serial_num") or None
        for category in _list(body.get("test_categories")):
            if not isinstance(category, dict):
                continue
            for test in _list(category.get("tests")):
                if isinstance(test, dict):
                    _merge_test(tests, category.get("category"), test, out["problems"])
    out["tests"] = list(tests.values())
    for test in out["tests"]:
        test["gpus"] = [test["gpus"][k] for k in sorted(test["gpus"])]
    out["gpus"] = _per_gpu(out["tests"], serials)
    return out


def _metadata(out, root, body):
    meta = root.get("metadata") if isinstance(root.get("metadata"), dict) else {}
    for source in (meta, body, root):
        if out["dcgm_version"] is None and source.get("version") not in (None, ""):
            out["dcgm_version"] = str(source.get("version"))
        if out["driver_version"] is None and source.get("Driver Version Detected") not in (None, ""):
            out["driver_version"] = str(source.get("Driver Version Detected"))


def _runtime_error(obj):
    if not isinstance(obj, dict):
        return None
    value = obj.get("runtime_error")
    if value in (None, "", []):
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _merge_test(tests, category, test, problems):
    name = str(test.get("name") or "unnamed")
    key = (str(category or ""), _norm_name(name))
    entry = tests.setdefault(key, {"category": category, "name": name, "key": _norm_name(name), "status": None,
                                   "gpus": {}, "entities": []})
    statuses = []
    for result in _list(test.get("results")):
        if not isinstance(result, dict):
            continue
        status, warnings = _result_status(result, problems, name)
        statuses.append(status)
        group, ids = _entity_ids(result)
        info = _info(result.get("info"))
        if group != "GPU" or not ids:
            entry["entities"].append({"entity_group": group, "entity_ids": ids, "status": status,
                                      "warnings": warnings, "info": info})
            continue
        for index in ids:
            gpu = entry["gpus"].setdefault(index, {"index": index, "status": None, "warnings": [], "info": []})
            gpu["status"] = _worst([gpu["status"], status])  # iterations: the worst run counts
            gpu["warnings"] += [w for w in warnings if w not in gpu["warnings"]]
            gpu["info"] += [i for i in info if i not in gpu["info"]]
    summary = test.get("test_summary")
    if not statuses and isinstance(summary, dict):
        status, _ = _result_status(summary, problems, name)
        statuses.append(status)
    entry["status"] = _worst([entry["status"]] + statuses)


def _per_gpu(tests, serials):
    gpus = {}
    for test in tests:
        for result in test["gpus"]:
            gpu = gpus.setdefault(result["index"], {"index": result["index"], "serial": serials.get(result["index"]),
                                                    "status": None, "failed_tests": [], "warned_tests": [],
                                                    "passed_tests": [], "skipped_tests": []})
            bucket = {"fail": "failed_tests", "error": "failed_tests", "warn": "warned_tests",
                      "pass": "passed_tests", "skipped": "skipped_tests"}.get(result["status"])
            if bucket:
                gpu[bucket].append(test["name"])
    for gpu in gpus.values():
        # A skipped test does not spoil a GPU that passed the others; a GPU whose every test was skipped is unproven.
        if gpu["failed_tests"]:
            gpu["status"] = "fail"
        elif gpu["warned_tests"]:
            gpu["status"] = "warn"
        elif gpu["passed_tests"]:
            gpu["status"] = "pass"
        else:
            gpu["status"] = "skipped"
    return [gpus[k] for k in sorted(gpus)]


def level_run(parsed):
    """Highest diag level whose tests actually ran (not skipped); None when nothing ran."""
    ran = [t for t in parsed["tests"] if t["status"] in ("pass", "warn", "fail", "error")]
    if not ran:
        return None
    return max(TEST_LEVELS.get(t["key"], 1) for t in ran)


def _all_info(test):
    out = []
    for item in test["gpus"] + test["entities"]:
        out += item["info"] + [w["message"] for w in item["warnings"]]
    return out
