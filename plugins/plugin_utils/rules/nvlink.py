# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""nvlink_facts reads -> findings, the node's interconnect and per-GPU NVLink figures (judge: module_utils/judge_nvlink).

Two reads of the same facts: the one before the burn (the fabric manager, the links and their counters: the
identity snapshot's fact, or gpufleet_nvlink_before of older runs; reading.nvlink_before) and the one after it
(everything: gpufleet_result_nvlink_facts, or the burn job's part nvlink_after; its fact also holds the first read's
counters as its baseline). A run with
only one read (preflight, or a node that stopped early) is judged on that read, without the counters' rise (the read
before the burn on what it gathered: no fabric registration or topology). Each read is checked against
schemas/nvlink_facts.json first.
"""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_nvlink
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import nvlink_before, schema_errors

CHECK = "nvlink"
MODULE = "nvlink_facts"


def _fact(registered):
    if not isinstance(registered, dict):
        return None
    facts = registered.get("ansible_facts")
    return facts.get("gpufleet_nvlink") if isinstance(facts, dict) else None


def _valid(node, read, which):
    errors = schema_errors(MODULE, read)
    if errors:
        node.add("error", "RESULT_INVALID", "%s: the %s nvlink_facts read does not match its schema: %s" % (
            node.host, which, "; ".join(errors)), "report this as a kentino.gpufleet bug with report.json (node and "
            "controller run different versions?)", errors, check=CHECK)
        return False
    return True


def _registered_state(registered):
    """(state, reason) of a registered task result: ok, skipped (the stage's reason), failed or unreachable."""
    if not isinstance(registered, dict):
        return "missing", "no result"
    if registered.get("unreachable"):
        return "unreachable", str(registered.get("msg") or "host unreachable")
    if registered.get("skipped"):
        return "skipped", str(registered.get("skip_reason") or registered.get("false_condition") or "skipped")
    if registered.get("failed"):
        return "failed", str(registered.get("msg") or "task failed")
    return "ok", ""


def apply(node, hv, after_reg):
    """Judge the node's NVLink reads (nothing happens when the run took none); after_reg: the read after the burn (a
    preflight's only read) as its registered result (nvlink_facts' own task, or the burn's job), or None. Returns the
    node's interconnect (nvswitch, nvlink, pcie, mixed), None when not read."""
    before_reg = nvlink_before(hv)
    if before_reg is None and after_reg is None:
        return
    before, after = _fact(before_reg), _fact(after_reg)
    after_state, after_reason = _registered_state(after_reg)
    if before is None and after is None:
        state, reason = (after_state, after_reason) if after_reg is not None else _registered_state(before_reg)
        _state(node, "failed" if state == "ok" else state, reason or "the result holds no gpufleet_nvlink fact")
        return
    if after is None and after_state in ("failed", "unreachable"):
        node.add("error", "CHECK_ERROR", "%s: the NVLink read after the run failed: %s" % (node.host, after_reason),
                 "rerun; the read before the run is judged meanwhile (without the counters' rise)", [after_reason],
                 check=CHECK)
    if before is not None and not _valid(node, before, "first"):
        before = None
    if after is not None and not _valid(node, after, "second"):
        after = None
    read = after if after is not None else before
    if read is None:
        node.set_check(CHECK, "error", ["the NVLink reads do not match their schema"])
        return
    baseline = read.get("baseline") if read is after else None
    if after is not None and baseline is None and before is not None:
        baseline = before
    skip = judge_nvlink.not_applicable(read)
    if skip and after is None and after_state == "skipped":
        skip = after_reason
    findings = judge_nvlink.judge(read, node.t, node.host, baseline=baseline)
    figures = judge_nvlink.figures(read, node.t, baseline=baseline)
    _gpu_metrics(node, read, baseline)
    node.judged(CHECK, findings, figures, skip)
    return read.get("interconnect")


def _state(node, state, reason):
    if state == "skipped":
        node.set_check(CHECK, "skipped", ["not run: %s" % reason])
        node.not_run.add(CHECK)
    else:
        node.add("error", "CHECK_ERROR", "%s: the NVLink read could not run: %s" % (node.host, reason),
                 "make nvlink_facts runnable on %s (see the reason), then rerun; no result is not a pass" % node.host,
                 [reason], check=CHECK)
        node.set_check(CHECK, "error", [reason])


def _gpu_metrics(node, read, baseline):
    rises = {}
    for gpu, _link, rise in judge_nvlink.counter_rises(read, baseline):
        key = gpu.get("index")
        rises[key] = rises.get(key, 0) + sum(v for v in rise.values() if v)
    for gpu in read.get("gpus") or []:
        index = gpu.get("index")
        if index is None or node.gpu(index, gpu.get("pci")) is None:
            continue
        if gpu.get("nvlink_links_total") is not None or gpu.get("nvlink_all_inactive"):
            node.metric(index, "nvlink_links_up", gpu.get("nvlink_links_up"))
            node.metric(index, "nvlink_links_total", gpu.get("nvlink_links_total") or 0)
        if gpu.get("fabric_state") is not None:
            complete = gpu["fabric_state"] == "completed" and (gpu.get("fabric_status") or "").lower() == "success"
            node.metric(index, "nvlink_fabric_complete", 1 if complete else 0)
        if index in rises:
            node.metric(index, "nvlink_errors_rise", rises[index])
