"""`gpufleet-sim job JOB [--at EPOCH]`: what a hung PyTorch job left on this node, written after the fact.

A job file (sim/jobs/<name>.json, or a path) describes the whole job; every node runs the command and writes its own
part into <state>/job/: train.log (torchrun --tee output of its local ranks: the NCCL watchdog lines in the 2.5+
format with their glog times, the abort messages, the elastic agent's summary) and dumps/nccl_trace_rank_<rank>
(flight-recorder pickles in the 2.10 format torch 2.13 writes, frames shared between entries). The node's scenario
can carry job-time faults (`job.faults`, e.g. a GPU that falls off the bus 40 s before the timeout); they are fired
into the kernel log at T + at_s, exactly like burn-time events. T (--at, default now - 5 s) is when the watchdog
fires; the stuck collective started timeout_ms before it.

Job file keys: nodes (names in node-rank order), nproc_per_node, timeout_ms, stuck {rank, mode stop|mismatch, seq,
op, numel, bad_op, frame {name, filename, line}}, dumps (bool), history (entries per dump).
"""

import json
import os
import pickle
import time

from . import events

JOB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs")
_OPS = {"ALLREDUCE": "all_reduce", "BROADCAST": "broadcast", "ALLGATHER": "all_gather",
        "_REDUCE_SCATTER_BASE": "_reduce_scatter_base"}
_FRAMES = [
    {"name": "all_reduce", "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
     "line": 2501},
    {"name": "wrapper", "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py",
     "line": 83},
    {"name": "reduce_gradients", "filename": "/srv/train/trainer.py", "line": 141},
    {"name": "main", "filename": "/srv/train/train.py", "line": 58},
]


class JobError(Exception):
    pass


def load(spec):
    path = spec if (os.sep in spec or spec.endswith(".json")) else os.path.join(JOB_DIR, spec + ".json")
    try:
        with open(path) as fh:
            job = json.load(fh)
    except (OSError, ValueError) as exc:
        raise JobError("job file %s: %s" % (path, exc)) from None
    for key in ("nodes", "nproc_per_node", "stuck"):
        if key not in job:
            raise JobError("job file %s: missing %s" % (path, key))
    return job


def _glog(sev, when):
    t = time.localtime(when)
    return "%s%d%02d %02d:%02d:%02d.%09d" % (sev, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec,
                                              int((when % 1) * 1e9))


def _work(seq, op, numel, timeout_ms):
    return "WorkNCCL(SeqNum=%d, OpType=%s, NumelIn=%d, NumelOut=%d, Timeout(ms)=%d)" % (seq, op, numel, numel,
                                                                                      timeout_ms)


def log_lines(job, node_rank, T):
    """The node's train.log: its local ranks' output, then its elastic agent's failure summary."""
    nproc, stuck = int(job["nproc_per_node"]), job["stuck"]
    seq, timeout_ms = int(stuck.get("seq", 100)), int(job.get("timeout_ms", 600000))
    op, numel = stuck.get("op", "ALLREDUCE"), int(stuck.get("numel", 4194304))
    lines, failed = [], []
    for local in range(nproc):
        rank = node_rank * nproc + local
        tee = "[default%d]:" % local
        for step in range(3):
            lines.append("%s{'loss': %.4f, 'grad_norm': 0.48, 'learning_rate': 2e-05, 'epoch': %.2f}"
                         % (tee, 1.91 - step * 0.01, 0.4 + step * 0.01))
        if rank == stuck["rank"] and stuck.get("mode", "stop") == "stop":
            continue  # it stopped: it never reaches the collective, so its watchdog says nothing about it
        my_op = stuck.get("bad_op", "BROADCAST") if rank == stuck["rank"] else op
        when = T + 0.0007 * rank
        pre = "%s[rank%d]:[%s ProcessGroupNCCL.cpp:%%d] " % (tee, rank, _glog("E", when))
        lines.append(pre % 632 + "[Rank %d] Watchdog caught collective operation timeout: %s ran for %d milliseconds "
                     "before timing out." % (rank, _work(seq, my_op, numel, timeout_ms), timeout_ms + 11 + rank))
        lines.append(pre % 2168 + "[PG ID 0 PG GUID 0(default_pg) Rank %d]  failure detected by watchdog at work "
                     "sequence id: %d PG status: last enqueued work: %d, last completed work: %d"
                     % (rank, seq, seq + 1, seq - 1))
        lines.append("%sterminate called after throwing an instance of 'c10::DistBackendError'" % tee)
        lines.append("%s  what():  [PG ID 0 PG GUID 0(default_pg) Rank %d] Process group watchdog thread terminated "
                     "with exception: [Rank %d] Watchdog caught collective operation timeout: %s ran for %d "
                     "milliseconds before timing out." % (tee, rank, rank, _work(seq, my_op, numel, timeout_ms),
                                                          timeout_ms + 11 + rank))
        failed.append((rank, local))
    agent = T + 8.0
    stamp = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(agent))
    pid = 40000 + node_rank * 100
    if failed:
        first = failed[0]
        lines.append("%s %d torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: "
                     "%d (pid: %d) of binary: /opt/venv/bin/python" % (_glog("E", agent), pid, first[1],
                                                                       pid + 1 + first[1]))
        lines += ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60,
                  "train.py FAILED", "-" * 60, "Failures:"]
        for n, (rank, local) in enumerate(failed[1:], 1):
            lines += ["[%d]:" % n, "  time      : %s" % stamp, "  host      : %s" % job["nodes"][node_rank],
                      "  rank      : %d (local_rank: %d)" % (rank, local),
                      "  exitcode  : -6 (pid: %d)" % (pid + 1 + local), "  error_file: <N/A>",
                      "  traceback : Signal 6 (SIGABRT) received by PID %d" % (pid + 1 + local)]
        lines += ["-" * 60, "Root Cause (first observed failure):", "[0]:", "  time      : %s" % stamp,
                  "  host      : %s" % job["nodes"][node_rank], "  rank      : %d (local_rank: %d)" % first,
                  "  exitcode  : -6 (pid: %d)" % (pid + 1 + first[1]), "  error_file: <N/A>",
                  "  traceback : Signal 6 (SIGABRT) received by PID %d" % (pid + 1 + first[1]), "=" * 60]
    return lines


