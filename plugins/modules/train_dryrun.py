#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: train_dryrun
short_description: Run one training step on every local GPU with torchrun and report each rank
description:
  - Starts C(torchrun --nnodes=1 --nproc-per-node=N --max-restarts=R) with the operator's own O(entrypoint) and
    O(args), or, without an entrypoint, the collection's shipped dry-run script. The shipped script forms the process
    group (nccl when CUDA is available, else gloo), builds a model of O(model_mb) MB, runs one full
    forward/backward/optimizer step of O(batch_size) under DDP, all_reduces a known tensor and checks the sum, and
    prints one C(GPUFLEET_DRYRUN {json}) line per rank with device, step time and CUDA memory allocated/peak.
  - An entrypoint of your own may print the same line to get per-rank figures; otherwise its exit status decides.
  - On failure the combined output is parsed for the PyTorch NCCL watchdog (timed-out collective, last
    enqueued/completed work per rank, the culprit rank, which is rarely the reporting one), the torchrun
    elastic summary (root cause rank, exit codes such as -6 SIGABRT), the failing rank's exception, and CUDA out
    of memory with the usual remedies (RV(remedies)).
  - A failing run is RV(verdict=fail) without failing the task. A run that cannot start (no torchrun, no
    entrypoint) or that exceeds O(timeout) is RV(verdict=error); on timeout torchrun and every worker are killed,
    and any process left carrying this run's marker is killed too. In check mode nothing runs
    (RV(verdict=skipped)).
  - Sets E(CUDA_DEVICE_ORDER=PCI_BUS_ID) (unless O(env) sets it) so local rank N uses the GPU nvidia-smi numbers N.
version_added: "0.1.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.check_common
  - kentino.gpufleet.thresholds
  - kentino.gpufleet.node_module.tool_check
attributes:
  check_mode:
    details: In check mode torchrun is not started; the result is RV(verdict=skipped).
options:
  entrypoint:
    description:
      - The training script to run on every rank. Default the collection's shipped dry-run script.
      - Give O(args) that make it stop after one step (for example C(--max-steps 1)); it runs until it exits.
    type: path
  args:
    description: Arguments passed to the entrypoint (ignored for the shipped script, see O(model_mb), O(batch_size)).
    type: list
    elements: str
    default: []
  nproc_per_node:
    description:
      - Processes (ranks) to start, an integer, or V(gpu) for one per GPU. V(gpu) counts the entries of
        E(CUDA_VISIBLE_DEVICES) when set (in O(env) or the environment), else the GPUs C(nvidia-smi -L) lists.
      - Without nvidia-smi, or when it lists none, V(gpu) means 1 (a CPU-only node runs one gloo rank). When
        nvidia-smi exists but fails, the GPU count is unknown and the verdict is RV(verdict=error).
    type: str
    default: gpu
  backend:
    description:
      - Process group backend of the shipped script; V(auto) is nccl when CUDA is available, else gloo.
      - For your own entrypoint it is only exported as E(GPUFLEET_DRYRUN_BACKEND).
    type: str
    choices: [auto, nccl, gloo]
    default: auto
  master_port:
    description:
      - Rendezvous port on 127.0.0.1 (C(--rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT)). Default
        C(--standalone), which picks a free port, so a job already listening on 29500 is not disturbed.
    type: int
  python:
    description:
      - Interpreter of the training environment; runs C(python -m torch.distributed.run) instead of torchrun.
      - When set, O(executable) is ignored.
    type: path
  env:
    description: Extra environment variables for torchrun and its workers (for example C(NCCL_DEBUG=WARN)).
    type: dict
    default: {}
  chdir:
    description: Working directory. Default the entrypoint's directory (the shipped script runs in its temp directory).
    type: path
  model_mb:
    description: Parameter memory of the shipped script's model in MB (fp32); raise it to exercise GPU memory.
    type: float
    default: 256
  batch_size:
    description: Batch size of the shipped script's single step.
    type: int
    default: 32
  max_restarts:
    description: torchrun C(--max-restarts); V(0) so that a failure shows up instead of being retried away.
    type: int
    default: 0
  slow_rank_factor:
    description: A rank whose step time exceeds this many times the median of the ranks gives RV(verdict=warn).
    type: float
    default: 2.0
