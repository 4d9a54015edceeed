# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The collection's own one-step training script, shipped as a string (stdlib only here: runs on the node).

train_dryrun writes DRYRUN_SCRIPT to a temporary file and starts it with torchrun when the operator gives no
entrypoint of their own. It needs only torch in the interpreter torchrun uses. What it proves, per rank:
- the process group forms (nccl when CUDA is available, else gloo) across all local ranks;
- a model of the requested size fits, and one full forward/backward/optimizer step runs (DDP: the gradient
  all_reduce is the same traffic as real training);
- an explicit all_reduce of a known tensor returns the right value (a wrong sum means a broken transport);
- step time and CUDA memory allocated/peak, for spotting one slow or memory-starved GPU.
Each rank prints exactly one line `GPUFLEET_DRYRUN {json}` (the protocol train_dryrun parses; a user's own
entrypoint may print the same line to get per-rank figures), then exits 0, or non-zero when its checks fail.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

RESULT_MARKER = "GPUFLEET_DRYRUN "

DRYRUN_SCRIPT = r'''
"""kentino.gpufleet dry run: one training step on every local rank (written by kentino.gpufleet.train_dryrun)."""
import argparse
import datetime
import json
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

MARKER = "GPUFLEET_DRYRUN "


def emit(payload):
    sys.stdout.write(MARKER + json.dumps(payload, sort_keys=True) + "\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo"])
    parser.add_argument("--model-mb", type=float, default=64.0, help="fp32 parameter memory of the model, MiB")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--init-timeout-s", type=float, default=300.0)
    args = parser.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        device_name = torch.cuda.get_device_name(local_rank)
    else:
        device = torch.device("cpu")
        device_name = "cpu"
    report = {"rank": rank, "local_rank": local_rank, "world_size": world_size, "backend": backend,
              "device": str(device), "device_name": device_name, "host": socket.gethostname(),
              "torch_version": torch.__version__, "cuda_available": cuda, "ok": False, "errors": []}

    init_kwargs = {"backend": backend, "timeout": datetime.timedelta(seconds=args.init_timeout_s)}
    if backend == "nccl":
        init_kwargs["device_id"] = device
    try:
        dist.init_process_group(**init_kwargs)
    except TypeError:
        init_kwargs.pop("device_id", None)  # torch < 2.3 has no device_id
        dist.init_process_group(**init_kwargs)

    # Square Linear layers: params ~= layers * hidden^2 (+ bias), fp32 = 4 bytes each.
    layers = max(1, args.layers)
    hidden = max(8, int(math.sqrt(args.model_mb * 1024 * 1024 / 4.0 / layers)))
    torch.manual_seed(1234)  # same initial weights on every rank, as real training broadcasts them
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
    model = nn.Sequential(*blocks).to(device)
    params = sum(p.numel() for p in model.parameters())
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    inputs = torch.randn(args.batch_size, hidden, device=device)
    target = torch.randn(args.batch_size, hidden, device=device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)

    started = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(ddp(inputs), target)
    loss.backward()
    optimizer.step()
    if cuda:
        torch.cuda.synchronize(device)
    step_time = time.perf_counter() - started

    # Every rank contributes rank+1: the sum must be world*(world+1)/2 everywhere.
    probe = torch.full((1024,), float(rank + 1), device=device)
    t0 = time.perf_counter()
    dist.all_reduce(probe)
    if cuda:
        torch.cuda.synchronize(device)
    allreduce_time = time.perf_counter() - t0
    expected = world_size * (world_size + 1) / 2.0
    got_min, got_max = float(probe.min().item()), float(probe.max().item())
    allreduce_ok = got_min == expected and got_max == expected

    report.update({
        "params": params, "hidden": hidden, "layers": layers, "batch_size": args.batch_size,
        "model_mib": round(params * 4 / 1048576.0, 2),
        "step_time_s": round(step_time, 6), "allreduce_time_s": round(allreduce_time, 6),
        "loss": float(loss.item()), "allreduce_ok": allreduce_ok, "allreduce_expected": expected,
        "allreduce_min": got_min, "allreduce_max": got_max,
        "memory_allocated_mib": round(torch.cuda.memory_allocated(device) / 1048576.0, 2) if cuda else None,
        "memory_peak_mib": round(torch.cuda.max_memory_allocated(device) / 1048576.0, 2) if cuda else None,
    })
    if not allreduce_ok:
        report["errors"].append("all_reduce returned %s..%s, expected %s" % (got_min, got_max, expected))
    if not math.isfinite(report["loss"]):
        report["errors"].append("loss is not finite: %s" % report["loss"])
    report["ok"] = not report["errors"]
    emit(report)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if report["ok"] else 3


if __name__ == "__main__":
    sys.exit(main())
'''
