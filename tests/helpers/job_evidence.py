"""job_evidence results built from the sim's job writer and the collection's own node-side parsers (no subprocess).

The log lines and dumps come from sim/gpufleet_sim/job.py (the same text `gpufleet-sim job` writes), parsed with
module_utils/torch_watchdog; kernel lines go through module_utils/kernel_log's XidScanner in `dmesg --time-format
iso` form. Tests then change one thing (a lost GPU, a missing node, a bad dump) and run the analysis.
"""

import base64
import copy
import datetime
import pickle
import sys
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import XidScanner
from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_watchdog import parse_torch_lines

SIM = Path(__file__).resolve().parents[2] / "sim"
if str(SIM) not in sys.path:
    sys.path.insert(0, str(SIM))
from gpufleet_sim import job as sim_job  # noqa: E402

BUSES = ["01", "21", "41", "61", "81", "a1", "c1", "e1"]
RISER_JOB = {"nodes": ["node01", "node02", "node03", "node04"], "nproc_per_node": 8, "timeout_ms": 600000,
             "stuck": {"rank": 21, "mode": "stop", "seq": 7753, "op": "ALLREDUCE", "numel": 4194304},
             "dumps": True, "history": 20}


def iso(epoch):
    dt = datetime.datetime.fromtimestamp(epoch, datetime.UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S,") + "%06d+00:00" % dt.microsecond


def xid_lines(T, gpu, at_s=-40.0, bus=None):
    bus = bus or BUSES[gpu]
    return ["%s NVRM: Xid (PCI:0000:%s:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
            % (iso(T + at_s), bus), "%s NVRM: GPU 0000:%s:00.0: GPU has fallen off the bus." % (iso(T + at_s), bus)]


def node_evidence(job, node_rank, T, kernel_lines=(), lost=(), dumps=True, log=True):
    """One node's job_evidence result. lost: GPU indices nvidia-smi reports lost."""
    host = job["nodes"][node_rank]
    nproc = job["nproc_per_node"]
    logs = []
    if log:
        parsed = parse_torch_lines(sim_job.log_lines(job, node_rank, T), reference=T + 60)
        logs.append({"source": "file", "path": "/srv/train/%s.log" % host, "unit": None, "bytes": 1, "mtime": T + 9,
                     "notes": [], "error": None, "parsed": parsed})
    out_dumps = []
    if dumps:
        for local in range(nproc):
            rank = node_rank * nproc + local
            data = pickle.dumps(sim_job.dump(job, rank, T), protocol=2)
            out_dumps.append({"path": "/var/tmp/gpufleet-nccl-dumps/nccl_trace_rank_%d" % rank, "rank": rank,
                              "bytes": len(data), "mtime": T + 1,
                              "data_b64": base64.b64encode(data).decode(), "skipped": None, "error": None})
    scanner = XidScanner(max_events=100)
    for line in kernel_lines:
        scanner.feed_line(line)
    facts = scanner.result()
    gpus = [{"index": i, "pci": "0000:%s:00" % BUSES[i], "uuid": "GPU-%s-%d" % (host, i), "name": "RTX 5090",
             "throttle_reasons": [], "lost": False} for i in range(8) if i not in lost]
    problems = [{"kind": "lost", "pci": "0000:%s:00" % BUSES[i], "message": "GPU is lost"} for i in lost]
    return {"host": host, "now": T + 30, "utc_offset_s": 0, "window": {}, "logs": logs, "dumps": out_dumps,
            "kernel": {"source": "dmesg", "error": None, "events": facts["events"], "lost_gpus": facts["lost_gpus"],
                       "gpu_ids": facts["gpu_ids"], "unparsed": facts["unparsed"]},
            "gpus": gpus, "gpu_problems": problems, "processes": [], "errors": [], "notes": []}


def fleet(job=None, T=1_765_000_000.0, faults=None, **per_node):
    """{host: evidence} of a whole job; faults: {node_rank: {"gpu": g, "at_s": s}} (a lost GPU with XID 79)."""
    job = copy.deepcopy(job or RISER_JOB)
    out = {}
    for node_rank, host in enumerate(job["nodes"]):
        fault = (faults or {}).get(node_rank)
        kernel = xid_lines(T, fault["gpu"], fault.get("at_s", -40.0)) if fault else []
        out[host] = node_evidence(job, node_rank, T, kernel, lost=[fault["gpu"]] if fault else [],
                                  **per_node.get(host, {}))
    return out