notes:
  - O(executable) is C(torchrun); it defaults to C(torchrun) on E(PATH). It is ignored when O(python) is given.
  - O(timeout) defaults to 900 seconds; torchrun and every worker are then killed (RV(verdict=error)).
  - Needs PyTorch in the interpreter torchrun uses; the C(kentino.gpufleet.training_env) role provides it.
  - Uses every local GPU for a few seconds; do not run it next to a live job.
seealso:
  - module: kentino.gpufleet.training_env_facts
    description: Checks the NCCL/PyTorch variables a training job will see.
"""

EXAMPLES = r"""
- name: Dry run of the shipped one-step script on all GPUs
  kentino.gpufleet.train_dryrun:
    executable: /opt/train/venv/bin/torchrun
    model_mb: 1024
  register: gpufleet_result_train_dryrun

- name: Dry run of the customer's own entrypoint, one step, NCCL warnings on
  kentino.gpufleet.train_dryrun:
    python: /opt/train/venv/bin/python
    entrypoint: /srv/train/train.py
    args: ["--config", "configs/7b.yaml", "--max-steps", "1"]
    env:
      NCCL_DEBUG: WARN
      TORCH_NCCL_ASYNC_ERROR_HANDLING: "1"
    timeout: 1200
  register: gpufleet_result_train_dryrun
"""

RETURN = r"""
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
  description: Raw output lines that justify the verdict (result lines, watchdog lines, the elastic summary).
  returned: always
  type: list
  elements: str
tool:
  description: The torchrun run (argv, rc, timed_out, duration_s, error).
  returned: always
  type: dict
world_size:
  description: Number of ranks started.
  returned: always
  type: int
  sample: 8
script:
  description: V(shipped) or V(entrypoint).
  returned: always
  type: str
entrypoint:
  description: The script torchrun ran (a temporary file for the shipped script, removed afterwards).
  returned: always
  type: str
step_time_s:
  description: Slowest rank's step time in seconds (the pace of the whole job); null without per-rank results.
  returned: always
  type: float
ranks:
  description:
    - Per rank, from its GPUFLEET_DRYRUN line - rank, local_rank, device, device_name, backend, step_time_s,
      allreduce_time_s, allreduce_ok, loss, memory_allocated_mib, memory_peak_mib, model_mib, status, errors.
  returned: always
  type: list
  elements: dict
gpus:
  description: Per CUDA device used (index = local rank under PCI_BUS_ID order) - index, status, step_time_s, memory_peak_mib.
  returned: always
  type: list
  elements: dict
missing_ranks:
  description: Ranks that printed no result line (shipped script, or an entrypoint that prints them).
  returned: always
  type: list
  elements: int
watchdog:
  description:
    - Parsed failure evidence - timeouts, pg_status, culprit, culprit_rank, silent_ranks, terminate, elastic_summary,
      root_cause, agent_failures, exceptions (see plugins/module_utils/torch_watchdog.py).
  returned: always
  type: dict
oom:
  description: CUDA out-of-memory events (rank, gpu, tried_to_allocate_mib, free_mib, processes, neighbour_suspected).
  returned: always
  type: list
  elements: dict
remedies:
  description: What to do about an out-of-memory failure (see docs/failure-modes.md); empty otherwise.
  returned: always
  type: list
  elements: str
leftover_pids_killed:
  description: Processes of this run still alive after torchrun returned, killed by the module.
  returned: always
  type: list
  elements: int
notes:
  description: How O(nproc_per_node) was chosen and other context.
  returned: always
  type: list
  elements: str
