# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""gpu_sample results (nvidia-smi under load) -> findings, per-GPU figures, the temperature chart
(judge: module_utils/judge_samples)."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_samples

MODULE = "gpu_sample"
COVERAGE = "sample_coverage"
_METRICS = {"max_temperature_c": "temperature_max_c", "seconds_above_limit_s": "seconds_above_temp_limit_s",
            "max_power_w": "power_max_w", "pcie_gen_under_load": "pcie_gen_under_load",
            "pcie_width_under_load": "pcie_width_under_load"}


def apply(node, data):
    findings = judge_samples.judge(data, node.t, node.host)
    per, series = judge_samples.figures(data, node.t)
    for fig in per:
        index = fig["index"] if fig["index"] is not None else node.index_of(fig["pci"])
        if index is None:
            continue
        node.gpu(index, fig["pci"])
        for key, name in _METRICS.items():
            node.metric(index, name, fig[key])
        if fig["ecc_corrected_first"] is not None:
            node.metric(index, "ecc_volatile_corrected_rise", fig["ecc_corrected_last"] - fig["ecc_corrected_first"])
    if series:
        node.series["temperature_c"] = series
        node.series["temperature_limit_c"] = node.t["gpufleet_temp_max_c"]
    taken = data.get("samples_total") if data.get("samples_thinned") else len(data.get("samples") or [])
    node.judged(MODULE, findings, {"samples": taken,
                                   "stopped_early": 1 if data.get("stopped_early") else 0}, data.get("not_run"), data)


def coverage(node, data, lost=()):
    """The samples beside a burn that did work: each GPU seen under load at least once (check sample_coverage, the
    report's own: the sampler cannot see the burn's result)."""
    node.judged(COVERAGE, judge_samples.coverage(data, node.t, node.host, lost))
