# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The NCCL check (stdlib only: runs on the node): nccl_test's options, their checks and its run, here so that the
module and the job of another check (dcgm_diag's nccl_after: dcgmi diag and then NCCL in one job) run the same code.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_nccl
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import check_argument_spec, resolve_timeout
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import (
    LEASE_OPTIONS,
    THRESHOLD_OPTIONS,
    TOOL_DIRS,
    ToolCheck,
    given_thresholds,
    planned_tool,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.nccl_tests_output import parse_nccl_tests
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool, run_tool

# A message size as all_reduce_perf takes it (-b/-e), checked whole (no trailing newline slips through '$').
# The run guard and the fabric pair tests check the same variables with this pattern.
BYTE_COUNT = re.compile(r"\A[0-9]{1,12}[KMGkmg]?\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def visible_gpu_count(module, env):
    """(count, None) or (None, reason)."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in str(visible).split(",") if v.strip()]
        return (len(ids), None) if ids else (None, "CUDA_VISIBLE_DEVICES in env is empty: no GPU to test")
    smi = find_tool(module, "nvidia-smi", None, TOOL_DIRS)
    if smi is None:
        return None, "cannot count the GPUs: nvidia-smi not found; pass gpus_per_process= (and np= with mpirun)"
    result = run_tool([smi, "--query-gpu=index", "--format=csv,noheader"], 60)
    lines = [line for line in result.stdout.splitlines() if line.strip().isdigit()]
    if not result.ok or not lines:
        detail = result.error or ("timed out" if result.timed_out else (result.stderr or result.stdout).strip()[:200])
        return None, "cannot count the GPUs (nvidia-smi: %s); pass gpus_per_process= (and np= with mpirun)" % detail
    return len(lines), None


def build_argv(params, test_binary, gpus, np, mpirun):
    argv = [test_binary, "-b", params["min_bytes"], "-e", params["max_bytes"], "-f", str(params["step_factor"]),
            "-g", str(gpus)]
    if params["iterations"] is not None:
        argv += ["-n", str(params["iterations"])]
    argv += list(params["extra_args"])
    if params["launcher"] == "mpirun":
        prefix = [mpirun, "-np", str(np)]
        for name in sorted(params["env"]):
            prefix += ["-x", name]
        argv = prefix + list(params["launcher_args"]) + argv
    return argv


def thresholds(params):
    return {"gpufleet_nccl_min_busbw_gbps": params["min_busbw_gbps"],
            "gpufleet_nccl_min_busbw_fraction": params["min_busbw_fraction"],
            "gpufleet_nccl_reference_busbw_gbps": params["reference_busbw_gbps"] or {}}


def argument_spec():
    """nccl_test's options (a copy: AnsibleModule writes into what it is given)."""
    return check_argument_spec(
        min_bytes=dict(type="str", default="8"),
        max_bytes=dict(type="str", default="1G"),
        step_factor=dict(type="int", default=2),
        gpus_per_process=dict(type="int", aliases=["gpus"]),
        iterations=dict(type="int"),
        launcher=dict(type="str", default="none", choices=["none", "mpirun"]),
        launcher_args=dict(type="list", elements="str", default=[]),
        np=dict(type="int"),
        extra_args=dict(type="list", elements="str", default=[]),
        env=dict(type="dict", default={}),
        min_busbw_gbps=dict(type="float"),
        min_busbw_fraction=dict(type="float", default=0.7),
        reference_busbw_gbps=dict(type="dict", default={}),
        interconnect=dict(type="str", choices=["nvswitch", "nvlink", "pcie", "mixed"]),
        gpu_names=dict(type="list", elements="str", default=[]),
        **dict(LEASE_OPTIONS, **THRESHOLD_OPTIONS)
    )


def check_options(module):
    """Refuse bad options (fail_json) before anything runs; the thresholds the judge reads."""
    params = module.params
    for key in ("min_bytes", "max_bytes"):
        if not BYTE_COUNT.match(params[key]):
            module.fail_json(msg="%s must be a byte count with an optional K/M/G suffix (e.g. 8, 128M, 1G), got %r"
                                 % (key, params[key]))
    resolve_timeout(module, 600)
    for key in ("step_factor", "gpus_per_process", "iterations", "np"):
        if params[key] is not None and params[key] < 1:
            module.fail_json(msg="%s must be at least 1, got %s" % (key, params[key]))
    if not 0 < params["min_busbw_fraction"] <= 1:
        module.fail_json(msg="min_busbw_fraction must be in (0, 1], got %s" % params["min_busbw_fraction"])
    bad_env = [k for k in params["env"] if not _ENV_NAME.match(str(k))]
    if bad_env:
        module.fail_json(msg="env names must be shell-style variable names, got %r" % (bad_env,))
    return given_thresholds(module, thresholds(params))


def run(module, given):
    """Run all_reduce_perf as the options say and exit with the observations and the verdict of the thresholds
    check_options gave (ToolCheck.finish)."""
    params = module.params
    env = dict((str(k), str(v)) for k, v in params["env"].items())
    mpirun = params["launcher"] == "mpirun"
    check = ToolCheck(module, judge_nccl.judge, given)
    finish = check.finish
    test_binary, missing = check.find(("all_reduce_perf",))
    launcher, no_launcher = check.find(("mpirun",), "install Open MPI (openmpi-bin) or use launcher=none",
                                       option=None) if mpirun else (None, None)
    gpus, np = params["gpus_per_process"], params["np"]
    # Until the GPUs are counted, the planned argv says so instead of guessing a number.
    planned = build_argv(params, test_binary or params["executable"] or "all_reduce_perf",
                         gpus or ("1" if mpirun else "<all visible GPUs>"), np or "<all visible GPUs>",
                         launcher or "mpirun")
    if test_binary is None:
        finish({"tool": planned_tool(planned, error=missing)})
    if mpirun and launcher is None:
        finish({"tool": planned_tool(planned, error=no_launcher)})
    if module.check_mode:
        # Nothing runs in check mode, nvidia-smi included.
        finish({"tool": planned_tool(planned), "not_run": "check mode: nccl-tests not run"})
    if (gpus is None and not mpirun) or (np is None and mpirun):
        count, reason = visible_gpu_count(module, env)
        if count is None:
            finish({"tool": planned_tool(planned, error=reason)})
        gpus = gpus or (1 if mpirun else count)
        np = np or count
    argv = build_argv(params, test_binary, gpus, np, launcher)

    ran, observations = check.run(argv, params["timeout"], env=env)
    if not ran.error and not ran.timed_out:
        observations.update(parse_nccl_tests(ran.stdout + "\n" + ran.stderr))
    finish(observations, gpu_names=params["gpu_names"], topology=params["interconnect"])
