"""The whole analysis on job_evidence results: the join rank -> node -> GPU -> XID -> action, and its limits."""

import base64
import copy
import pickle

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import analysis
from helpers.job_evidence import BUSES, RISER_JOB, fleet, iso, node_evidence

T = 1_765_000_000.0


def test_riser_xid79_names_rank_node_gpu_and_the_riser():
    r = analysis.analyse(fleet(T=T, faults={2: {"gpu": 5}}))
    v = r["verdict"]
    assert (v["kind"], v["confidence"], v["rank"], v["host"], v["local_rank"], v["gpu"], v["pci"]) == \
        ("hardware", "high", 21, "node03", 5, 5, "0000:a1:00")
    assert v["message"].startswith("node03 GPU 5 (PCI 0000:a1:00): XID 79 at T-40 s (GPU fell off the bus)")
    assert "reseat the riser" in v["action"] and "before any RMA" in v["action"]
    assert r["window"]["basis"] == "last timeout in the logs" and abs(r["window"]["t_fire"] - T) < 0.01
    assert r["world_size"] == 32 and r["flight"]["culprits"][0]["basis"] == "never_joined"
    assert any("NVRM: Xid (PCI:0000:a1:00): 79" in line for line in v["evidence"])


def test_logs_alone_find_the_silent_rank_and_its_gpu():
    r = analysis.analyse(fleet(T=T, faults={2: {"gpu": 5}}, node01={"dumps": False}, node02={"dumps": False},
                               node03={"dumps": False}, node04={"dumps": False}))
    v = r["verdict"]
    assert r["flight"] is None and (v["rank"], v["host"], v["gpu"]) == (21, "node03", 5)
    assert v["kind"] == "hardware" and v["confidence"] == "medium"  # a silent rank is weaker proof than a dump
    assert "reported no timeout" in v["reasons"][0]


def test_an_xid_outside_the_window_is_not_the_cause():
    r = analysis.analyse(fleet(T=T, faults={2: {"gpu": 5, "at_s": -6 * 3600}}))
    v = r["verdict"]
    assert v["kind"] == "rank" and v["rank"] == 21 and v["confidence"] == "medium"
    assert r["merged_counts"]["xid_events_outside_window"] == 1 and r["hardware"]["node03"] == []


def test_psu_rail_loss_points_at_the_psu():
    ev = fleet(T=T)
    lines = []
    for n, gpu in enumerate((4, 5, 6, 7)):
        lines += ["%s NVRM: Xid (PCI:0000:%s:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
                  % (iso(T - 40 + n * 0.0013), BUSES[gpu])]
    ev["node03"] = node_evidence(RISER_JOB, 2, T, lines, lost=[4, 5, 6, 7])
    r = analysis.analyse(ev, psu_rails={"node03": {"A": [0, 1, 2, 3], "B": [4, 5, 6, 7]}})
    v = r["verdict"]
    assert v["kind"] == "hardware" and v["gpu"] == 5 and "PSU" in v["action"] and "rail B" in v["action"]
    assert "GPUs 4, 5, 6, 7 of PSU rail B lost within 0.004 s" in v["message"]


def test_two_stopped_ranks_are_equally_suspect_without_hardware_evidence():
    job = copy.deepcopy(RISER_JOB)
    ev = fleet(job, T=T)
    dump = pickle.loads(base64.b64decode(ev["node01"]["dumps"][2]["data_b64"]))
    stopped = pickle.loads(base64.b64decode(ev["node03"]["dumps"][5]["data_b64"]))
    dump.update({"entries": stopped["entries"], "pg_status": stopped["pg_status"]})
    ev["node01"]["dumps"][2]["data_b64"] = base64.b64encode(pickle.dumps(dump)).decode()
    parsed = ev["node01"]["logs"][0]["parsed"]
    for kind in ("timeouts", "pg_status"):  # rank 2 stopped: it printed nothing either
        parsed[kind] = [e for e in parsed[kind] if e["rank"] != 2]
    r = analysis.analyse(ev)
    v = r["verdict"]
    assert v["kind"] == "tie" and v["ranks"] == [2, 21] and v["confidence"] == "medium" and v["tie"]
    assert "equally suspect" in v["message"] and "node01 GPU 2" in v["action"] and "node03 GPU 5" in v["action"]
    # ... and hardware evidence on one of them breaks the tie.
    ev["node03"] = node_evidence(RISER_JOB, 2, T, [line for line in _xid(5)], lost=[5])
    assert analysis.analyse(ev)["verdict"]["ranks"] == [21]


def _xid(gpu):
    from helpers.job_evidence import xid_lines
    return xid_lines(T, gpu)


