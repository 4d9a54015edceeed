#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: dcgm_diag
short_description: Run NVIDIA DCGM diagnostics (dcgmi diag) and judge every GPU
description:
  - Runs C(dcgmi diag -r LEVEL -j) through the collection's tool runner (own process group, killed on timeout),
    reads the JSON of DCGM 4.x, DCGM 3.x and C(--iterations) runs, and returns the tests with per-GPU results.
  - DCGM 4.x writes a warning as C(Fail); the warnings' C(error_severity) decides (monitor/config = warn).
  - A diag that could not run (host engine down, C(runtime_error), every test skipped, or a level 2+ run whose
    hardware tests were all skipped) is RV(verdict=error), never a pass.
  - A failing GPU is RV(verdict=fail) without failing the task. In check mode the diag is not run
    (RV(verdict=skipped)).
version_added: "0.1.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.check_common
  - kentino.gpufleet.lease
  - kentino.gpufleet.node_module.tool_check
attributes:
  check_mode:
    details: In check mode dcgmi is not run (nor nvidia-smi for O(level=auto)); the result is RV(verdict=skipped).
options:
  level:
    description:
      - Diagnostic level (C(-r)). V(1) takes seconds (software), V(2) about 2 minutes (+PCIe, memory), V(3) about
        15 minutes (+stress, power, bandwidth), V(4) one to two hours (+memtest, pulse test).
      - V(auto) runs level 1 when any GPU is a GeForce, Quadro, Titan or RTX workstation card (DCGM supports only
        level 1 there), else level 3. GPU names come from O(gpu_names) or one C(nvidia-smi --query-gpu=name) call.
    type: str
    choices: ["1", "2", "3", "4", "auto"]
    default: auto
  gpu_names:
    description: GPU names (as nvidia-smi prints them) used by O(level=auto) instead of calling nvidia-smi.
    type: list
    elements: str
  gpus:
    description: Indexes of the GPUs to test (C(-i)). Default all GPUs.
    type: list
    elements: int
  nccl_after:
    description:
      - After dcgmi diag, run M(kentino.gpufleet.nccl_test) with these options (any of its options; O(state_dir),
        O(run_id) and O(lease_timeout) are this module's unless given) in the same job. Its result comes back in
        RV(nccl_after) in nccl_test's result shape, whatever dcgmi's verdict. One job instead of a module round trip
        of its own and its polls, as the burn-in runs them.
      - Its options are checked before dcgmi runs; a bad one makes RV(nccl_after) C(failed) with the message, and
        dcgmi diag still runs.
      - Omit to run dcgmi diag only.
    type: dict
    version_added: "0.3.0"
requirements:
  - DCGM with its host engine running (C(nvidia-dcgm) service or C(nv-hostengine)).
notes:
  - O(executable) defaults to C(dcgmi) on E(PATH) or in C(/opt/gpufleet/bin).
  - O(timeout) defaults by level, V(1) 300, V(2) 900, V(3) 2700, V(4) 10800 seconds.
  - Levels 2 and above load the GPUs; do not run them on nodes with live jobs.
seealso:
  - module: kentino.gpufleet.gpu_facts
    description: Its C(gpufleet_gpus) fact gives the GPU names for O(gpu_names).
"""

EXAMPLES = r"""
- name: DCGM diag at the level the GPUs support (3 on data-centre GPUs, 1 on GeForce)
  kentino.gpufleet.dcgm_diag:
  register: gpufleet_result_dcgm_diag

- name: Level 2 on GPUs 0 and 1, names known from gpu_facts
  kentino.gpufleet.dcgm_diag:
    level: "2"
    gpus: [0, 1]
    gpu_names: "{{ ansible_facts['gpufleet_gpus'] | map(attribute='name') | list }}"
  register: gpufleet_result_dcgm_diag
"""

RETURN = r"""
nccl_after:
  description:
    - With O(nccl_after), M(kentino.gpufleet.nccl_test)'s result (observations, verdict), or C(failed) with C(msg)
      when it could not run. The fleet report judges it as a result registered as C(gpufleet_result_nccl_test).
  returned: when O(nccl_after) was given
  type: dict
verdict:
  description:
    - The node's own verdict, V(pass), V(warn), V(fail), V(error) or V(skipped), from this check's judge with the
      thresholds given as options. The fleet report judges the same observations again with the inventory's.
  returned: always
  type: str
  sample: fail
reasons:
  description: One line per finding, naming what is wrong, where (GPU, device, path, rank) and what to do.
  returned: always
  type: list
  elements: str
not_run:
  description: Why nothing ran (check mode, a precondition), else null.
  returned: always
  type: str
output_tail:
  description: The last lines the tool printed when it timed out (where it hung), else empty.
  returned: always
  type: list
  elements: str
evidence:
  description: DCGM's warning messages and error lines that justify the verdict.
  returned: always
  type: list
  elements: str
tool:
  description: How dcgmi ran (argv, rc, timed_out, duration_s, error).
  returned: always
  type: dict
level_requested:
  description: Level passed to C(-r) (after C(auto) was resolved).
  returned: always
  type: int
  sample: 3
level_reason:
  description: Why that level was chosen.
  returned: always
  type: str
level_run:
  description: Highest level whose tests actually ran (not skipped); null when nothing ran.
  returned: when dcgmi ran
  type: int
dcgm_version:
  description: DCGM version from the JSON metadata.
  returned: when dcgmi ran
  type: str
driver_version:
  description: Driver version DCGM detected.
  returned: when dcgmi ran
  type: str
tests:
  description:
    - Each test with its category, name, key (the name normalised, e.g. C(gpu_memory) -> C(memory)), status
      (pass, warn, fail, skipped, error) and per-GPU results
      C({index, status, warnings [{message, error_id, severity, category}], info}); results for other entities
      (CPU, NvSwitch, the node) are under C(entities).
  returned: when dcgmi ran
  type: list
  elements: dict
gpus:
  description: Per-GPU verdict C({index, serial, status, failed_tests, warned_tests, passed_tests, skipped_tests}).
  returned: when dcgmi ran
  type: list
  elements: dict
iterations:
  description: Number of iterations in an C(--iterations) document, else null.
  returned: when dcgmi ran
  type: int
messages:
  description: Error or warning lines dcgmi printed outside the JSON.
  returned: when dcgmi ran
  type: list
  elements: str
unparsed:
  description: Lines outside the JSON that matched nothing (count and up to 5 samples).
  returned: when dcgmi ran
  type: dict
problems:
  description: What the parser could not read (unknown statuses, truncated JSON).
  returned: when dcgmi ran
  type: list
  elements: dict
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_dcgm, nccl_check
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import check_argument_spec, resolve_timeout
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import (
    LEASE_OPTIONS,
    TOOL_DIRS,
    CheckExit,
    EmbeddedModule,
    ToolCheck,
    captured,
    embedded,
    planned_tool,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.dcgm_diag_json import level_run, parse_dcgm_diag
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool, run_tool

INSTALL_HINT = ("install DCGM (datacenter-gpu-manager-4-cuda<CUDA major>: the kentino.gpufleet.dcgm role), pass "
                "executable=, or switch the check off (gpufleet_dcgm_enabled, gpufleet_audit_dcgm_enabled: false)")
DEFAULT_TIMEOUTS = {1: 300, 2: 900, 3: 2700, 4: 10800}
# DCGM diag supports only level 1 on these product lines.
_CONSUMER = re.compile(r"geforce|quadro|titan|\brtx\b", re.I)


def choose_level(module, params):
    """(level, reason) or (None, error reason) when auto cannot decide."""
    if params["level"] != "auto":
        return int(params["level"]), "requested"
    names = params["gpu_names"]
    source = "gpu_names"
    if names is None:
        smi = find_tool(module, "nvidia-smi", None, TOOL_DIRS)
        if smi is None:
            return None, "level=auto needs the GPU names: nvidia-smi not found; pass level= or gpu_names="
        result = run_tool([smi, "--query-gpu=name", "--format=csv,noheader"], 60)
        if not result.ok:
            detail = result.error or ("timed out" if result.timed_out else (result.stderr or result.stdout).strip())
            return None, "level=auto could not read GPU names (nvidia-smi: %s); pass level= or gpu_names=" % detail
        names = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        source = "nvidia-smi"
        if params["gpus"]:
            names = [n for i, n in enumerate(names) if i in params["gpus"]]
    if not names:
        return None, "level=auto found no GPU names (%s); pass level= or gpu_names=" % source
    consumer = sorted(set(n for n in names if _CONSUMER.search(n)))
    if consumer:
        return 1, "auto: level 1 because DCGM supports only level 1 on %s (%s)" % (", ".join(consumer), source)
    return 3, "auto: level 3 for %s (%s)" % (", ".join(sorted(set(names))), source)


def argument_spec():
    return check_argument_spec(
        level=dict(type="str", default="auto", choices=["1", "2", "3", "4", "auto"]),
        gpu_names=dict(type="list", elements="str"),
        gpus=dict(type="list", elements="int"),
        nccl_after=dict(type="dict"),
        **LEASE_OPTIONS
    )


def run(module):
    """dcgmi diag as the options say; exits with the observations and the verdict (ToolCheck.finish)."""
    params = module.params
    check = ToolCheck(module, judge_dcgm.judge)
    finish = check.finish
    executable, missing = check.find(("dcgmi",), INSTALL_HINT)
    name = executable or params["executable"] or "dcgmi"
    if module.check_mode:
        # No nvidia-smi call either: check mode runs nothing on the GPUs.
        level = params["level"]
        argv = [name, "diag", "-r", level, "-j"] + (["-i", ",".join(map(str, params["gpus"]))] if params["gpus"] else [])
        finish({"tool": planned_tool(argv), "not_run": "check mode: dcgmi diag not run",
                "level_requested": None if level == "auto" else int(level), "level_reason": "check mode"})
    level, level_reason = choose_level(module, params)
    if level is None:
        finish({"tool": planned_tool([name, "diag"]), "level_requested": None, "level_reason": level_reason})
    argv = [name, "diag", "-r", str(level), "-j"]
    if params["gpus"]:
        argv += ["-i", ",".join(str(i) for i in params["gpus"])]
    common = dict(level_requested=level, level_reason=level_reason)
    if executable is None:
        finish(dict(tool=planned_tool(argv, error=missing), **common))

    timeout = resolve_timeout(module, DEFAULT_TIMEOUTS[level])
    ran, observations = check.run(argv, timeout)
    observations.update(common)
    if not ran.error and not ran.timed_out:
        parsed = parse_dcgm_diag(ran.stdout + "\n" + ran.stderr)
        observations.update(parsed)
        observations["level_run"] = level_run(parsed)
    finish(observations)


def nccl_after(module):
    """The NCCL check of O(nccl_after), its options checked before dcgmi runs: a call that gives NCCL's result
    (its run, or its failed result naming the bad option: a typo in NCCL's options must not cost the diag)."""
    nccl, error = embedded(module, "nccl_test", nccl_check.argument_spec(), module.params["nccl_after"])
    if nccl is None:
        return lambda: {"failed": True, "msg": "nccl_after: %s" % error}
    try:
        thresholds = nccl_check.check_options(nccl)
    except CheckExit as refused:
        refusal = dict(refused.result, msg="nccl_after: %s" % refused.result["msg"])
        return lambda: refusal
    return lambda: captured(nccl_check.run, nccl, thresholds)


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    params = module.params
    if params["gpus"] is not None and (not params["gpus"] or min(params["gpus"]) < 0):
        module.fail_json(msg="gpus must be a non-empty list of GPU indexes >= 0, got %r" % (params["gpus"],))
    if params["nccl_after"] is None:
        run(module)
    nccl_result = nccl_after(module)
    # dcgmi diag, then NCCL, in this one job: each its own result, whatever the other's.
    result = captured(run, EmbeddedModule(module, "dcgm_diag", params))
    result["nccl_after"] = nccl_result()
    if result.get("failed"):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
