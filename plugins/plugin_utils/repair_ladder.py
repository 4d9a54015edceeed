# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The repair ladder, as data (controller side): the rungs in order, what each fixes and its source, and per finding
(code, or an XID) the rung the ladder starts at and the validation that follows every rung. playbooks/lifecycle.yml
and docs/lifecycle.md read these tables; nothing else decides where a repair starts.

A rung never runs on a node with a job (Slurm: module_utils/slurm.py) and is followed by its validation; the node
returns to service only when a validation passes. The last rung is rma: a person, with the evidence bundle.
"""

from __future__ import annotations

import re

# rung -> (what it does, what it fixes, source)
RUNGS = {
    "gpu_reset": ("nvidia-smi --gpu-reset -i <pci>, only when no process holds the GPU (the tool refuses a GPU in use: "
                  "exit 255, 'In use by another client')",
                  "a pending row remap or page retirement (applied at reset), an uncontained error that left the GPU "
                  "in a bad state (XID 95, 48 once)",
                  "NVIDIA XID catalog (RESET_GPU, WORKFLOW_XID_48); NVIDIA memory error recovery docs: row remapping "
                  "takes effect after a GPU reset"),
    "fabric_manager_restart": ("systemctl restart nvidia-fabricmanager (NVSwitch machines only)",
                               "a fabric that did not come up or lost its state (FABRIC_STATE_INCOMPLETE, NCCL over "
                               "NVLink not ready)",
                               "NVIDIA Fabric Manager user guide: the GPUs are usable only once FM has configured the "
                               "fabric"),
    "reboot": ("ansible.builtin.reboot", "a driver or GSP left wedged (XID 119/120), a PCIe link that trained down, "
                                          "a GPU that did not initialise",
               "NVIDIA XID catalog (RESTART_BM for GSP timeouts); PCIe links retrain at boot"),
    "bmc_power_cycle": ("a power cycle through the BMC (Redfish ComputerSystem.Reset ForceOff/On)",
                        "a GPU off the bus (XID 79) that a warm reboot does not bring back: a full power cycle "
                        "re-powers risers and retimers",
                        "NVIDIA XID catalog (XID 79: RESTART_BM, then CHECK_MECHANICALS); docs/failure-modes.md: on riser builds "
                        "XID 79 is mostly a riser or a power connector"),
    "rma": ("stop: the node stays drained and a person acts with the evidence bundle",
            "nothing here: a part to replace, reseat or recable",
            "XID catalog CONTACT_SUPPORT / WORKFLOW_XID_48 past the SRAM threshold; remap failure (XID 64) is RMA"),
}
ORDER = tuple(RUNGS)
# What proves a rung worked: the preflight, or the burn-in stages the finding calls for.
PREFLIGHT = {"playbook": "preflight", "stages": []}
BURN_GPU = {"playbook": "burn_in", "stages": ["gpu_facts", "xid_facts", "gpu_burn", "dcgm_diag"]}
BURN_FABRIC = {"playbook": "burn_in", "stages": ["gpu_facts", "nvlink", "nccl_test"]}
# finding code (or XID_<n>, more specific) -> (first rung, validation, why it starts there)
START = {
    "XID_79": ("bmc_power_cycle", PREFLIGHT, "a GPU off the bus is not reachable by a GPU reset, and behind a riser "
                                             "often not by a warm reboot either"),
    "GPU_LOST": ("bmc_power_cycle", PREFLIGHT, "the GPU is gone from the bus (XID 79 or 'fallen off the bus')"),
    "GPU_GROUP_LOST": ("rma", PREFLIGHT, "several GPUs at once: power delivery (PSU, rail, cable), a person"),
    "PSU_RAIL_LOSS": ("rma", PREFLIGHT, "a PSU or rail lost its GPUs: no software step fixes a power supply"),
    "ROW_REMAP_PENDING": ("gpu_reset", BURN_GPU, "a pending row remap is applied by a GPU reset"),
    "RETIRED_PAGES_PENDING": ("gpu_reset", BURN_GPU, "pending page retirements are applied at reset"),
    "XID_63": ("gpu_reset", BURN_GPU, "Ampere+: row marked for remap, applied at reset"),
    "XID_48": ("gpu_reset", BURN_GPU, "double-bit ECC: reset, then the burn-in decides (NVIDIA WORKFLOW_XID_48)"),
    "ECC_UNCORRECTED": ("gpu_reset", BURN_GPU, "uncorrected ECC: reset, then the burn-in decides"),
    "XID_95": ("gpu_reset", BURN_GPU, "uncontained memory error: a GPU reset is needed"),
    "XID_119": ("reboot", PREFLIGHT, "GSP timeout: the driver needs a reload"),
    "XID_120": ("reboot", PREFLIGHT, "GSP error: the driver needs a reload"),
    "XID_64": ("rma", BURN_GPU, "row remap failure: the card is out of spare rows"),
    "ROW_REMAP_FAILURE": ("rma", BURN_GPU, "row remap failure: the card is out of spare rows"),
    "REMAPPED_ROWS_EXHAUSTED": ("rma", BURN_GPU, "no spare rows left"),
    "RETIRED_PAGES_EXHAUSTED": ("rma", BURN_GPU, "no pages left to retire"),
    "XID_RMA": ("rma", BURN_GPU, "an XID the catalog sends to RMA"),
    "ECC_LEAK_ACCELERATING": ("rma", BURN_GPU, "a slow ECC leak that accelerates: replace before XID 48"),
    "XID92_ACCELERATING": ("rma", BURN_GPU, "a slow ECC leak that accelerates: replace before XID 48"),
    "THERMAL_SUSTAINED": ("rma", PREFLIGHT, "cooling (fans, airflow, paste): a person"),
    "FABRIC_MANAGER_STOPPED": ("fabric_manager_restart", BURN_FABRIC, "the fabric manager is not running"),
    "FABRIC_STATE_INCOMPLETE": ("fabric_manager_restart", BURN_FABRIC, "the fabric did not finish training"),
    "FABRIC_HEALTH_UNHEALTHY": ("fabric_manager_restart", BURN_FABRIC, "the fabric reports unhealthy"),
    "BURN_FABRIC_NOT_READY": ("fabric_manager_restart", BURN_FABRIC, "the fabric was not ready for the burn"),
    "NVLINK_LINK_DOWN": ("reboot", BURN_FABRIC, "a link down retrains at boot, else a person (NVIDIA WORKFLOW_NVLINK_ERR)"),
    "PCIE_DEGRADED": ("reboot", BURN_GPU, "a link that trained down retrains at boot; if not, a riser or slot"),
    "GPU_INIT_FAILED": ("reboot", PREFLIGHT, "the driver could not initialise the GPU"),
    "BURN_FAULTY": ("gpu_reset", BURN_GPU, "wrong results under load: reset, then the burn-in decides"),
    "DCGM_FAIL": ("gpu_reset", BURN_GPU, "a DCGM diagnostic failed: reset, then the burn-in decides"),
    "XID_CRITICAL": ("gpu_reset", BURN_GPU, "a critical XID: the GPU reset is the least step"),
}
DEFAULT_START = ("reboot", PREFLIGHT, "a finding without a ladder entry starts at a reboot")
XID_IN = re.compile(r"\bXid \([^)]*\): (\d+)")


def xid_of(evidence):
    """The XID code of a finding's evidence (the first NVRM Xid line), or None."""
    for line in evidence or []:
        found = XID_IN.search(str(line))
        if found:
            return int(found.group(1))
    return None


