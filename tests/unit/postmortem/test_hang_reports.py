"""What torch's desync report, NCCL's RAS status and torch's flight-recorder analyzer say about a hang reaches the
verdict: each names or narrows the culprit, where the watchdog lines alone single out nobody or there are none."""

from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils.job_sources import parse_job_lines
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import analysis, document

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "postmortem_reports"
T = 1_765_000_000.0


def evidence(host, *names):
    """One node's job_evidence result whose logs are the fixture files (parsed as job_evidence parses them)."""
    logs = [{"source": "file", "path": "/srv/train/%s" % name, "unit": None, "bytes": 1, "mtime": T, "notes": [],
             "error": None, "parsed": parse_job_lines((FIXTURES / name).read_text().splitlines(), reference=T)}
            for name in names]
    gpus = [{"index": i, "pci": "0000:%02x:00" % (0x18 + i), "uuid": "GPU-%s-%d" % (host, i), "name": "H100",
             "throttle_reasons": [], "lost": False} for i in range(8)]
    return {"host": host, "now": T + 30, "utc_offset_s": 0, "window": {}, "logs": logs, "dumps": [],
            "kernel": {"source": "dmesg", "error": None, "events": [], "lost_gpus": [], "gpu_ids": {}, "unparsed": {}},
            "gpus": gpus, "gpu_problems": [], "processes": [], "errors": [], "notes": []}


def test_the_desync_report_names_the_rank_the_watchdog_lines_cannot():
    r = analysis.analyse({"node01": evidence("node01", "desync_lagging_rank7.log")}, world_size=8)
    v = r["verdict"]
    assert v["kind"] in ("rank", "hardware") and v["rank"] == 7 and v["confidence"] != "none", v
    assert any("finished collective #182 but never joined #183" in reason for reason in v["reasons"])
    doc = document.build(r, "20261206T184412Z-desync")
    assert doc["logs"]["named"][0]["rank"] == 7 and doc["findings"][0]["code"] == "JOB_HANG_RANK"


def test_ras_status_alone_is_a_hang_with_the_ranks_behind():
    """No timeout yet (the operator ran ncclras on the hung job): before, "no hang found"."""
    r = analysis.analyse({"node01": evidence("node01", "ras_mismatch_two_behind.txt")})
    v = r["verdict"]
    assert v["kind"] != "no_hang_found" and sorted(v["ranks"]) == [9, 13], v
    assert any("AllReduce operation 7752 while 14 ranks are at 7753" in reason and "GPU 1" in reason and
               "10.0.0.12" in reason for reason in v["reasons"]), v["reasons"]
    dead = analysis.analyse({"node01": evidence("node01", "ras_dead_process.txt")})["verdict"]
    assert dead["rank"] == 29 and any("process 3487984" in reason and "dead" in reason for reason in dead["reasons"])


def test_the_flight_recorder_analyzer_names_the_missing_rank_and_the_mismatching_one():
    r = analysis.analyse({"node01": evidence("node01", "frtrace_torch27_missing_and_errors.txt")})
    v = r["verdict"]
    assert v["rank"] == 21 and v["confidence"] == "medium", v
    assert any("never joined nccl:all_reduce #7753 of process group 0:default_pg" in x for x in v["reasons"])
    ranks = {c["rank"]: c for c in r["candidates"]}
    assert 10 in ranks and "COLLECTIVE_TYPE_MISMATCH" in " ".join(ranks[10]["reasons"])
    old = analysis.analyse({"node01": evidence("node01", "frtrace_torch25_missing_rank1.txt")})["verdict"]
    assert old["rank"] == 1 and old["kind"] != "no_hang_found"
