"""Flight-recorder dumps in the NCCL format, built from the schema (for tests and the benchmark).

The shape is what torch 2.13's FlightRecorder writes (version "2.10": the keys of FlightRecorder.hpp, one pickle
per rank, frames shared between entries so the pickle memoizes them) and what its analyzer
(torch/distributed/flight_recorder, fr_trace) requires. Older versions differ in optional keys: "2.4" here has no
pg_status, thread_name/thread_id or timeout_ms, so readers must derive each rank's status from the entry states.

A job: `world` ranks in the default process group (and optionally tensor-parallel groups of `tp` ranks), a history of
collectives all completed, then the stuck collective `seq`, in one of these modes:
  stop         rank `culprit` never enqueues `seq` (it stopped: hung GPU, dead process, stuck data loader)
  mismatch     rank `culprit` runs broadcast where every other rank runs all_reduce (a bug in the training code)
  not_started  every rank enqueued `seq`, but the culprit's GPU never started it
  healthy      nothing is stuck: every enqueued collective completed
  late         rank `culprit` enqueues `seq` `late_s` seconds after the others (it woke up after they timed out);
               with `completed`, every rank marked `seq` completed (gloo marks a collective that failed so)
"""

import os
import pickle

T0_NS = 1_733_480_000_000_000_000
FRAMES = [
    {"name": "all_reduce", "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
     "line": 2501},
    {"name": "wrapper", "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py",
     "line": 83},
    {"name": "reduce_gradients", "filename": "/srv/train/trainer.py", "line": 141},
    {"name": "train_step", "filename": "/srv/train/trainer.py", "line": 97},
    {"name": "main", "filename": "/srv/train/train.py", "line": 58},
]
BAD_FRAMES = [
    {"name": "broadcast", "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
     "line": 2310},
    {"name": "wrapper", "filename": "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py",
     "line": 83},
    {"name": "evaluate", "filename": "/srv/train/trainer.py", "line": 212},
    {"name": "main", "filename": "/srv/train/train.py", "line": 61},
]


def _entry(record_id, pg, seq, op, state, version, frames, numel=4096 * 1024, timeout_ms=600000, t_ns=None):
    entry = {
        "record_id": record_id, "pg_id": pg[2], "process_group": (pg[0], pg[1]),
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:" + op,
        "time_created_ns": t_ns if t_ns is not None else T0_NS + seq * 50_000_000,
        "input_sizes": [[numel]], "input_dtypes": ["BFloat16"], "output_sizes": [[numel]],
        "output_dtypes": ["BFloat16"], "state": state,
        "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
        "retired": state == "completed", "is_p2p": False, "frames": frames,
    }
    if version != "2.4":
        entry.update({"thread_name": "pt_main_thread", "thread_id": "139990000000000", "timeout_ms": timeout_ms})
    return entry


def job_dumps(world=8, culprit=5, seq=100, history=40, mode="stop", version="2.10", ahead=2, tp=0, late_s=0.0,
              completed=False):
    """{rank: dump dict} for one job (see the module doc)."""
    default = ("0", "default_pg", 0)
    dumps = {}
    for rank in range(world):
        entries, record = [], 0
        groups = [(default, list(range(world)))]
        if tp:
            base = rank - rank % tp
            groups.append((("1", "tp", 1), list(range(base, base + tp))))
        status = {}
        for pg, _members in groups:
            first = max(1, seq - history)
            last_done = seq - 1
            enq = seq + ahead
            started = seq
            if mode == "healthy":
                last_done, enq, started = seq, seq, seq
            elif rank == culprit and mode == "stop":
                enq, started = seq - 1, seq - 1
            elif mode == "late":
                enq, last_done = seq, seq if completed else seq - 1
            for s in range(first, enq + 1):
                op, frames = "all_reduce", FRAMES
                if s <= last_done:
                    state = "completed"
                elif s == seq:
                    state = "started"
                    if rank == culprit and mode == "mismatch" and pg[1] == "default_pg":
                        op, frames = "broadcast", BAD_FRAMES
                    if rank == culprit and mode == "not_started":
                        state = "scheduled"
                else:
                    state = "scheduled"
                t_ns = None
                if mode == "late" and rank == culprit and s == seq:
                    t_ns = T0_NS + s * 50_000_000 + int(late_s * 1e9)
                entries.append(_entry(record, pg, s, op, state, version, frames, t_ns=t_ns))
                record += 1
            status[str(pg[2])] = {"last_enqueued_collective": enq, "last_started_collective": started,
                                  "last_completed_collective": last_done}
        dump = {"version": version, "entries": entries,
                "pg_config": {pg[0]: {"name": pg[0], "desc": pg[1], "ranks": str(members)} for pg, members in groups}}
        if version != "2.4":
            dump["pg_status"] = status
            dump["comm_lib_version"] = "2.21.5"
        dumps[rank] = dump
    return dumps


def write_dumps(directory, dumps, prefix="nccl_trace_rank_"):
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for rank, dump in dumps.items():
        path = os.path.join(str(directory), "%s%d" % (prefix, rank))
        with open(path, "wb") as fh:
            pickle.dump(dump, fh, protocol=2)
        paths[rank] = path
    return paths