def start(code, xid=None):
    """(first rung, validation, why) of a finding: its XID's entry first, then its code's, then the default."""
    return START.get("XID_%s" % xid) if xid is not None and "XID_%s" % xid in START else START.get(code, DEFAULT_START)


def plan(code, xid=None, nvswitch=False):
    """The rungs a finding climbs, in order, from its first rung to rma (the fabric manager only on NVSwitch
    machines), each with what it does and fixes, its source and the validation after it."""
    first, validate, why = start(code, xid)
    rungs = [r for r in ORDER[ORDER.index(first):] if nvswitch or r != "fabric_manager_restart" or first == r]
    return [{"rung": r, "does": RUNGS[r][0], "fixes": RUNGS[r][1], "source": RUNGS[r][2], "validate": validate,
             "why": why if i == 0 else "the rung before did not fix it"} for i, r in enumerate(rungs)]


def next_rung(code, tried, xid=None, nvswitch=False):
    """The first rung of the plan not tried yet (rma when all were)."""
    return next((step for step in plan(code, xid, nvswitch) if step["rung"] not in tried), plan("XID_RMA")[-1])


# Burn-in stages -> the role's switches that run them (the stages not named are switched off).
STAGE_SWITCHES = {"gpu_burn": "gpufleet_burn_enabled", "dcgm_diag": "gpufleet_dcgm_enabled",
                  "nccl_test": "gpufleet_nccl_enabled", "nvlink": "gpufleet_nvlink_enabled"}


def validation_vars(validate):
    """The variables that run a rung's validation: the playbook, and for the burn-in its stages' switches."""
    out = {"playbook": validate["playbook"]}
    if validate["playbook"] == "burn_in":
        out.update({switch: stage in validate["stages"] for stage, switch in STAGE_SWITCHES.items()})
    return out


def knows(code, evidence=()):
    """Whether the ladder has an entry for a finding (its code, or the XID of its evidence)."""
    xid = xid_of(evidence)
    return code in START or (xid is not None and "XID_%s" % xid in START)


def quarantine_candidates(doc):
    """{host: {code, gpu, evidence, message}} of a fleet report's nodes whose verdict is fail with a failing finding
    the ladder knows (the node's worst finding first): what gpufleet_quarantine=critical quarantines. The verdict is
    the report's, never judged again here."""
    out = {}
    for node in doc.get("nodes") or []:
        if node.get("verdict") != "fail":
            continue
        findings = [f for f in ([node.get("worst")] + list(node.get("findings") or [])) if f]
        for f in findings:
            if f.get("severity") == "fail" and knows(f.get("code"), f.get("evidence")):
                gpu = f.get("gpu") if isinstance(f.get("gpu"), int) else f.get("pci")
                out[node["host"]] = {"code": f["code"], "gpu": None if gpu is None else str(gpu),
                                     "evidence": list(f.get("evidence") or [])[:20],
                                     "message": str(f.get("message") or "")[:200]}
                break
    return out
