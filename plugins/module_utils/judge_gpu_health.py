# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge gpu_facts: GPUs nvidia-smi could not read, GPUs missing against the expected count, and the memory-health
counters that mean a card is at the end of its spare rows or pages (stdlib only).

NVIDIA's limits: pre-Ampere cards retire at most 64 pages (retired_pages_*); Ampere and later remap rows, at most 512
per framebuffer, and a remap failure means the spares are gone. Both end in an RMA (docs/failure-modes.md).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, gpu_label
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door

CHECK = "gpu_facts"
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads: what a module passes it.
THRESHOLDS = ("gpufleet_expected_gpus", "gpufleet_retired_pages_rma", "gpufleet_remapped_rows_rma")

CODES = {
    "GPU_FACTS_UNREADABLE": ("error", "nvidia-smi missing, failing, or printing what is not its output: the GPUs it "
                                      "could not read are unknown; what follows from it (GPUs missing from its table, "
                                      "a figure measured on the wrong GPU count) is its evidence, not a finding"),
    "GPU_MISSING": ("fail", "fewer GPUs than gpufleet_expected_gpus (or than NVIDIA GPUs on the PCI bus), not lost"),
    "RETIRED_PAGES_EXHAUSTED": ("fail", "retired pages >= gpufleet_retired_pages_rma (limit 64)"),
    "RETIRED_PAGES_PENDING": ("fail", "a page retirement waits for a reset"),
    "ROW_REMAP_FAILURE": ("fail", "a row remap failed: spare rows exhausted"),
    "REMAPPED_ROWS_EXHAUSTED": ("fail", "uncorrectable remapped rows >= gpufleet_remapped_rows_rma (limit 512)"),
    "ROW_REMAP_PENDING": ("fail", "a row remap waits for a reset"),
    "ECC_UNCORRECTED": ("fail", "uncorrectable ECC errors since boot"),
}
# Problem kinds that mean the GPUs could not be read (a lost GPU is judged with the XIDs).
UNREADABLE_KINDS = ("tool_missing", "tool_error", "parser_error", "unparsable_output", "driver_not_loaded")
# What nvidia-smi's failure says -> the fix, for the operator (the tool, never the hardware).
UNREADABLE_FIX = {
    "tool_missing": "install the NVIDIA driver (it ships nvidia-smi) or put nvidia-smi on PATH",
    "driver_not_loaded": "load the NVIDIA kernel module (modprobe nvidia; dmesg | grep NVRM says why it failed) or "
                         "reinstall the driver for the running kernel",
    "unparsable_output": "check which nvidia-smi runs (command -v nvidia-smi: a wrong binary or a wrapper on PATH) and "
                         "run it by hand; reinstall the driver if its own nvidia-smi prints this",
    "parser_error": "run nvidia-smi by hand and report its output with a kentino.gpufleet bug",
    "tool_error": "run nvidia-smi by hand: it fails (driver/kernel module mismatch after an update: reboot or "
                  "reinstall the driver)",
}


def unreadable_finding(problems, host):
    """One GPU_FACTS_UNREADABLE for every problem of a GPU table read that failed: the tool and its fix."""
    kinds = []
    for p in problems:
        if p.get("kind") not in kinds:
            kinds.append(p.get("kind"))
    first = problems[0]
    more = " (and %d more)" % (len(problems) - 1) if len(problems) > 1 else ""
    return finding("error", "GPU_FACTS_UNREADABLE", "%s: nvidia-smi could not be read (%s): %s%s; the GPUs it did not "
                   "read are unknown" % (host, ", ".join(kinds), first.get("message"), more),
                   "fix nvidia-smi on %s, not the GPUs: %s; then rerun (unreadable is not healthy)" % (
                       host, "; ".join(UNREADABLE_FIX.get(k, UNREADABLE_FIX["tool_error"]) for k in kinds)),
                   [p.get("line") or p.get("message") for p in problems])


