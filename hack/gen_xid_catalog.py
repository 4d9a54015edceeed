#!/usr/bin/env python3
"""Generate plugins/module_utils/xid_catalog.py from data/xid_catalog.csv.

module_utils are shipped to the nodes as .py files only (no package data), so the catalog must be Python.
The generated file carries the snapshot name and the CSV's sha256; tests/unit/xid/test_xid_catalog.py fails when it
is out of date. Usage:  hack/gen_xid_catalog.py          (rewrite)
                        hack/gen_xid_catalog.py --check  (exit 1 when the generated file differs)

Default severity policy (critical / warning / info / unknown), first rule that matches wins:
  1. Explicit codes, from docs/failure-modes.md (the alerts that page) and the tools' policies in docs/signals.md:
     - critical: 48 63 64 79 (docs/failure-modes.md: page immediately), 74 95 119 120 140 (DCGM health watch FAIL),
       54 (aux power not connected: a power cable, the riser builds' classic), 171 172 (details of a 48),
       167 (PCIe fatal timeout), 168 (GPU memory capacity reduced), 169 (SEC2 halt, as 62).
     - warning: 13 31 32 43 94 (DCGM WARN; 13 and 31 also carry hardware causes in the legacy categories), 92 (a
       single-bit ECC error is contained and training goes on: the report's ECC_LEAK warns, the alert is a ticket,
       and only a rising rate pages, as the history's XID92_ACCELERATING fails),
       163 164 165 166 170 (power-smoothing wear, confidential-computing link faults: hardware, not urgent).
     - info: 45 (preemptive cleanup after another Xid; the parser raises a solo 45 to warning), 68 (NVDEC
       exception: application class for the device plugin), 162 (power smoothing re-engaged).
  2. NVIDIA's immediate-action bucket for every other code:
     RESTART_BM, RESET_GPU, RESTART_VM, CHECK_MECHANICALS, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR,
     WORKFLOW_NVLINK5_ERR -> critical (the GPU is unusable until someone acts; NVLink5 is refined per line:
     Fatal critical, Nonfatal warning);
     RESTART_APP -> warning when the legacy causes include HW, BUS, THERM or FB, else info (the GPU is fine);
     CONTACT_SUPPORT, UPDATE_SWFW, CHECK_UVM, XID_154 -> warning (154 is refined per line by the new recovery action);
     IGNORE -> info (never dropped: an operator still sees it).
  3. Anything else in the catalog -> warning; a code absent from the catalog -> unknown (never ignored).
"""

import argparse
import csv
import hashlib
import io
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CSV_PATH = REPO / "data" / "xid_catalog.csv"
OUT_PATH = REPO / "plugins" / "module_utils" / "xid_catalog.py"
SNAPSHOT = "2025-10"

EXPLICIT = {
    "critical": {
        48: "operators page at once: docs/failure-modes.md (double-bit ECC)",
        63: "operators page at once: docs/failure-modes.md (page retired / row remap pending)",
        64: "operators page at once: docs/failure-modes.md (retirement/remap failure, RMA class)",
        79: "operators page at once: docs/failure-modes.md (GPU fell off the bus)",
        74: "DCGM health watch: FAIL (NVLink)",
        95: "DCGM health watch: FAIL (uncontained memory error, reset needed)",
        119: "DCGM health watch: FAIL (GSP RPC timeout)",
        120: "DCGM health watch: FAIL (GSP error)",
        140: "DCGM health watch: FAIL (unrecovered ECC error)",
        54: "auxiliary power not connected: check the power cable (riser builds)",
        167: "PCIe fatal timeout",
        168: "GPU memory capacity reduced",
        169: "internal micro-controller halt (as Xid 62)",
        171: "detail of a double-bit ECC error (Xid 48)",
        172: "detail of a double-bit ECC error (Xid 48)",
    },
    "warning": {
        13: "DCGM/gcm: application class, but hardware causes are listed; repeated 13s on one GPU need a look",
        31: "DCGM health watch: WARN (GPU memory page fault)",
        32: "DCGM health watch: WARN (corrupted push buffer)",
        43: "DCGM health watch: WARN (GPU stopped processing)",
        94: "DCGM health watch: WARN (contained memory error: only the application died)",
        92: "contained single-bit ECC (the slow leak): a ticket; a rising rate pages (docs/failure-modes.md)",
        163: "power smoothing disengaged",
        164: "power smoothing circuitry low lifetime",
        165: "power smoothing circuitry lifetime exhausted",
        166: "NVLink traffic before encryption was configured",
        170: "NVLink interrupt in confidential-computing mode",
    },
    "info": {
        45: "preemptive cleanup after another Xid (a solo 45 is raised to warning by the parser)",
        68: "device plugin: application class (NVDEC exception)",
        162: "power smoothing re-engaged",
    },
}

