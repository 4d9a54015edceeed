# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Reading hostvars on the controller as plain data (the actions fleet_report, job_postmortem and run_guard, the
callback run_record): Ansible's lazy/tagged containers and unsafe strings become JSON types, and a value that does
not template becomes an error naming it instead of an exception that would lose the other hosts."""

from __future__ import annotations

from collections.abc import Mapping

PREFIX = "gpufleet_"  # only these variables feed the rules: reading every hostvar would template the whole inventory

try:  # ansible-core >= 2.19: only strings trusted as templates (inventory, playbooks) are templated
    from ansible.template import is_trusted_as_template
except ImportError:  # older ansible-core: every value goes through the templar
    is_trusted_as_template = None


class _Templated(Exception):
    """The raw value holds something only the templar can read (a template, a lazy container, an unknown type)."""


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


def _plain_raw(value, depth=0):
    """A raw (untemplated) host variable as plain data, when templating could not change it: module results and
    facts are data, and the templar's walk through them (every nested value finalized) was most of the fleet
    report's time at 32 nodes (about 0.4 CPU-s per node). Raises _Templated otherwise."""
    if depth > 40:
        raise _Templated()
    if value is None or isinstance(value, (bool, int, float)):
        return plain(value)
    if isinstance(value, str):
        if is_trusted_as_template(value):
            raise _Templated()
        return str(value)
    if type(value).__module__.startswith("ansible._internal._templating"):  # a lazy container templates on read
        raise _Templated()
    if isinstance(value, dict):
        return {str(k): _plain_raw(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_raw(v, depth + 1) for v in value]
    raise _Templated()


class _Host:
    """One host's variables: read from HostVars.raw_get where that is possible (one variable lookup for the host),
    through the templated view hostvars[host] (made only when a value needs it) otherwise."""

    def __init__(self, hostvars, host):
        self.hostvars, self.host, self._templated = hostvars, host, None
        self.raw = None
        if is_trusted_as_template is not None and hasattr(hostvars, "raw_get"):
            try:
                raw = hostvars.raw_get(host)
            except Exception:
                raw = None
            self.raw = raw if isinstance(raw, Mapping) else None  # an unknown host: a Marker, read below as before
        if self.raw is None:
            self.templated()  # raises for a host that is not in the inventory

    def templated(self):
        if self._templated is None:
            self._templated = self.hostvars[self.host]
        return self._templated

    def keys(self):
        return list((self.raw if self.raw is not None else self.templated()).keys())

    def __contains__(self, name):
        return name in (self.raw if self.raw is not None else self.templated())

    def read(self, key):
        if self.raw is not None and key in self.raw:
            try:
                return _plain_raw(self.raw[key])
            except _Templated:
                pass
        return plain(self.templated()[key])


def host_value(hostvars, host, name):
    """One variable of a host as plain data; None when unset; {"failed": True, "msg"} when it does not template."""
    try:
        hv = _Host(hostvars, host)
    except Exception:
        return None
    try:
        if name not in hv:
            return None
        return hv.read(name)
    except Exception as exc:
        return {"failed": True, "msg": "could not read %s of %s: %s" % (name, host, exc)}


def read_host(hostvars, host):
    """The gpufleet_* variables and gpufleet_* facts of one host as plain data; unreadable values become errors."""
    try:
        hv = _Host(hostvars, host)
    except Exception:  # not in the inventory: reported as never reached
        return {}
    out = {}
    try:
        keys = hv.keys()
    except Exception:
        keys = []
    for key in keys:
        if not isinstance(key, str) or not (key.startswith(PREFIX) or key == "ansible_facts"):
            continue
        try:
            value = hv.read(key)
            if key == "ansible_facts":
                value = {k: v for k, v in value.items() if str(k).startswith(PREFIX)}
            out[key] = value
        except Exception as exc:  # a variable that does not template: keep the run going, show it on the node
            message = "could not read %s of %s: %s" % (key, host, exc)
            if key.startswith("gpufleet_result_"):
                out[key] = {"verdict": "error", "reasons": [message], "evidence": []}
            else:
                out.setdefault("gpufleet_result_report_input", {"verdict": "error", "reasons": [], "evidence": []})
                out["gpufleet_result_report_input"]["reasons"].append(message)
    return out
