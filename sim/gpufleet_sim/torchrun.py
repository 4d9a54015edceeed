"""Stand-in for torchrun: never runs the script; prints what the collection's dry-run script prints per rank.

Each local rank emits one `GPUFLEET_DRYRUN {json}` line (the protocol of plugins/module_utils/dryrun_script.py, same
keys), in rank order. A rank whose GPU CUDA cannot see (lost, or hidden by CUDA_VISIBLE_DEVICES) fails the way torch
does (invalid device ordinal) and the elastic agent prints its ChildFailedError summary (exitcode 1); a rank whose
GPU lacks memory for the model (a neighbour process holds it) dies with CUDA out of memory. Options understood:
--nproc-per-node/--nproc_per_node, --nnodes, --node-rank, --standalone, --max-restarts, --rdzv-*, --master-*,
--tee, --log-dir, --redirects, -r; script options --model-mb, --layers, --batch-size, --backend.
"""

import json
import os
import sys
import time

from . import fabric
from .gpu_burn import cuda_devices

MARKER = "GPUFLEET_DRYRUN "


def _parse(argv):
    o = {"nproc": 1, "nnodes": "1", "node_rank": 0, "tee": None, "script": None, "script_args": []}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            o["script"] = arg
            o["script_args"] = argv[i + 1:]
            break
        key, eq, val = arg.partition("=")
        key = key.replace("_", "-")
        flag_only = key in ("--standalone", "--no-python", "--no-exit-barrier", "-m", "--module", "--run-path")
        if not eq and not flag_only:
            i += 1
            val = argv[i] if i < len(argv) else ""
        if key == "--nproc-per-node":
            o["nproc"] = int(val) if val.isdigit() else 8
        elif key == "--nnodes":
            o["nnodes"] = val
        elif key == "--node-rank":
            o["node_rank"] = int(val) if val.isdigit() else 0
        elif key in ("--tee", "-t"):
            o["tee"] = val
        i += 1
    return o


def _script_opts(args):
    opts = {"model_mb": 64.0, "layers": 4, "batch_size": 32, "backend": "auto"}
    i = 0
    while i < len(args):
        key, eq, val = args[i].partition("=")
        if not eq and i + 1 < len(args):
            val = args[i + 1]
            i += 1
        name = key.lstrip("-").replace("-", "_")
        if name in opts:
            try:
                opts[name] = type(opts[name])(val)
            except ValueError:
                pass
        i += 1
    return opts