def dump(job, rank, T):
    """One rank's flight-recorder dump (format version 2.10), as torch writes it on a timeout."""
    stuck, world = job["stuck"], len(job["nodes"]) * int(job["nproc_per_node"])
    seq, timeout_ms = int(stuck.get("seq", 100)), int(job.get("timeout_ms", 600000))
    numel = int(stuck.get("numel", 4194304))
    start_ns = int((T - timeout_ms / 1000.0) * 1e9)
    stopped = rank == stuck["rank"] and stuck.get("mode", "stop") == "stop"
    last = seq - 1 if stopped else seq + 1
    entries = []
    first = max(1, seq - int(job.get("history", 40)))
    bad = dict(stuck.get("frame") or {"name": "evaluate", "filename": "/srv/train/trainer.py", "line": 212})
    bad_frames = _FRAMES[:2] + [bad, _FRAMES[-1]]
    for record, s in enumerate(range(first, last + 1)):
        op, frames = _OPS.get(stuck.get("op", "ALLREDUCE"), "all_reduce"), _FRAMES
        state = "completed" if s < seq else "started" if s == seq else "scheduled"
        if s == seq and rank == stuck["rank"] and stuck.get("mode") == "mismatch":
            op, frames = _OPS.get(stuck.get("bad_op", "BROADCAST"), "broadcast"), bad_frames
        entries.append({
            "record_id": record, "pg_id": 0, "process_group": ("0", "default_pg"), "thread_name": "pt_main_thread",
            "thread_id": "140000000000000", "collective_seq_id": s, "p2p_seq_id": 0, "op_id": s,
            "profiling_name": "nccl:" + op, "time_created_ns": start_ns - (seq - s) * 250000000,
            "input_sizes": [[numel]], "input_dtypes": ["BFloat16"], "output_sizes": [[numel]],
            "output_dtypes": ["BFloat16"], "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": state == "completed", "timeout_ms": timeout_ms,
            "is_p2p": False, "frames": frames})
    return {"version": "2.10", "comm_lib_version": "2.21.5",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
            "pg_status": {"0": {"last_enqueued_collective": last, "last_started_collective": min(last, seq),
                                "last_completed_collective": seq - 1}},
            "entries": entries}


def run(node, argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    try:
        job = load(argv[0])
    except JobError as exc:
        print("gpufleet-sim job: %s" % exc)
        return 2
    T = time.time() - 5.0
    out = node.path("job")
    args = argv[1:]
    while args:
        key = args.pop(0)
        value = args.pop(0) if args else None
        if key == "--at" and value is not None:
            T = float(value)
        elif key == "--out" and value is not None:
            out = value
    if node.hostname not in job["nodes"]:
        print("gpufleet-sim job: node %s is not in the job (%s)" % (node.hostname, ", ".join(job["nodes"])))
        return 2
    node_rank = job["nodes"].index(node.hostname)
    nproc = int(job["nproc_per_node"])
    for i, fault in enumerate((node.scen.get("job") or {}).get("faults") or []):
        targets = [int(g) for g in fault.get("gpus", [])]
        events.fire(node, "job:%d" % i, fault, targets, when=T + float(fault.get("at_s", -40)))
    os.makedirs(os.path.join(out, "dumps"), exist_ok=True)
    with open(os.path.join(out, "train.log"), "w") as fh:
        fh.write("\n".join(log_lines(job, node_rank, T)) + "\n")
    written = []
    if job.get("dumps", True):
        for local in range(nproc):
            rank = node_rank * nproc + local
            path = os.path.join(out, "dumps", "nccl_trace_rank_%d" % rank)
            with open(path, "wb") as fh:
                pickle.dump(dump(job, rank, T), fh, protocol=2)
            os.utime(path, (T + 1, T + 1))
            written.append(path)
    print(json.dumps({"node": node.hostname, "node_rank": node_rank, "T": T, "log": os.path.join(out, "train.log"),
                      "dumps": len(written)}, sort_keys=True))
    return 0
