"""gpufleet-sim job: a node's part of a hung job (log, dumps) and its job-time faults, in the real formats."""

import json
import pickle
import re
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_watchdog import parse_torch_log
from simlib import BIN, SIM


def run_job(sim, node, scenario, job="rank21_riser", at=None):
    at = time.time() - 10 if at is None else at
    return sim.run(scenario, "gpufleet-sim", "job", job, "--at", "%.6f" % at, node=node), at


def test_node03_of_the_riser_job(sim):
    proc, at = run_job(sim, "node03", "riser_xid79_gpu5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert (out["node_rank"], out["dumps"]) == (2, 8)
    state = sim.state("node03")
    log = (state / "job" / "train.log").read_text()
    parsed = parse_torch_log(log, reference=at + 60)
    assert sorted({t["rank"] for t in parsed["timeouts"]}) == [16, 17, 18, 19, 20, 22, 23]  # 21 stopped
    assert parsed["local_ranks"][22] == 6 and abs(parsed["time_first"] - (at + 0.0007 * 16)) < 0.001
    assert parsed["elastic_summary"]["root_cause"]["host"] == "node03"
    dump21 = pickle.loads((state / "job" / "dumps" / "nccl_trace_rank_21").read_bytes())
    dump20 = pickle.loads((state / "job" / "dumps" / "nccl_trace_rank_20").read_bytes())
    assert dump21["pg_status"]["0"]["last_enqueued_collective"] == 7752
    assert dump20["pg_status"]["0"]["last_enqueued_collective"] == 7754 and dump20["version"] == "2.10"
    assert dump20["pg_config"]["0"]["ranks"] == str(list(range(32)))
    # The fault: XID 79 for GPU 5 (bus a1) at T-40 s in the kernel log, and nvidia-smi reports it lost.
    journal = [json.loads(line) for line in sim.run("riser_xid79_gpu5", "journalctl", "-k", "-o", "json",
                                                    node="node03").stdout.splitlines()]
    xid = [r for r in journal if isinstance(r["MESSAGE"], str) and "Xid (PCI:0000:a1:00): 79" in r["MESSAGE"]]
    assert len(xid) == 1 and abs(int(xid[0]["__REALTIME_TIMESTAMP"]) / 1e6 - (at - 40)) < 0.01
    smi = sim.run("riser_xid79_gpu5", "nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader",
                  node="node03")
    assert "GPU 0000:A1:00.0: GPU is lost" in smi.stdout.splitlines()[5]
    # A second run does not fire the fault again.
    run_job(sim, "node03", "riser_xid79_gpu5", at=at)
    again = sim.run("riser_xid79_gpu5", "journalctl", "-k", "-o", "json", node="node03").stdout
    assert again.count("Xid (PCI:0000:a1:00): 79") == 1


def test_mismatch_job_culprit_runs_broadcast(sim):
    proc, at = run_job(sim, "node01", "healthy_rtx5090", job="mismatch_rank3")
    assert proc.returncode == 0
    log = (sim.state("node01") / "job" / "train.log").read_text()
    assert re.search(r"\[rank3\]:.*OpType=BROADCAST", log) and not re.search(r"\[rank2\]:.*OpType=BROADCAST", log)
    dump = pickle.loads((sim.state("node01") / "job" / "dumps" / "nccl_trace_rank_3").read_bytes())
    stuck = [e for e in dump["entries"] if e["collective_seq_id"] == 412][0]
    assert stuck["profiling_name"] == "nccl:broadcast" and stuck["frames"][2]["name"] == "evaluate"


def test_a_node_outside_the_job_and_a_missing_job_file(sim):
    proc, _ = run_job(sim, "node09", "healthy_rtx5090")
    assert proc.returncode == 2 and "not in the job" in proc.stdout
    proc, _ = run_job(sim, "node01", "healthy_rtx5090", job="no_such_job")
    assert proc.returncode == 2 and "no_such_job" in proc.stdout


def test_job_files_are_documented():
    for path in (SIM / "jobs").glob("*.json"):
        job = json.loads(path.read_text())
        assert job["description"] and job["nodes"] and job["stuck"]["rank"] < len(job["nodes"]) * job["nproc_per_node"]
    assert (BIN / "gpufleet-sim").exists()