def _counters(gpu, t, host):
    out = []
    index, pci = gpu.get("index"), gpu.get("pci")
    label = gpu_label(host, index, pci)
    rma = "replace the card (RMA): %s" % label
    pages = (gpu.get("retired_pages_sbe") or 0) + (gpu.get("retired_pages_dbe") or 0)
    ev = "retired_pages_sbe=%s retired_pages_dbe=%s retired_pages_pending=%s" % (
        gpu.get("retired_pages_sbe"), gpu.get("retired_pages_dbe"), gpu.get("retired_pages_pending"))
    if pages >= t["gpufleet_retired_pages_rma"]:
        out.append(finding("fail", "RETIRED_PAGES_EXHAUSTED", "%s has %d retired pages (limit 64, threshold %d)" % (
            label, pages, t["gpufleet_retired_pages_rma"]), rma, [ev], index, pci))
    elif gpu.get("retired_pages_pending") is True:
        out.append(finding("fail", "RETIRED_PAGES_PENDING", "%s has a page retirement pending" % label,
                           "reset the GPU to apply it; replace the card (RMA) if pages keep retiring", [ev], index,
                           pci))
    uncorr = gpu.get("remapped_rows_uncorrectable") or 0
    rev = "remapped_rows_uncorrectable=%s remapped_rows_pending=%s remapped_rows_failure=%s" % (
        gpu.get("remapped_rows_uncorrectable"), gpu.get("remapped_rows_pending"), gpu.get("remapped_rows_failure"))
    if gpu.get("remapped_rows_failure") is True:
        out.append(finding("fail", "ROW_REMAP_FAILURE", "%s reports a row-remap failure (spare rows exhausted)"
                           % label, rma, [rev], index, pci))
    elif uncorr >= t["gpufleet_remapped_rows_rma"]:
        out.append(finding("fail", "REMAPPED_ROWS_EXHAUSTED", "%s has %d uncorrectable remapped rows (limit 512)" % (
            label, uncorr), rma, [rev], index, pci))
    elif gpu.get("remapped_rows_pending") is True:
        out.append(finding("fail", "ROW_REMAP_PENDING", "%s has a row remap pending" % label,
                           "reset the GPU to apply the remap, rerun; replace the card (RMA) if remaps keep coming",
                           [rev], index, pci))
    dbe = gpu.get("ecc_volatile_uncorrected") or 0
    if dbe > 0:
        out.append(finding("fail", "ECC_UNCORRECTED", "%s has %d uncorrectable ECC errors since boot" % (label, dbe),
                           rma, ["ecc_volatile_uncorrected=%d" % dbe], index, pci))
    return out


def expected_count(facts, t):
    """(expected GPU count or None, where it came from)."""
    if t.get("gpufleet_expected_gpus") is not None:
        return t["gpufleet_expected_gpus"], "gpufleet_expected_gpus"
    on_bus = facts.get("gpufleet_pci_gpus") or []
    if on_bus:
        return len(on_bus), "NVIDIA GPUs on the PCI bus"
    return None, None


@judge_door(CHECK)
def judge(facts, t, host, lost_pcis=()):
    """[finding] for the gpufleet_* facts of gpu_facts. lost_pcis: GPUs already known lost (judged as GPU_LOST)."""
    out = []
    gpus = facts.get("gpufleet_gpus") or []
    unreadable = [p for p in facts.get("gpufleet_gpu_problems") or [] if p.get("kind") in UNREADABLE_KINDS]
    if unreadable:
        out.append(unreadable_finding(unreadable, host))
    for gpu in gpus:
        out.extend(_counters(gpu, t, host))
    expected, source = expected_count(facts, t)
    seen = set(g.get("pci") for g in gpus)
    lost = set(lost_pcis) - seen
    count = len(gpus)
    if expected is not None and count + len(lost) < expected:
        on_bus = [p for p in facts.get("gpufleet_pci_gpus") or [] if p not in seen and p not in lost]
        where = " (on the PCI bus but not in nvidia-smi: %s)" % ", ".join(on_bus) if on_bus else ""
        out.append(finding("fail", "GPU_MISSING", "%s shows %d GPU(s)%s, %d expected (%s)%s" % (
            host, count, " + %d lost" % len(lost) if lost else "", expected, source, where),
            "reseat the risers and recable GPU power of the missing GPUs on %s, check lspci, then rerun" % host,
            ["nvidia-smi GPUs: %s" % (", ".join("%s=%s" % (g.get("index"), g.get("pci")) for g in gpus) or "none")]))
    return out
