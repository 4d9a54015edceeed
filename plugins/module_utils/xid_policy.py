# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The XID severity policy (stdlib only): the parser labels events with it on the node, the XID watcher labels its
metrics with it, and the fleet report recomputes it with the inventory's overrides. One function, one answer.

Order: the catalog's default for the code (xid_catalog.py, generated from NVIDIA's catalog; how each default was
chosen is documented in docs/xid.md), refined by what the line itself says (an NVLink5 error is Fatal or Nonfatal; an
XID 154 is as serious as the recovery action it asks for; an XID 45 that follows another XID on the same GPU is only
its consequence), then the site's overrides.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.xid_catalog import SEVERITIES, lookup

# A 154 is as serious as what the driver now asks for: nothing, draining P2P, or taking the GPU/node down.
RECOVERY_SEVERITY = {0: "info", 3: "warning"}
LOST_WITHOUT_XID = "GPU fell off the bus without an Xid line (counted as XID 79)"


def rank(severity):
    """info < warning < unknown < critical; anything else ranks as unknown (never below a warning)."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else SEVERITIES.index("unknown")


def severity(code, details=None, correlated_with=None, overrides=None, synthetic=False):
    """(severity, basis) of one XID event.

    details: the parser's decoding of the line (NVLink5 status, XID 154 recovery actions); correlated_with: the earlier
    Xid an XID 45 follows (None: a solo 45); synthetic: a lost GPU the driver reported without an Xid line (XID 79).
    overrides: {code (int or str): severity}, applied last.
    """
    details = details or {}
    info = lookup(code)
    level, basis = info["severity"], info["severity_basis"]
    if "nvlink" in details:
        fatal = details["nvlink"].get("fatal")
        level = "critical" if fatal else "warning"
        basis = "NVLink5 %s %s" % (details["nvlink"].get("unit"), "Fatal" if fatal else "Nonfatal")
    elif "recovery_action_to" in details:
        action = details["recovery_action_to"]
        level = RECOVERY_SEVERITY.get(action.get("code"), "critical")
        basis = "recovery action now %s" % action.get("name")
    elif code == 45:
        if correlated_with:
            level, basis = "info", "follows Xid %s on the same GPU" % correlated_with.get("xid")
        else:
            level, basis = "warning", "solo Xid 45: no earlier Xid on this GPU in the read"
    elif synthetic:
        basis = LOST_WITHOUT_XID
    overrides = overrides or {}
    if code in overrides or str(code) in overrides:
        level = overrides.get(code, overrides.get(str(code)))
        basis = "severity_overrides"
    return level, basis


def interrupts_job(code, severity):
    """Whether an XID interrupts a training job: the one definition of an interruption (docs/training.md) for the
    checkpoint plan of the report and `gpufleet plan`. It must be critical by the policy (with the site's overrides),
    and not contained: an XID whose catalog action is IGNORE is the driver recording what it handled while training
    goes on (XID 63's row remap record; XID 92's single-bit ECC is a warning already, docs/audit.md)."""
    return severity == "critical" and lookup(code)["action"]["immediate"] != "IGNORE"


def parse_overrides(mapping):
    """{code: severity} from an inventory, a module option or the watcher's configuration -> {int code: severity}.
    Raises ValueError naming the bad key or value."""
    out = {}
    for code, level in (mapping or {}).items():
        try:
            key = int(str(code).strip())
        except ValueError:
            raise ValueError("severity_overrides: key %r is not an XID code (an integer such as 63)" % (code,)) from None
        if level not in SEVERITIES:
            raise ValueError("severity_overrides: XID %s -> %r is not one of %s" % (code, level, ", ".join(SEVERITIES)))
        out[key] = level
    return out
