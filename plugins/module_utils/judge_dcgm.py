# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge a dcgm_diag result: per-GPU failures and warnings, and every way a diag "passes" without having run.

DCGM's traps, each a finding here: a diag that could not run says so only in runtime_error; a level 3 whose hardware
tests were all skipped is only a software check; DCGM 4.x writes a warning as "Fail" (error_severity tells them
apart, done by the parser); the exit code is the negative DCGM status as a byte (226 diag failure, 205 isolate).
Stdlib only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.dcgm_diag_json import (
    RC_DIAG_FAILURE,
    RC_ISOLATE,
    SEVERITY_NAMES,
    TEST_LEVELS,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, gpu_label
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import could_not_run, judge_door

CHECK = "dcgm_diag"
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads: what a module passes it.
THRESHOLDS = ()

CODES = {
    "DCGM_NOT_RUN": ("error", "the diag could not run or verified nothing: host engine down, runtime_error, every test "
                              "skipped, or no hardware test at the requested level"),
    "DCGM_FAIL": ("fail", "a GPU (or the node) failed a DCGM test; exit 226/205"),
    "DCGM_WARN": ("warn", "a GPU warned in a DCGM test (DCGM 4.x MONITOR/CONFIG severity)"),
    "DCGM_ERROR": ("error", "a GPU's test result could not be judged"),
}


def _messages(item):
    out = []
    for warning in item.get("warnings") or []:
        text = warning.get("message") or ""
        if warning.get("error_id") is not None:
            text += " (error_id %s" % warning["error_id"]
            if warning.get("severity") is not None:
                text += ", severity %s" % SEVERITY_NAMES.get(warning["severity"], warning["severity"])
            text += ")"
        out.append(text)
    return out


def _all_info(test):
    out = []
    for item in (test.get("gpus") or []) + (test.get("entities") or []):
        out += list(item.get("info") or []) + [w.get("message") or "" for w in item.get("warnings") or []]
    return out


def _not_verified(result, host):
    """[error finding] when the diag produced no usable verdict, else []."""
    rc = (result.get("tool") or {}).get("rc")
    action = "read the DCGM logs on %s (/var/log/nvidia-dcgm), fix what they name and rerun dcgmi diag" % host
    if result.get("level_requested") is None and result.get("level_reason"):
        return [finding("error", "DCGM_NOT_RUN", "%s: dcgmi diag not run: %s" % (host, result["level_reason"]),
                        "pass gpufleet_dcgm_level (1-4) or make nvidia-smi readable on %s" % host)]
    if result.get("hostengine_down"):
        return [finding("error", "DCGM_NOT_RUN", "%s: dcgmi cannot reach the DCGM host engine" % host,
                        "start nvidia-dcgm (nv-hostengine) on %s: systemctl enable --now nvidia-dcgm" % host,
                        result.get("messages"))]
    if result.get("format") is None:
        if result.get("messages"):
            return [finding("error", "DCGM_NOT_RUN", "%s: dcgmi diag failed (rc=%s): %s" % (
                host, rc, result["messages"][0]), action, result["messages"])]
        problems = result.get("problems") or []
        detail = "; " + problems[0]["message"] if problems else ""
        return [finding("error", "DCGM_NOT_RUN", "%s: dcgmi diag printed no JSON results (rc=%s)%s" % (
            host, rc, detail), action, (result.get("unparsed") or {}).get("samples"))]
    if result.get("runtime_error"):
        return [finding("error", "DCGM_NOT_RUN", "%s: DCGM diag could not run: %s" % (host, result["runtime_error"]),
                        action, [result["runtime_error"]])]
    tests = result.get("tests") or []
    if not tests:
        return [finding("error", "DCGM_NOT_RUN", "%s: DCGM diag JSON holds no test results: nothing was verified"
                        % host, action)]
    if all(t.get("status") in ("skipped", None) for t in tests):
        return [finding("error", "DCGM_NOT_RUN", "%s: DCGM diag skipped every test: nothing was verified" % host,
                        action, ["%s: %s" % (t.get("name"), "; ".join(_all_info(t))[:200]) for t in tests])]
    return []


@judge_door(CHECK)
def judge(result, t, host, pci_of=None):
    """[finding] for one dcgm_diag result (no thresholds: DCGM's own pass/warn/fail per test). pci_of: {GPU index:
    PCI address} to name the GPUs (DCGM numbers them as nvidia-smi does)."""
    out = could_not_run(result, CHECK, host)
    if out or result.get("not_run"):
        return out
    out = _not_verified(result, host)
    if out:
        return out
    tests = result["tests"]
    level = result.get("level_requested")
    if level and level >= 2:
        heavy = [x for x in tests if TEST_LEVELS.get(x.get("key"), 1) >= 2]
        if not any(x.get("status") in ("pass", "warn", "fail") for x in heavy):
            out.append(finding("error", "DCGM_NOT_RUN", "%s: dcgmi diag level %d requested but none of its hardware "
                               "tests ran (%s): only the software checks were verified" % (
                                   host, level, ", ".join("%s %s" % (x.get("name"), x.get("status")) for x in heavy)
                                   or "none in the output"),
                               "check this GPU model's DCGM support for level %d and the DCGM logs on %s" % (
                                   level, host)))
    per_gpu = {}
    for test in tests:
        for gpu in test.get("gpus") or []:
            if gpu.get("status") in ("fail", "warn", "error"):
                per_gpu.setdefault(gpu.get("index"), []).append((test, gpu))
        for entity in test.get("entities") or []:
            if entity.get("status") in ("fail", "warn", "error"):
                messages = _messages(entity)
                where = "%s %s" % (entity.get("entity_group"),
                                   ",".join(str(i) for i in entity.get("entity_ids") or []) or "(node)")
                out.append(finding(entity["status"], "DCGM_" + entity["status"].upper(), "%s: DCGM %s test %s on %s: "
                                   "%s" % (host, test.get("name"), entity["status"], where,
                                           "; ".join(messages) or "no detail"),
                                   "rerun dcgmi diag -r 3 on %s and act on the test it names" % host, messages))
    for index in sorted(per_gpu, key=lambda i: (i is None, i if isinstance(i, int) else 0)):
        items = per_gpu[index]
        status = "fail" if any(g["status"] == "fail" for _, g in items) else (
            "error" if any(g["status"] == "error" for _, g in items) else "warn")
        pci = (pci_of or {}).get(index)
        label = gpu_label(host, index, pci)
        messages = [m for _, g in items for m in _messages(g)]
        names = ", ".join(str(x.get("name") or x.get("key") or "?") for x, _ in items)
        action = {"fail": "rerun dcgmi diag -r 3 -i %s; if it fails again replace the card (RMA) with the DCGM log"
                          % index,
                  "warn": "watch %s: rerun dcgmi diag at the next maintenance" % label,
                  "error": "read the DCGM logs for %s and rerun" % label}[status]
        out.append(finding(status, "DCGM_" + status.upper(), "%s: dcgmi diag %s in %s%s" % (
            label, status, names, (": " + "; ".join(messages)) if messages else ""), action,
            messages or ["dcgm_diag GPU %s: %s in %s" % (index, status, names)], gpu=index, pci=pci))
    rc = (result.get("tool") or {}).get("rc")
    verdicts = [f["severity"] for f in out]
    if result.get("overall_result") == "fail" and "fail" not in verdicts:
        out.append(finding("fail", "DCGM_FAIL", "%s: DCGM diag iterations report an overall Fail" % host,
                           "rerun dcgmi diag -r 3 on %s and act on the test it names" % host))
    if rc == RC_ISOLATE:
        out.append(finding("fail", "DCGM_FAIL", "%s: dcgmi exited 205 (DCGM_ST_NVVS_ISOLATE_ERROR): DCGM says isolate "
                           "the GPU" % host, "drain %s and RMA the failing GPU" % host))
    elif rc == RC_DIAG_FAILURE and not verdicts:
        out.append(finding("fail", "DCGM_FAIL", "%s: dcgmi exited 226 (diag failure) although no test result failed"
                           % host, "rerun dcgmi diag -r 3 on %s and read the DCGM logs" % host))
    elif rc not in (0, None, RC_DIAG_FAILURE, RC_ISOLATE) and not verdicts:
        out.append(finding("error", "DCGM_NOT_RUN", "%s: dcgmi exited with rc=%s although its results pass" % (
            host, rc), "read the DCGM logs on %s and rerun" % host))
    return out
