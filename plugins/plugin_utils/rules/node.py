# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""One node while it is judged: its GPU table (joined by PCI address), its findings, its checks' verdicts."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import gpu_label, lines, worst
from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci

MAX_SERIES_POINTS = 240


def downsample(points, limit=MAX_SERIES_POINTS):
    if len(points) <= limit:
        return points
    stride = len(points) / float(limit)
    return [points[int(i * stride)] for i in range(limit)]


class Node:
    def __init__(self, host, thresholds, sources):
        self.host = host
        self.t = thresholds
        self.sources = sources
        self.findings = []
        self.checks = {}
        self.gpus = {}  # index -> {index, pci, serial, name, uuid, metrics}
        self.pci_index = {}
        self.series = {}
        self.timeline = []
        # GPUs of nvidia-smi's table (indexes), and those known only from other results when that table could not be
        # read: their verdict is unknown (error), never pass.
        self.table_gpus = set()
        self.unknown_gpus = set()
        # Checks whose stage did not run (switched off, refused, check mode): not a pass (report.json's `skipped`);
        # a check that ran and found itself not applicable (no NVLink on a PCIe node) is not one of them.
        self.not_run = set()

    # GPUs are known by index (nvidia-smi's, PCI bus order) and joined to every other source by PCI address.
    def gpu(self, index=None, pci=None):
        pci = normalize_pci(pci) if pci else None
        if index is None and pci is not None:
            index = self.pci_index.get(pci)
        if index is None:
            return None
        gpu = self.gpus.get(index)
        if gpu is None:
            gpu = {"index": index, "pci": pci, "serial": None, "name": None, "uuid": None, "metrics": {}}
            self.gpus[index] = gpu
        if pci and not gpu.get("pci"):
            gpu["pci"] = pci
        if gpu.get("pci"):
            self.pci_index.setdefault(gpu["pci"], index)
        return gpu

    def index_of(self, pci):
        return self.pci_index.get(normalize_pci(pci)) if pci else None

    def label(self, index=None, pci=None):
        pci = normalize_pci(pci) if pci else None
        if index is None and pci:
            index = self.pci_index.get(pci)
        if index is not None and not pci:
            pci = (self.gpus.get(index) or {}).get("pci")
        return gpu_label(self.host, index, pci)

    def gpu_names(self):
        return [g["name"] for g in self.gpus.values() if g.get("name")]

    def metric(self, index, key, value):
        gpu = self.gpu(index)
        if gpu is not None and value is not None:
            gpu["metrics"][key] = value

    def add_findings(self, check, findings):
        for f in findings:
            self.add(f["severity"], f["code"], f["message"], f["action"], f.get("evidence"), gpu=f.get("gpu"),
                     pci=f.get("pci"), check=check)

    def add(self, severity, code, message, action, evidence=None, gpu=None, pci=None, check=None):
        pci = normalize_pci(pci) if pci else None
        if gpu is None and pci:
            gpu = self.pci_index.get(pci)
        if gpu is not None and pci is None:
            pci = (self.gpus.get(gpu) or {}).get("pci")
        finding = {"severity": severity, "code": code, "gpu": gpu, "pci": pci, "check": check,
                   "message": message, "action": action, "evidence": lines(evidence)}
        self.findings.append(finding)
        if gpu is not None:
            self.gpu(gpu, pci)
        return finding

    def set_check(self, name, verdict, reasons=None, figures=None):
        self.checks[name] = {"verdict": verdict, "reasons": lines(reasons), "figures": dict(figures or {})}

    def judged(self, name, findings, figures=None, not_run=None, data=None):
        """Record a judged check: its findings, and its verdict from them (never from the node's own verdict).
        data: the check's result, for the time its tool took."""
        self.add_findings(name, findings)
        figures = dict(figures or {})
        tool = (data or {}).get("tool") if isinstance(data, dict) else None
        if isinstance(tool, dict) and isinstance(tool.get("duration_s"), (int, float)):
            figures.setdefault("duration_s", tool["duration_s"])
        elif isinstance((data or {}).get("duration_s"), (int, float)):
            figures.setdefault("duration_s", data["duration_s"])
        verdict = worst((f["severity"] for f in findings), default="skipped" if not_run else "pass")
        reasons = [f["message"] for f in findings] or ([not_run] if not_run else [])
        self.set_check(name, verdict, reasons, figures)