BUCKETS = {
    "RESTART_BM": "critical",
    "RESET_GPU": "critical",
    "RESTART_VM": "critical",
    "CHECK_MECHANICALS": "critical",
    "WORKFLOW_XID_48": "critical",
    "WORKFLOW_NVLINK_ERR": "critical",
    "WORKFLOW_NVLINK5_ERR": "critical",
    "CONTACT_SUPPORT": "warning",
    "UPDATE_SWFW": "warning",
    "CHECK_UVM": "warning",
    "XID_154": "warning",
    "IGNORE": "info",
}
HARDWARE_CAUSES = {"HW", "BUS", "THERM", "FB"}


def severity_for(code, immediate, categories):
    """(severity, basis) of one catalog row, following the policy in the module docstring."""
    for severity, codes in EXPLICIT.items():
        if code in codes:
            return severity, codes[code]
    if immediate == "RESTART_APP":
        if HARDWARE_CAUSES & set(categories):
            return "warning", "bucket RESTART_APP with hardware causes (%s)" % ";".join(categories)
        return "info", "bucket RESTART_APP: the application died, the GPU is fine"
    if immediate in BUCKETS:
        return BUCKETS[immediate], "bucket " + immediate
    return "warning", "no NVIDIA resolution bucket in the catalog snapshot"


def load_rows(csv_bytes):
    rows = []
    for rec in csv.DictReader(io.StringIO(csv_bytes.decode("utf-8"))):
        code = int(rec["xid"])
        categories = [c for c in (rec.get("legacy_cause_categories") or "").split(";") if c]
        immediate = (rec.get("immediate_action") or "").strip() or None
        investigatory = (rec.get("investigatory_action") or "").strip() or None
        severity, basis = severity_for(code, immediate, categories)
        rows.append((code, rec["mnemonic"].strip(), rec["description"].strip(), immediate, investigatory,
                     tuple(categories), severity, basis))
    return rows


HEADER = '''# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
# GENERATED by hack/gen_xid_catalog.py from data/xid_catalog.csv: do not edit, regenerate.
"""NVIDIA XID catalog (snapshot %(snapshot)s) with the collection's default severity per code (stdlib only: runs on the node).

Severity policy: see hack/gen_xid_catalog.py (the codes that page and DCGM's health-watch codes first, then NVIDIA's immediate-action bucket).
Each entry: code -> (mnemonic, description, immediate_action, investigatory_action, legacy_cause_categories,
severity, severity_basis).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

SNAPSHOT = %(snapshot)r
SOURCE = "data/xid_catalog.csv"
SOURCE_SHA256 = %(sha)r
SEVERITIES = ("info", "warning", "unknown", "critical")  # ascending: an unknown code outranks a warning

CATALOG = {
'''

FOOTER = '''}


def lookup(code):
    """Catalog entry of one code as a dict; a code absent from the snapshot is severity "unknown", never ignored."""
    entry = CATALOG.get(code)
    if entry is None:
        return {
            "mnemonic": None,
            "description": "not in the XID catalog snapshot %s: look it up in NVIDIA's current catalog" % SNAPSHOT,
            "action": {"immediate": None, "investigatory": None},
            "categories": [],
            "severity": "unknown",
            "severity_basis": "code not in the catalog snapshot",
        }
    mnemonic, description, immediate, investigatory, categories, severity, basis = entry
    return {
        "mnemonic": mnemonic,
        "description": description,
        "action": {"immediate": immediate, "investigatory": investigatory},
        "categories": list(categories),
        "severity": severity,
        "severity_basis": basis,
    }
'''


def render(csv_bytes):
    out = [HEADER % {"snapshot": SNAPSHOT, "sha": hashlib.sha256(csv_bytes).hexdigest()}]
    for row in load_rows(csv_bytes):
        out.append("    %d: %r,\n" % (row[0], row[1:]))
    out.append(FOOTER)
    return "".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the generated file is out of date")
    args = parser.parse_args(argv)
    text = render(CSV_PATH.read_bytes())
    current = OUT_PATH.read_text() if OUT_PATH.exists() else ""
    if args.check:
        if current != text:
            print("%s is out of date with %s: run hack/gen_xid_catalog.py" % (OUT_PATH, CSV_PATH), file=sys.stderr)
            return 1
        return 0
    OUT_PATH.write_text(text)
    print("wrote %s" % OUT_PATH.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
