# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""gpu_burn results -> findings, per-GPU Gflop/s and the Gflop/s-over-time chart (judge: module_utils/judge_gpu_burn)."""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_gpu_burn

MODULE = "gpu_burn"


def apply(node, data):
    # The GPUs the burn should have initialised: those nvidia-smi could read when it started (the module's map).
    expected = data.get("expected_gpus")
    findings = judge_gpu_burn.judge(data, node.t, node.host, expected_gpus=expected)
    per, series = judge_gpu_burn.figures(data)
    for fig in per:
        if fig["index"] is None:
            continue
        node.gpu(fig["index"], fig["pci"])
        for key in ("burn_gflops", "burn_gflops_max", "burn_errors", "burn_temperature_max_c"):
            node.metric(fig["index"], key, fig[key])
    if series:
        node.series["gflops"] = series
    node.judged(MODULE, findings, {"gpus": len(data.get("gpus") or []), "frames": data.get("frames")},
                data.get("not_run"), data)