def main(node, argv, out=sys.stdout, err=sys.stderr):
    o = _parse(argv)
    if not o["script"]:
        err.write("torchrun: error: the following arguments are required: training_script, training_script_args\n")
        return 2
    pid = os.getpid()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime())
    if o["nproc"] > 1:
        for line in ["", "*****************************************",
                     "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your "
                     "system being overloaded, please further tune the variable for optimal performance in your "
                     "application as needed. ", "*****************************************"]:
            err.write("W%s.000000 %d torch/distributed/run.py:793] %s\n" % (stamp, pid, line))
    devices = cuda_devices(node, node.lost())
    sopts = _script_opts(o["script_args"])
    world = o["nproc"] * (int(o["nnodes"].split(":")[-1]) if o["nnodes"].split(":")[-1].isdigit() else 1)
    backend = "nccl" if sopts["backend"] == "auto" else sopts["backend"]
    start = time.time()
    used = [g["index"] for g in devices[:o["nproc"]]]
    node.add_load(used, start, start + 60, "torchrun", process_name="/usr/bin/python3")
    try:
        time.sleep(min(3.0, max(0.05, 45 * node.scale)))  # process group start-up and one step, compressed
        failures = []
        reports = []
        base_step = float(node.scen["torchrun"].get("step_time_s", 0.0) or _step_time(node, sopts))
        for local in range(o["nproc"]):
            rank = o["node_rank"] * o["nproc"] + local
            if not fabric.ready(node):
                # NVSwitch node whose GPUs never registered with the fabric: CUDA initialisation fails (802).
                failures.append((rank, local, "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run "
                                 "some cuda functions before calling NumCudaDevices() that might have already set an "
                                 "error? Error 802: %s" % fabric.NOT_READY))
                continue
            if local >= len(devices):
                failures.append((rank, local, "RuntimeError: CUDA error: invalid device ordinal\nCUDA kernel errors "
                                 "might be asynchronously reported at some other API call, so the stacktrace below "
                                 "might be incorrect."))
                continue
            g = devices[local]
            free = g["memory_total_mib"] - g["memory_reserved_mib"] - sum(
                int(a.get("used_memory_mib", 0)) for a in node.scen["compute_apps"] if int(a["gpu"]) == g["index"])
            need = sopts["model_mb"] * 4 + 512  # params, grads, optimizer state, activations, CUDA context
            if need > free:
                failures.append((rank, local, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %.2f GiB. "
                                 "GPU %d has a total capacity of %.2f GiB of which %.2f GiB is free. Including "
                                 "non-PyTorch memory, this process has %.2f GiB memory in use."
                                 % (need / 1024.0, local, g["memory_total_mib"] / 1024.0,
                                    max(0, free) / 1024.0, 0.5)))
                continue
            step = base_step * (1.8 if any(int(a["gpu"]) == g["index"] for a in node.scen["compute_apps"]) else 1.0)
            step *= 1.0 + ((rank * 37) % 7) / 100.0
            hidden = max(8, int((sopts["model_mb"] * 1024 * 1024 / 4.0 / max(1, sopts["layers"])) ** 0.5))
            params = sopts["layers"] * (hidden * hidden + hidden)
            expected = world * (world + 1) / 2.0
            reports.append({
                "rank": rank, "local_rank": local, "world_size": world, "backend": backend,
                "device": "cuda:%d" % local, "device_name": g["name"], "host": node.hostname,
                "torch_version": "2.6.0+cu126", "cuda_available": True, "ok": True, "errors": [],
                "params": params, "hidden": hidden, "layers": sopts["layers"], "batch_size": sopts["batch_size"],
                "model_mib": round(params * 4 / 1048576.0, 2), "step_time_s": round(step, 6),
                "allreduce_time_s": round(0.00042 + 4096.0 / (node.model["busbw_gbps"] * 1e9), 6),
                "loss": 1.0342, "allreduce_ok": True, "allreduce_expected": expected,
                "allreduce_min": expected, "allreduce_max": expected,
                "memory_allocated_mib": round(params * 4 * 3 / 1048576.0, 2),
                "memory_peak_mib": round(params * 4 * 4 / 1048576.0 + 24, 2)})
        if failures:
            # One rank died: the others block in init_process_group and the agent tears them all down.
            return _agent_failure(node, o, failures, pid, out, err)
        for rep in reports:
            prefix = "[default%d]:" % rep["local_rank"] if o["tee"] else ""
            out.write(prefix + MARKER + json.dumps(rep, sort_keys=True) + "\n")
        out.flush()
        return 0
    finally:
        node.remove_load()


def _step_time(node, sopts):
    # One forward/backward/step of the model: time ~ FLOPs / achievable FLOP/s, floored by launch latency.
    flops = 6.0 * sopts["model_mb"] * 1024 * 1024 / 4.0 * sopts["batch_size"]
    return max(0.004, flops / (node.model["gflops"] * 1e9 * 0.35))


def _agent_failure(node, o, failures, pid, out, err):
    when = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime())
    for rank, _local, msg in failures:
        prefix = "[rank%d]: " % rank
        err.write("%sTraceback (most recent call last):\n%s  File \"%s\", line 79, in <module>\n%s    "
                  "sys.exit(main())\n" % (prefix, prefix, o["script"], prefix))
        for line in msg.split("\n"):
            err.write(prefix + line + "\n")
    rank, local, _msg = failures[0]
    err.write("E%s.000000 %d torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: "
              "%d (pid: %d) of binary: /usr/bin/python3\n" % (time.strftime("%m%d %H:%M:%S"), pid, local, pid + 1 + local))
    others = failures[1:]
    lines = ["Traceback (most recent call last):", "  File \"/usr/local/bin/torchrun\", line 8, in <module>",
             "    sys.exit(main())", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
             "=" * 60, "%s FAILED" % o["script"], "-" * 60, "Failures:"]
    if not others:
        lines.append("  <NO_OTHER_FAILURES>")
    for n, (r, lr, _m) in enumerate(others, 1):
        lines += ["[%d]:" % n, "  time      : %s" % when, "  host      : %s" % node.hostname,
                  "  rank      : %d (local_rank: %d)" % (r, lr), "  exitcode  : 1 (pid: %d)" % (pid + 1 + lr),
                  "  error_file: <N/A>", "  traceback : To enable traceback see: "
                  "https://pytorch.org/docs/stable/elastic/errors.html"]
    lines += ["-" * 60, "Root Cause (first observed failure):", "[0]:", "  time      : %s" % when,
              "  host      : %s" % node.hostname, "  rank      : %d (local_rank: %d)" % (rank, local),
              "  exitcode  : 1 (pid: %d)" % (pid + 1 + local), "  error_file: <N/A>",
              "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html", "=" * 60]
    err.write("\n".join(lines) + "\n")
    return 1