"""

import json
import os
import re
import shutil
import signal
import tempfile
import time
import uuid

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_dryrun
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import check_argument_spec, resolve_timeout
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import (
    THRESHOLD_OPTIONS,
    exit_check,
    given_thresholds,
    node_name,
    planned_tool,
    tool_section,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.dryrun_script import DRYRUN_SCRIPT, RESULT_MARKER
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool, run_tool
from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_watchdog import parse_torch_log

MARKER_ENV = "GPUFLEET_DRYRUN_ID"
# torchrun gives its workers 30 s to exit after SIGTERM before SIGKILL: the group must get longer than that, or the
# workers outlive torchrun holding our output pipes.
TORCHRUN_GRACE_S = 45


def _count_gpus(module, env):
    """(count, note, problem): CUDA_VISIBLE_DEVICES first, else nvidia-smi -L."""
    visible = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None and str(visible).strip() not in ("", "all"):
        entries = [e for e in str(visible).split(",") if e.strip()]
        if entries and not str(visible).strip().startswith("-1"):
            return len(entries), "nproc_per_node=gpu: %d from CUDA_VISIBLE_DEVICES=%s" % (len(entries), visible), None
    smi = find_tool(module, "nvidia-smi")
    if not smi:
        return 1, "nproc_per_node=gpu: no nvidia-smi, running 1 rank (CPU/gloo)", None
    res = run_tool([smi, "-L"], 60)
    if not res.ok:
        text = (res.stdout + res.stderr).strip().splitlines()
        return None, None, ("nvidia-smi -L failed (rc %s%s): %s; GPU count unknown, run kentino.gpufleet.gpu_facts"
                            % (res.rc, ", timed out" if res.timed_out else "", (text or [res.error or ""])[0]))
    count = len([line for line in res.stdout.splitlines() if re.match(r"^GPU \d+:", line)])
    if count == 0:
        return 1, "nproc_per_node=gpu: nvidia-smi lists no GPU, running 1 rank (CPU/gloo)", None
    return count, "nproc_per_node=gpu: %d GPUs from nvidia-smi -L" % count, None


def _marked_pids(marker):
    """PIDs whose environment carries our marker (workers orphaned by a killed torchrun)."""
    needle = ("%s=%s" % (MARKER_ENV, marker)).encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    with open("/proc/%s/stat" % name, "r") as st:
                        state = st.read().rsplit(")", 1)[-1].split()[0]
                    if state != "Z":
                        pids.append(int(name))
        except (IOError, OSError, IndexError):
            continue
    return pids


def _sweep(marker):
    killed = []
    for pid in _marked_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    if killed:
        time.sleep(0.2)
    return killed


def _rank_payloads(text):
    """(JSON text, parsed object or None) for every marker in the output. Ranks share one pipe, and print() in an
    unbuffered Python writes the line and its newline apart: two ranks' lines can run together on one line."""
    decoder = json.JSONDecoder()
    for chunk in text.split(RESULT_MARKER)[1:]:
        try:
            data, _end = decoder.raw_decode(chunk)
        except ValueError:
            data = None
        yield RESULT_MARKER + chunk.split("\n", 1)[0], data


def _rank_results(text, unparsed):
    ranks = {}
    for line, data in _rank_payloads(text):
        try:
            rank = int(data["rank"])
        except (KeyError, TypeError, ValueError):
            unparsed.append(line[:300])
            continue
        errors = [str(e) for e in data.get("errors") or []]
        ok = bool(data.get("ok", not errors)) and data.get("allreduce_ok", True) is not False
        ranks[rank] = {
            "rank": rank,
            "local_rank": data.get("local_rank"),
            "device": data.get("device"),
            "device_name": data.get("device_name"),
            "backend": data.get("backend"),
            "world_size": data.get("world_size"),
            "step_time_s": data.get("step_time_s"),
            "allreduce_time_s": data.get("allreduce_time_s"),
            "allreduce_ok": data.get("allreduce_ok"),
            "loss": data.get("loss"),
            "memory_allocated_mib": data.get("memory_allocated_mib"),
            "memory_peak_mib": data.get("memory_peak_mib"),
            "model_mib": data.get("model_mib"),
            "torch_version": data.get("torch_version"),
            "status": "pass" if ok else "fail",
            "errors": errors,
            "line": line.strip()[:1000],
        }
    return [ranks[r] for r in sorted(ranks)]


