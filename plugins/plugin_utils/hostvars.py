# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Reading hostvars on the controller as plain data (the actions fleet_report, job_postmortem and run_guard, the
callback run_record): Ansible's lazy/tagged containers and unsafe strings become JSON types, and a value that does
not template becomes an error naming it instead of an exception that would lose the other hosts."""

from __future__ import annotations

from collections.abc import Mapping

PREFIX = "gpufleet_"  # only these variables feed the rules: reading every hostvar would template the whole inventory


def plain(value, depth=0):
    """Ansible's lazy/tagged containers and unsafe strings -> plain JSON types (the rules and the schemas need them)."""
    if depth > 40:
        return str(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, Mapping):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v, depth + 1) for v in value]
    return str(value)


def host_value(hostvars, host, name):
    """One variable of a host as plain data; None when unset; {"failed": True, "msg"} when it does not template."""
    try:
        hv = hostvars[host]
    except Exception:
        return None
    try:
        if name not in hv:
            return None
        return plain(hv[name])
    except Exception as exc:
        return {"failed": True, "msg": "could not read %s of %s: %s" % (name, host, exc)}


def read_host(hostvars, host):
    """The gpufleet_* variables and gpufleet_* facts of one host as plain data; unreadable values become errors."""
    try:
        hv = hostvars[host]
    except Exception:  # not in the inventory: reported as never reached
        return {}
    out = {}
    try:
        keys = list(hv.keys())
    except Exception:
        keys = []
    for key in keys:
        if not isinstance(key, str) or not (key.startswith(PREFIX) or key == "ansible_facts"):
            continue
        try:
            value = hv[key]
            if key == "ansible_facts":
                value = {k: v for k, v in value.items() if str(k).startswith(PREFIX)}
            out[key] = plain(value)
        except Exception as exc:  # a variable that does not template: keep the run going, show it on the node
            message = "could not read %s of %s: %s" % (key, host, exc)
            if key.startswith("gpufleet_result_"):
                out[key] = {"verdict": "error", "reasons": [message], "evidence": []}
            else:
                out.setdefault("gpufleet_result_report_input", {"verdict": "error", "reasons": [], "evidence": []})
                out["gpufleet_result_report_input"]["reasons"].append(message)
    return out