def test_unreachable_node_keeps_its_ranks_as_no_evidence_and_the_rest_is_analysed():
    ev = fleet(T=T, faults={2: {"gpu": 5}})
    ev["node02"] = {"unreachable": True, "msg": "Failed to connect to the host via ssh: Connection refused"}
    r = analysis.analyse(ev)
    assert r["hosts_without_evidence"] == {"node02": "unreachable: Failed to connect to the host via ssh: "
                                                     "Connection refused"}
    assert r["verdict"]["host"] == "node03" and r["verdict"]["gpu"] == 5
    assert r["flight"]["groups"][0]["missing_dump"] == list(range(8, 16))


def test_culprit_on_the_unreachable_node_is_said_so():
    ev = fleet(T=T, faults={2: {"gpu": 5}})
    ev["node03"] = None
    r = analysis.analyse(ev)
    v = r["verdict"]
    assert v["kind"] == "tie" and v["ranks"] == list(range(16, 24)) and v["confidence"] == "low"
    assert v["host"] == "node03" and "node03 gave no evidence" in v["message"]
    assert r["ranks"][21] == {"host": "node03", "local_rank": 5, "basis": ["elimination"], "conflict": []}


def test_no_timeout_anywhere_is_no_hang_found():
    job = copy.deepcopy(RISER_JOB)
    ev = {h: node_evidence(job, i, T, log=False, dumps=False) for i, h in enumerate(job["nodes"])}
    v = analysis.analyse(ev)["verdict"]
    assert v["kind"] == "no_hang_found" and v["confidence"] == "none"


def test_cuda_visible_devices_maps_the_local_rank_to_the_physical_gpu():
    job = copy.deepcopy(RISER_JOB)
    job["nproc_per_node"] = 4
    job["stuck"]["rank"] = 9  # node03 (ranks 8-11), local rank 1
    ev = {h: node_evidence(job, i, T, kernel_lines=_xid(5) if i == 2 else (), lost=[5] if i == 2 else [])
          for i, h in enumerate(job["nodes"])}
    r = analysis.analyse(ev, cuda_visible_devices={"node03": "4,5,6,7"})
    v = r["verdict"]
    assert (v["rank"], v["local_rank"], v["gpu"], v["pci"], v["kind"]) == (9, 1, 5, "0000:a1:00", "hardware")


def test_clock_skew_and_shared_storage_are_reported():
    ev = fleet(T=T, faults={2: {"gpu": 5}})
    ev["node04"]["now"] = T + 30 + 42
    ev["node04"]["dumps"].append(dict(ev["node01"]["dumps"][0]))  # rank 0's dump seen on node04 as well
    r = analysis.analyse(ev, now=T + 30)
    assert r["clock"] == {"node04": 42.0}
    assert any("rank 0 has a dump on node01 and on node04" in n for n in r["notes"])
    assert r["verdict"]["rank"] == 21


def test_two_jobs_in_one_log_the_last_timeout_is_explained_unless_told_otherwise():
    import time as _time

    from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_watchdog import parse_torch_log
    from helpers.module_runner import REPO

    text = (REPO / "tests" / "fixtures" / "torch" / "two_jobs_interleaved.log").read_text()
    ref = _time.mktime((2024, 12, 7, 0, 0, 0, 0, 0, -1))
    ev = node_evidence(RISER_JOB, 0, T, log=False, dumps=False)
    ev["logs"] = [{"source": "file", "path": "/srv/train/both.log", "parsed": parse_torch_log(text, reference=ref)}]
    last = analysis.analyse({"node01": ev}, world_size=4)
    assert last["verdict"]["rank"] == 1 and last["window"]["basis"] == "last timeout in the logs"
    assert last["merged_counts"]["outside_window"] == 8  # job A's lines
    t0 = _time.mktime((2024, 12, 6, 10, 0, 0, 0, 0, -1))
    first = analysis.analyse({"node01": ev}, world_size=4, since=t0 - 900, until=t0 + 300)
    assert first["verdict"]["rank"] == 2 and "rank 2 never enqueued work 412" in first["verdict"]["reasons"][0]


def test_heartbeat_kills_alone_are_a_hang_without_a_named_rank():
    from ansible_collections.kentino.gpufleet.plugins.module_utils.torch_watchdog import parse_torch_log
    from helpers.module_runner import REPO

    text = (REPO / "tests" / "fixtures" / "torch" / "watchdog_heartbeat_kill.log").read_text()
    ev = node_evidence(RISER_JOB, 0, T, log=False, dumps=False)
    ev["logs"] = [{"source": "file", "path": "/x.log", "parsed": parse_torch_log(text, reference=T)}]
    r = analysis.analyse({"node01": ev})
    assert r["window"]["basis"] == "last timeout in the logs" and r["window"]["timeout_s"] == 480
    assert r["verdict"]["kind"] == "undetermined" and len(r["logs"]["heartbeat_kills"]) == 4
    assert "no flight-recorder dumps" in r["verdict"]["message"]


