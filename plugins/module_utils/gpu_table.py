# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The GPU table as gpu_facts returns it (stdlib only: runs on the node), shared by gpu_facts and health_snapshot.

One `nvidia-smi --query-gpu` (nvidia_smi_query.QueryGpu: field names per driver generation) for the per-GPU values,
`--query-compute-apps` for the processes on each GPU (joined by PCI address, else UUID) and `nvidia-smi -q` for what
the CSV interface lacks (the PCIe replay counter; values of fields this driver rejected, joined by bus id).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi import (
    COMPUTE_APPS_FIELDS,
    parse_compute_apps,
    parse_q,
    parse_tool_messages,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import (
    FACTS_SPEC,
    QueryGpu,
    gpu_problem,
    public_problems,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool

GPU_KEYS = (
    "index", "pci", "uuid", "serial", "name", "driver_version", "vbios", "temperature_c", "power_w", "power_limit_w",
    "memory_used_mib", "memory_total_mib", "pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max",
    "pcie_replays", "ecc_mode", "ecc_volatile_corrected", "ecc_volatile_uncorrected", "ecc_aggregate_corrected",
    "ecc_aggregate_uncorrected", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending",
    "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure",
    "throttle_reasons", "persistence_mode", "recovery_action", "processes",
)
MISSING_MESSAGE = "install the NVIDIA driver (nvidia-smi not found on PATH)"


def facts(gpus, driver_version, problems):
    """The gpufleet_* facts of the GPU table."""
    return {
        "gpufleet_gpus": gpus,
        "gpufleet_driver_version": driver_version,
        "gpufleet_gpu_count": len(gpus),
        "gpufleet_gpu_problems": problems,
    }


def _processes(executable, timeout, gpus, calls, problems, unparsed, runner):
    argv = [executable, "--query-compute-apps=" + ",".join(COMPUTE_APPS_FIELDS), "--format=csv,nounits"]
    result = runner(argv, timeout)
    calls.append(result.as_dict())
    if result.error is not None or result.timed_out:
        problems.append(gpu_problem("tool_error", "nvidia-smi --query-compute-apps %s"
                                    % (result.error or "timed out after %ss" % timeout)))
        return
    parsed = parse_compute_apps(result.stdout, COMPUTE_APPS_FIELDS)
    problems.extend(public_problems(parsed["problems"] + parse_tool_messages(result.stderr)["problems"]))
    unparsed["compute_apps"] = parsed["unparsed"]
    if result.rc != 0 and not parsed["processes"] and not parsed["problems"]:
        problems.append(gpu_problem("tool_error", "nvidia-smi --query-compute-apps exited %s: %s"
                                    % (result.rc, (result.stderr or result.stdout).strip()[:300])))
        return
    by_pci = {}
    by_uuid = {}
    for proc in parsed["processes"]:
        entry = {"pid": proc["pid"], "name": proc["name"], "used_memory_mib": proc["used_memory_mib"]}
        if proc["pci"]:
            by_pci.setdefault(proc["pci"], []).append(entry)
        elif proc["gpu_uuid"]:
            by_uuid.setdefault(proc["gpu_uuid"], []).append(entry)
    for gpu in gpus:
        gpu["processes"] = by_pci.get(gpu["pci"], []) + by_uuid.get(gpu["uuid"], [])


def _fill_from_q(executable, timeout, gpus, calls, problems, unparsed, runner):
    """pcie_replays, and any value the csv left null (field rejected by this driver), from the -q block of the same
    GPU (matched by bus id). Returns the driver version -q reports."""
    result = runner([executable, "-q"], timeout)
    calls.append(result.as_dict())
    if result.error is not None or result.timed_out:
        problems.append(gpu_problem("tool_error", "nvidia-smi -q %s" % (result.error or "timed out after %ss" % timeout)))
        return None
    parsed = parse_q(result.stdout)
    problems.extend(public_problems(parsed["problems"] + parse_tool_messages(result.stderr)["problems"]))
    unparsed["q"] = parsed["unparsed"]
    blocks = dict((block["pci"], block) for block in parsed["gpus"] if block["pci"])
    for gpu in gpus:
        block = blocks.get(gpu["pci"])
        if block is None:
            continue
        for key in GPU_KEYS:
            if gpu.get(key) is None and block.get(key) is not None:
                gpu[key] = block[key]
    return parsed["driver_version"]


def read_table(executable, timeout, include_processes=True, include_q=True, extra_spec=(), runner=run_tool):
    """(facts, evidence, rows) for the GPUs nvidia-smi can read. `extra_spec` adds fields to the same query (no
    extra call); `rows` are the query's rows with every key (GPU_KEYS and the extra ones), in GPU order. Never
    raises: what cannot be read is a gpufleet_gpu_problems entry."""
    evidence = {"calls": [], "rejected_fields": [], "unsupported_keys": [], "unparsed": {}}
    spec = tuple(FACTS_SPEC) + tuple(item for item in extra_spec if item[0] not in dict(FACTS_SPEC))
    query = QueryGpu(executable, spec, timeout, runner=runner)
    answer = query.run()
    evidence["calls"] = query.calls
    evidence["rejected_fields"] = list(query.rejected)
    evidence["unsupported_keys"] = query.unsupported_keys()
    evidence["unparsed"]["query_gpu"] = answer["unparsed"]
    problems = public_problems(answer["problems"])
    gpus = []
    for row in answer["gpus"]:
        gpu = dict((key, row.get(key)) for key in GPU_KEYS)
        gpu["processes"] = None
        gpus.append(gpu)
    driver_version = next((g["driver_version"] for g in gpus if g["driver_version"]), None)
    # No readable GPU: the other calls would only repeat the same error.
    if gpus and include_processes:
        _processes(executable, timeout, gpus, evidence["calls"], problems, evidence["unparsed"], runner)
    if gpus and include_q:
        q_driver = _fill_from_q(executable, timeout, gpus, evidence["calls"], problems, evidence["unparsed"], runner)
        driver_version = driver_version or q_driver
    return facts(gpus, driver_version, public_problems(problems)), evidence, answer["gpus"]