def main():
    module = AnsibleModule(
        argument_spec=check_argument_spec(
            entrypoint=dict(type="path"),
            args=dict(type="list", elements="str", default=[]),
            nproc_per_node=dict(type="str", default="gpu"),
            backend=dict(type="str", choices=["auto", "nccl", "gloo"], default="auto"),
            master_port=dict(type="int"),
            python=dict(type="path"),
            env=dict(type="dict", default={}),
            chdir=dict(type="path"),
            model_mb=dict(type="float", default=256),
            batch_size=dict(type="int", default=32),
            max_restarts=dict(type="int", default=0),
            slow_rank_factor=dict(type="float", default=2.0),
            **THRESHOLD_OPTIONS
        ),
        supports_check_mode=True,
    )
    p = module.params
    nproc_opt = str(p["nproc_per_node"]).strip().lower()
    if nproc_opt != "gpu" and not (nproc_opt.isdigit() and int(nproc_opt) > 0):
        module.fail_json(msg="nproc_per_node must be a positive integer or 'gpu', got %r" % p["nproc_per_node"])
    if p["master_port"] is not None and not 0 < p["master_port"] < 65536:
        module.fail_json(msg="master_port must be 1-65535, got %s" % p["master_port"])
    resolve_timeout(module, 900)
    for name in ("batch_size",):
        if p[name] <= 0:
            module.fail_json(msg="%s must be > 0, got %s" % (name, p[name]))
    if p["max_restarts"] < 0 or p["model_mb"] <= 0:
        module.fail_json(msg="max_restarts must be >= 0 and model_mb > 0")

    user_env = dict((str(k), str(v)) for k, v in (p["env"] or {}).items())
    notes = []
    shipped = not p["entrypoint"]
    obs = {"world_size": None, "script": "shipped" if shipped else "entrypoint", "entrypoint": p["entrypoint"],
           "step_time_s": None, "ranks": [], "gpus": [], "missing_ranks": [], "watchdog": {}, "oom": [],
           "remedies": [], "leftover_pids_killed": [], "output_tail": [], "notes": notes}
    t = given_thresholds(module, {"gpufleet_dryrun_slow_rank_factor": p["slow_rank_factor"]})

    def finish(tool, not_run=None):
        obs["tool"] = tool
        obs["not_run"] = not_run
        exit_check(module, obs, judge_dryrun.judge(obs, t, node_name()))

    if nproc_opt == "gpu":
        nproc, note, problem = _count_gpus(module, user_env)
        if problem:
            finish(planned_tool([], error=problem))
        notes.append(note)
    else:
        nproc = int(nproc_opt)
    obs["world_size"] = nproc

    if p["python"]:
        launcher = [p["python"], "-m", "torch.distributed.run"]
        if not (os.path.isfile(p["python"]) and os.access(p["python"], os.X_OK)):
            finish(planned_tool(launcher, error="python %s not found or not executable: point python at the training "
                                                "venv's interpreter" % p["python"]))
    else:
        torchrun = find_tool(module, "torchrun", p["executable"])
        if not torchrun:
            finish(planned_tool([p["executable"] or "torchrun"], error=(
                "torchrun not found (%s): install PyTorch in the training environment (kentino.gpufleet.training_env)"
                " or set executable/python" % (p["executable"] or "PATH"))))
        launcher = [torchrun]

    # Relative paths are relative to where the module started, not to the run's working directory.
    if os.sep in launcher[0]:
        launcher[0] = os.path.abspath(launcher[0])
    rdzv = ["--standalone"] if p["master_port"] is None else \
        ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:%d" % p["master_port"]]
    argv = launcher + ["--nnodes=1", "--nproc-per-node=%d" % nproc, "--max-restarts=%d" % p["max_restarts"]] + rdzv
    workdir = None
    if shipped:
        entry_args = ["--backend", p["backend"], "--model-mb", str(p["model_mb"]),
                      "--batch-size", str(p["batch_size"]), "--init-timeout-s", str(max(30, p["timeout"] // 2))]
        planned = argv + ["<tmp>/gpufleet_dryrun.py"] + entry_args
    else:
        entry_args = list(p["args"])
        planned = argv + [p["entrypoint"]] + entry_args
        if not os.path.isfile(p["entrypoint"]):
            finish(planned_tool(planned, error="entrypoint %s does not exist on this node: deploy the training code "
                                               "or fix the path" % p["entrypoint"]))

    if module.check_mode:
        finish(planned_tool(planned), not_run="check mode: torchrun not started")

    marker = uuid.uuid4().hex
    # PYTHONFAULTHANDLER: a rank that aborts (SIGABRT, SIGSEGV) prints "Fatal Python error" and every thread's stack.
    env = {"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "GPUFLEET_DRYRUN_BACKEND": p["backend"],
           MARKER_ENV: marker}
    env.update(user_env)
    try:
        if shipped:
            workdir = tempfile.mkdtemp(prefix="gpufleet-dryrun-")
            entry = os.path.join(workdir, "gpufleet_dryrun.py")
            with open(entry, "w") as fh:
                fh.write(DRYRUN_SCRIPT)
            obs["entrypoint"] = entry
            cwd = p["chdir"] or workdir
        else:
            entry = os.path.abspath(p["entrypoint"])
            cwd = p["chdir"] or os.path.dirname(os.path.abspath(entry))
        res = run_tool(argv + [entry] + entry_args, p["timeout"], env=env, cwd=cwd, grace_s=TORCHRUN_GRACE_S)
    finally:
        obs["leftover_pids_killed"] = _sweep(marker)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    tool, _tail = tool_section(res)
    text = (res.stdout or "") + "\n" + (res.stderr or "")
    obs["output_tail"] = [line[:400] for line in text.strip().splitlines()[-30:]]

    unparsed = []
    ranks = _rank_results(res.stdout or "", unparsed)
    obs["ranks"] = ranks
    if unparsed:
        notes.append("%d result lines not readable, e.g. %s" % (len(unparsed), unparsed[0]))
    parsed = parse_torch_log(text, world_size=nproc)
    obs["watchdog"] = dict((k, parsed[k]) for k in (
        "timeouts", "pg_status", "culprit", "culprit_rank", "silent_ranks", "terminate", "elastic_summary",
        "root_cause", "agent_failures", "exceptions", "ranks_reporting", "evidence"))
    obs["oom"] = parsed["oom"]
    if parsed["oom"]:
        obs["remedies"] = list(judge_dryrun.OOM_REMEDIES)
    reported = set(r["rank"] for r in ranks)
    if (ranks or shipped) and not res.error:
        obs["missing_ranks"] = [r for r in range(nproc) if r not in reported]
    times = [r["step_time_s"] for r in ranks if isinstance(r["step_time_s"], (int, float))]
    obs["step_time_s"] = max(times) if times else None
    for r in ranks:
        if isinstance(r["device"], str) and r["device"].startswith("cuda"):
            obs["gpus"].append({"index": r["local_rank"], "rank": r["rank"], "device_name": r["device_name"],
                                "status": r["status"], "step_time_s": r["step_time_s"],
                                "memory_peak_mib": r["memory_peak_mib"]})
    for oom in parsed["oom"]:
        # CUDA's "GPU N" is the process's device N, i.e. the local rank's GPU under PCI_BUS_ID order.
        index = oom["gpu"] if oom["gpu"] is not None else None
        if index is not None and index not in [g["index"] for g in obs["gpus"]]:
            obs["gpus"].append({"index": index, "rank": oom["rank"], "device_name": None, "status": "fail",
                                "step_time_s": None, "memory_peak_mib": None, "finding": "out of memory"})
    if not ranks and not shipped:
        notes.append("the entrypoint printed no GPUFLEET_DRYRUN lines: judged by its exit status only")
    finish(tool)


if __name__ == "__main__":
    main()
