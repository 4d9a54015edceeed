# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The controller's part of an RMA evidence bundle: the node's XID events, its GPUs' ECC and row-remap/page-retirement
readings and its lifecycle from the history, written into the bundle fetched from the node as history.json and
listed in its manifest (sha256), through the same functions the node side uses (module_utils/rma_evidence.py)."""

from __future__ import annotations

import json
import os

from ansible_collections.kentino.gpufleet.plugins.module_utils import rma_evidence
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History

READINGS = ("ts", "idx", "verdict", "ecc_corr_vol", "ecc_uncorr_vol", "ecc_corr_agg", "ecc_uncorr_agg", "retired_sbe",
            "retired_dbe", "retired_pending", "remap_corr", "remap_uncorr", "remap_pending", "remap_failure",
            "banks_low", "banks_none", "vbios", "inforom")


def node_evidence(history, host):
    """{host, gpus: [{uuid, serial, pci, name, readings}], xid_events, lifecycle} of one node."""
    gpus = []
    for gpu in history.gpus_of(host):
        rows = history.gpu_series(gpu["id"])
        gpus.append({"uuid": gpu["uuid"], "serial": gpu["serial"], "pci": gpu["pci"], "name": gpu["name"],
                     "readings": [{k: r.get(k) for k in READINGS} for r in rows]})
    events = [dict(r) for r in history.db.execute(
        "SELECT e.ts, e.pci, e.xid, e.severity, g.uuid FROM xid_events e JOIN hosts h ON h.id = e.host LEFT JOIN gpus "
        "g ON g.id = e.gpu WHERE h.name = ? ORDER BY e.ts", (host,))]
    return {"host": host, "gpus": gpus, "xid_events": events, "lifecycle": history.lifecycle_of(host)}


def add_history(bundle, history_path, host):
    """Write history.json into the bundle directory and list it in its manifest. Returns the manifest."""
    with History(history_path, readonly=True) as history:
        evidence = node_evidence(history, host)
    with open(os.path.join(bundle, rma_evidence.MANIFEST)) as fh:
        manifest = json.load(fh)
    entry = rma_evidence.write_text(bundle, "history.json", json.dumps(evidence, indent=1, sort_keys=True),
                                    manifest["max_bytes"] // 4, ["gpufleet history", host])
    manifest["files"] = [f for f in manifest["files"] if f["name"] != "history.json"] + [entry]
    return rma_evidence.write_manifest(bundle, manifest)