def test_hardware_findings_and_actions_are_the_fleet_reports():
    """The post-mortem judges the window's XIDs with judge_xid, the fleet report's judge: same codes, same actions."""
    from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_xid
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import findings

    ev = fleet(T=T, faults={2: {"gpu": 5}})
    xid13 = ("%s NVRM: Xid (PCI:0000:%s:00): 13, pid=4242, name=python3, Graphics Exception: ESR 0x504648"
             % (iso(T - 20), BUSES[2]))
    ev["node03"] = node_evidence(RISER_JOB, 2, T, _xid(5) + [xid13], lost=[5])
    r = analysis.analyse(ev)
    report, _timeline = judge_xid.judge(ev["node03"]["kernel"]["events"], [], {}, "node03",
                                        {"0000:%s:00" % BUSES[i]: i for i in range(8)})
    by_code = {f["code"]: f for f in report}
    assert r["verdict"]["action"] == by_code["GPU_LOST"]["action"]
    issue = [i for i in r["hardware"]["node03"] if i["gpus"] == [2]][0]
    # XID 13: NVIDIA says restart the application: listed, never blamed
    assert (issue["kind"], issue["code"], issue["action"]) == ("application", "XID_WARNING", by_code["XID_WARNING"]["action"])
    extra = [f for f in findings.build(r) if f["code"] == "XID_WARNING"]
    assert len(extra) == 1 and extra[0]["gpu"] == 2 and extra[0]["action"] == by_code["XID_WARNING"]["action"]


def test_the_nodes_inventory_thresholds_reach_the_judge():
    ev = fleet(T=T, faults={2: {"gpu": 5}})
    # a site that counts XID 79 among the RMA codes (and not as a lost GPU) gets the RMA action
    r = analysis.analyse(ev, thresholds={"node03": {"gpufleet_lost_xids": [], "gpufleet_rma_xids": [48, 63, 64, 79]}})
    v = r["verdict"]
    assert v["kind"] == "hardware" and v["action"].startswith("replace the card (RMA)")
    assert [(i["kind"], i["code"]) for i in r["hardware"]["node03"]] == [("rma", "XID_RMA")]


REFUSED = b"cos\nsystem\n(S'echo pwned'\ntR."  # a pickle the safe reader refuses (a GLOBAL opcode), never run


def _refuse_dump(ev, host, rank):
    for dump in ev[host]["dumps"]:
        if dump["rank"] == rank:
            dump.update(data_b64=base64.b64encode(REFUSED).decode(), bytes=len(REFUSED))


def test_a_refused_dump_still_places_its_rank_and_is_refused_not_missing():
    """The stuck rank's dump is refused and the rank printed nothing (it stopped): its dump FILE on node03 still says
    where it ran, and it is said refused, never also "missing" nor "left no dump"."""
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import findings

    job = copy.deepcopy(RISER_JOB)
    job["stuck"]["rank"] = 23  # node03's last rank: no other source names its node
    ev = fleet(job=job, T=T)
    _refuse_dump(ev, "node03", 23)
    r = analysis.analyse(ev)
    v = r["verdict"]
    assert (v["rank"], v["host"], v["local_rank"], v["gpu"], v["pci"]) == (23, "node03", 7, 7, "0000:e1:00"), v
    assert "unknown node" not in v["message"] and "left no dump" not in v["message"]
    assert "dump could not be read" in v["reasons"][0]
    codes = [(f["code"], f["message"]) for f in findings.build(r)]
    assert [c for c, _m in codes].count("DUMP_REFUSED") == 1
    assert not [m for c, m in codes if c == "DUMP_MISSING"], codes


def test_a_refused_dump_of_a_rank_whose_log_names_it_is_not_called_missing():
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import findings

    job = copy.deepcopy(RISER_JOB)
    job["stuck"].update(rank=23, mode="mismatch")  # it runs BROADCAST where the others run ALLREDUCE, and says so
    ev = fleet(job=job, T=T)
    _refuse_dump(ev, "node03", 23)
    r = analysis.analyse(ev)
    v = r["verdict"]
    assert (v["rank"], v["host"], v["gpu"]) == (23, "node03", 7)
    assert not any("left no dump" in reason for reason in v["reasons"]), v["reasons"]
    assert any("BROADCAST" in reason for reason in v["reasons"])
    assert not [f for f in findings.build(r) if f["code"] == "DUMP_MISSING"]
