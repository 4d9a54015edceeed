# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Read a registered result from hostvars: strip Ansible's envelope, check the module's JSON Schema, classify.

A reader never guesses key names: a result whose keys or types do not match its module's schema is an error naming
the key (plugins/plugin_utils/schemas/<module>.json, versioned). States:
    ok           the module ran (its data validated); the judge decides
    skipped      Ansible skipped the task (a `when:`), or nothing ran (the module's not_run)
    failed       the task failed (invalid options, a crash, the stage's rescue): its message
    unreachable  the node dropped out during this task
    invalid      the data does not match the schema: the message names the key
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.packages import require
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.schema_inline import inline_refs

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"

# Keys Ansible adds to a registered result (task, async and retry bookkeeping): not the module's data.
ENVELOPE = frozenset((
    "changed", "failed", "skipped", "skip_reason", "false_condition", "msg", "invocation", "ansible_job_id",
    "finished", "started", "results_file", "stdout", "stdout_lines", "stderr", "stderr_lines", "attempts", "erased",
    "warnings", "deprecations", "unreachable", "module_stdout", "module_stderr", "exception", "rc", "ansible_facts",
    "_ansible_no_log", "_ansible_verbose_always", "_ansible_delegated_vars", "retries", "censored",
    "ansible_async_watchdog_pid", "pid", "waited_s", "polls",
))


@lru_cache(maxsize=None)
def _documents():
    """{$id: schema} of every result schema."""
    schemas = (json.loads(path.read_text()) for path in sorted(SCHEMA_DIR.glob("*.json")))
    return {schema["$id"]: schema for schema in schemas}


@lru_cache(maxsize=None)
def _registry():
    referencing = require("referencing")
    return referencing.Registry().with_resources(
        (uri, referencing.Resource.from_contents(schema)) for uri, schema in _documents().items())


@lru_cache(maxsize=None)
def validator(name):
    schema = json.loads((SCHEMA_DIR / ("%s.json" % name)).read_text())
    cls = require("jsonschema.validators", "jsonschema").validator_for(schema)
    # Refs inlined once (schema_inline.py: half of a large result's validation was their lookups); the registry
    # still resolves a recursive one.
    return cls(inline_refs(schema, _documents()), registry=_registry())


def schema_version(name):
    """The version in the schema's $id (.../results/<version>/<name>.json)."""
    return validator(name).schema["$id"].rsplit("/", 2)[-2]


def strip_envelope(result):
    return {k: v for k, v in result.items() if k not in ENVELOPE and not str(k).startswith("_ansible")}


def _where(error):
    path = "".join("[%r]" % p if isinstance(p, int) else ".%s" % p for p in error.absolute_path)
    return path.lstrip(".") or "(top level)"


def schema_errors(name, data):
    """Human messages for every mismatch (first 5), naming the key: '<key>: <what is wrong>'."""
    out = []
    for error in sorted(validator(name).iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))[:5]:
        if error.validator == "additionalProperties":
            extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
            out.append("%s: unexpected key(s) %s (not in schema %s v%s)" % (
                _where(error), ", ".join(map(str, extra)), name, schema_version(name)))
        else:
            out.append("%s: %s" % (_where(error), error.message[:200]))
    return out


def read_result(name, result):
    """(state, data, reason) for one registered result of module `name`."""
    if result is None:
        return "missing", None, "no result"
    if not isinstance(result, dict):
        return "invalid", None, "result is not a mapping: %r" % (result,)
    if result.get("unreachable"):
        return "unreachable", None, str(result.get("msg") or "host unreachable")
    data = strip_envelope(result)
    if result.get("skipped") and not data:
        if result.get("false_condition"):
            return "skipped", None, "when: %s" % result["false_condition"]
        return "skipped", None, str(result.get("skip_reason") or "skipped")
    if result.get("failed") and "verdict" not in data:
        return "failed", None, str(result.get("msg") or "task failed")
    errors = schema_errors(name, data)
    if errors:
        return "invalid", data, "; ".join(errors)
    if data.get("not_run"):
        return "skipped", data, str(data["not_run"])
    return "ok", data, ""


def mapping(value):
    """value when it is a mapping, else {}: a field of a result from the node may be anything."""
    return value if isinstance(value, dict) else {}


def _identity_snapshot(hv):
    """The host's identity snapshot (the burn-in's marks before the burn are its facts), or {}: an audit's snapshot
    reads what the host's facts hold after the run, never a mark."""
    snapshot = mapping(hv.get("gpufleet_result_health_snapshot"))
    return snapshot if snapshot.get("mode") == "identity" else {}


def xid_before(hv):
    """A host's XID read before the burn (xid_facts' gpufleet_xid), or None: the mark the identity snapshot reads in
    its round trip (the fact in its registered result), or, in runs before that, xid_facts' own registered read."""
    old = mapping(hv.get("gpufleet_xid_before"))
    if old:
        return mapping(old.get("ansible_facts")).get("gpufleet_xid")
    return mapping(_identity_snapshot(hv).get("ansible_facts")).get("gpufleet_xid")


def xid_after(hv, results):
    """A host's XID read after the burn (the window; a preflight's since the boot) as (gpufleet_xid or None, why it
    is missing or None): the host's fact, which the read sets (xid_facts' own task, or the burn's job that read it),
    unless the read failed: the fact is then still the mark before the burn, and an XID window that could not be read
    is not a window without XIDs."""
    registered = mapping(results.get("xid_facts"))
    if registered.get("failed") and mapping(registered.get("ansible_facts")).get("gpufleet_xid") is None:
        return None, str(registered.get("msg") or "the read failed without a message")
    return mapping(hv.get("ansible_facts")).get("gpufleet_xid"), None


def nvlink_before(hv):
    """A host's NVLink read before the burn as a registered result (its fact in ansible_facts.gpufleet_nvlink, or
    failed with the reason), or None: the mark the identity snapshot reads in its round trip, or, in runs before
    that, nvlink_facts' own registered read (gpufleet_nvlink_before)."""
    if "gpufleet_nvlink_before" in hv:
        return hv["gpufleet_nvlink_before"]
    snapshot = _identity_snapshot(hv)
    fact = mapping(snapshot.get("ansible_facts")).get("gpufleet_nvlink")
    if fact is not None:
        return {"ansible_facts": {"gpufleet_nvlink": fact}}
    part = mapping(mapping(snapshot.get("parts")).get("nvlink"))
    if part:  # the snapshot tried and got nothing: its budget was spent, or the read raised
        return {"failed": True, "msg": "the NVLink read before the burn: %s" % (
            part.get("error") or ("skipped, the snapshot's time budget was spent" if part.get("skipped") else
                                  "no fact returned"))}
    return None
