"""kentino.gpufleet.job_evidence run as Ansible runs it: logs, dumps, kernel log, GPUs, never a failure for bad input."""

import base64
import gzip
import json
import os
import pickle
import shutil

from ansible_collections.kentino.gpufleet.plugins.module_utils import job_sources
from helpers.fr_dumps import job_dumps, write_dumps
from helpers.module_runner import REPO, run_module

FIX = REPO / "tests" / "fixtures" / "torch"
ME = str(os.getuid())  # the job's user of these tests' files (a module run as root refuses root's files without it)
SIM_BIN = REPO / "sim" / "bin"


def sim_env(tmp_path, scenario, node="node03"):
    return {"GPUFLEET_SIM_SCENARIO": scenario, "GPUFLEET_SIM_STATE": str(tmp_path / node),
            "GPUFLEET_SIM_NODE": node, "GPUFLEET_SIM_TIME_SCALE": "0.001", "TZ": "UTC"}


def test_logs_and_dumps_without_tools(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(FIX / "watchdog_torch24.log", logs / "train.log")
    with gzip.open(logs / "old.log.gz", "wt") as fh:
        fh.write((FIX / "watchdog_torch21.log").read_text())
    paths = write_dumps(tmp_path / "dumps", job_dumps(world=4, culprit=3, seq=10, mode="stop"))
    (tmp_path / "dumps" / "nccl_trace_rank_2.tmp").write_bytes(b"half written")
    r = run_module("job_evidence", {"logs": [str(logs / "*.log*"), str(tmp_path / "nothing*.log")],
                                    "dump_prefixes": [str(tmp_path / "dumps" / "nccl_trace_rank_")],
                                    "kernel_log": "none", "nvidia_smi": False, "scan_processes": False,
                                    "job_user": ME}, env={"TZ": "UTC"})
    assert not r.get("failed"), r
    by_path = {os.path.basename(log["path"]): log for log in r["logs"]}
    assert set(by_path) == {"train.log", "old.log.gz"}
    assert by_path["train.log"]["parsed"]["culprit_rank"] == 3
    assert [t["rank"] for t in by_path["old.log.gz"]["parsed"]["timeouts"]] == [0, 1, 3, 2]
    assert any("no file matches" in n for n in r["notes"])
    assert [d["rank"] for d in r["dumps"]] == [0, 1, 2, 3]  # the .tmp file is not a dump
    for dump in r["dumps"]:
        assert base64.b64decode(dump["data_b64"]) == open(paths[dump["rank"]], "rb").read()
    assert pickle.loads(base64.b64decode(r["dumps"][0]["data_b64"]))["version"] == "2.10"
    assert r["kernel"]["source"] == "none" and r["errors"] == []


def test_limits_and_window_skip_dumps_but_list_them(tmp_path):
    paths = write_dumps(tmp_path / "d", job_dumps(world=3, culprit=1, seq=10, history=5))
    os.utime(paths[0], (1_000_000, 1_000_000))  # a dump of an older job
    r = run_module("job_evidence", {"dump_prefixes": [str(tmp_path / "d" / "nccl_trace_rank_")], "since": "-1h",
                                    "max_dump_bytes": os.path.getsize(paths[2]) - 1, "kernel_log": "none",
                                    "nvidia_smi": False, "scan_processes": False, "job_user": ME})
    skipped = {d["rank"]: d["skipped"] for d in r["dumps"]}
    assert "before the window" in skipped[0] and "over max_dump_bytes" in skipped[2]
    assert os.path.getsize(paths[1]) < os.path.getsize(paths[2])  # the stopped rank recorded fewer entries
    assert [d["rank"] for d in r["dumps"] if d["data_b64"]] == [1]


def test_bad_options_fail_before_reading():
    r = run_module("job_evidence", {"since": "yesterday-ish", "kernel_log": "none"})
    assert r["failed"] and "neither ISO 8601" in r["msg"]
    r = run_module("job_evidence", {"since": "-1h", "until": "-2h", "kernel_log": "none"})
    assert r["failed"] and "before since" in r["msg"]


def test_unreadable_log_is_an_error_not_a_failure(tmp_path):
    (tmp_path / "a.log").mkdir()  # a directory where a log was expected: not a file, so not matched
    bad = tmp_path / "b.log"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    r = run_module("job_evidence", {"logs": [str(tmp_path / "*.log")], "kernel_log": "none", "nvidia_smi": False,
                                    "scan_processes": False, "dump_prefixes": [str(tmp_path / "none" / "p_")],
                                    "job_user": ME})
    assert not r.get("failed")
    assert any("cannot read %s" % bad in e for e in r["errors"])
    assert any("does not exist" in n for n in r["notes"])


def test_kernel_log_and_gpus_from_the_sim(tmp_path):
    env = sim_env(tmp_path, "ecc_leak")
    r = run_module("job_evidence", {"since": "-30d", "kernel_log": "journal", "scan_processes": False,
                                    "dump_prefixes": []}, env=env, path_prepend=[SIM_BIN])
    assert r["kernel"]["source"] == "journal", r["kernel"]
    assert {e["xid"] for e in r["kernel"]["events"]} >= {92, 63}
    assert all(e["time"] for e in r["kernel"]["events"])
    assert len(r["gpus"]) == 8 and r["gpus"][2]["pci"].count(":") == 2 and r["gpus"][0]["uuid"].startswith("GPU-")


def test_live_workers_show_only_rank_and_device_variables(tmp_path):
    import subprocess
    import sys
    env = dict(os.environ, RANK="21", LOCAL_RANK="5", WORLD_SIZE="32", CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7",
               SECRET_TOKEN="do-not-read")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        r = run_module("job_evidence", {"kernel_log": "none", "nvidia_smi": False, "dump_prefixes": []})
    finally:
        proc.kill()
        proc.wait()
    mine = [p for p in r["processes"] if p["pid"] == proc.pid]
    assert mine and mine[0]["env"]["RANK"] == "21" and mine[0]["env"]["LOCAL_RANK"] == "5"
    assert "SECRET_TOKEN" not in mine[0]["env"] and "do-not-read" not in str(r)


def test_check_mode_reads_the_same(tmp_path):
    shutil.copy(FIX / "watchdog_torch24.log", tmp_path / "t.log")
    r = run_module("job_evidence", {"logs": [str(tmp_path / "t.log")], "kernel_log": "none", "nvidia_smi": False,
                                    "dump_prefixes": [], "job_user": ME}, check_mode=True)
    assert r["logs"][0]["parsed"]["culprit_rank"] == 3 and r["changed"] is False


def test_journal_unit_lines_keep_the_journal_time(tmp_path):
    import json
    t = 1_765_000_000.0
    records = [{"MESSAGE": "[rank0]:[E ProcessGroupNCCL.cpp:1] [PG 0 Rank 0] Exception (either an error or timeout) "
                           "detected by watchdog at work: 5, last enqueued NCCL work: 5, last completed NCCL work: 4.",
                "__REALTIME_TIMESTAMP": str(int(t * 1e6)), "__CURSOR": "s=1"},
               {"MESSAGE": [91, 114, 97, 110, 107, 49, 93, 58, 32, 104, 105], "__REALTIME_TIMESTAMP": str(int(t * 1e6))}]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    out = tmp_path / "journal.json"
    out.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    # A journalctl without --grep (systemd < 237): the module retries without it and says so.
    (bindir / "journalctl").write_text('#!/bin/sh\necho "$@" >> %s/argv\ncase "$*" in *--grep*) echo "journalctl: '
                                       'unrecognized option --grep" >&2; exit 1;; esac\ncat %s\n' % (tmp_path, out))
    (bindir / "journalctl").chmod(0o755)
    r = run_module("job_evidence", {"journal_units": ["train.service"], "since": "@%d" % (t - 60),
                                    "kernel_log": "none", "nvidia_smi": False, "scan_processes": False,
                                    "dump_prefixes": []}, path_prepend=[bindir])
    log = r["logs"][0]
    assert log["source"] == "journal" and log["unit"] == "train.service" and log["error"] is None, r
    assert log["parsed"]["pg_status"][0]["time"] == t
    assert any("no --grep" in n for n in r["notes"])
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[0].startswith("-u train.service -o json") and "--since=@%d" % (t - 60) in argv[0]


def test_a_link_planted_in_the_dump_directory_or_among_the_logs_is_never_read(tmp_path):
    # The dump directory is writable by every user: `ln -s /etc/shadow nccl_trace_rank_0` must not make a module run
    # as root send /etc/shadow to the operator's console.
    secret = tmp_path / "secret"
    secret.write_bytes(b"TOP SECRET: root:$6$hash")
    write_dumps(tmp_path / "dumps", job_dumps(world=2, culprit=1, seq=10))
    planted = tmp_path / "dumps" / "nccl_trace_rank_0"
    planted.unlink()
    planted.symlink_to(secret)
    os.mkfifo(tmp_path / "dumps" / "nccl_trace_rank_2")  # not a file: refused at once, never blocks the read
    shutil.copy(FIX / "watchdog_torch24.log", tmp_path / "real.log")
    (tmp_path / "link.log").symlink_to(secret)
    r = run_module("job_evidence", {"logs": [str(tmp_path / "*.log")], "job_user": ME, "kernel_log": "none",
                                    "dump_prefixes": [str(tmp_path / "dumps" / "nccl_trace_rank_")],
                                    "nvidia_smi": False, "scan_processes": False}, timeout=60)
    assert not r.get("failed"), r
    dumps = {d["rank"]: d for d in r["dumps"]}
    assert dumps[0]["data_b64"] is None and "is a symbolic link: not followed" in dumps[0]["error"]
    assert dumps[2]["data_b64"] is None and "is not a regular file" in dumps[2]["error"]
    assert dumps[1]["data_b64"] and dumps[1]["error"] is None  # the job's real dump is still read
    logs = {os.path.basename(log["path"]): log for log in r["logs"]}
    assert "symbolic link" in logs["link.log"]["error"] and logs["link.log"]["parsed"] is None
    assert logs["real.log"]["parsed"]["culprit_rank"] == 3
    text = json.dumps(r)
    assert "TOP SECRET" not in text and base64.b64encode(secret.read_bytes()).decode()[:16] not in text


def test_files_not_owned_by_the_jobs_user_are_refused(tmp_path):
    write_dumps(tmp_path / "dumps", job_dumps(world=1, culprit=0, seq=10))
    shutil.copy(FIX / "watchdog_torch24.log", tmp_path / "t.log")
    other = str(os.getuid() + 4242)
    r = run_module("job_evidence", {"logs": [str(tmp_path / "t.log")], "job_user": other, "kernel_log": "none",
                                    "dump_prefixes": [str(tmp_path / "dumps" / "nccl_trace_rank_")],
                                    "nvidia_smi": False, "scan_processes": False})
    (dump,) = r["dumps"]
    assert dump["data_b64"] is None and dump["error"].endswith(
        "is owned by %s, not by the job's user uid %s: not read" % (job_sources.user_label(os.getuid()), other))
    assert r["logs"][0]["parsed"] is None and "not by the job's user uid %s" % other in r["logs"][0]["error"]
    assert len(r["errors"]) == 2
    unknown = run_module("job_evidence", {"job_user": "no-such-user-here", "kernel_log": "none"})
    assert unknown["failed"] and "job_user 'no-such-user-here' is not a user on this node" in unknown["msg"]


def test_a_root_module_refuses_roots_files_unless_the_job_ran_as_root():
    # A hard link to a root-owned file keeps root as its owner: without job_user, root does not read root's files.
    assert "owned by root and the job's user is not given" in job_sources.owner_problem(0, None, euid=0)
    assert job_sources.owner_problem(0, 0, euid=0) is None  # job_user: root
    assert job_sources.owner_problem(1000, None, euid=0) is None
    assert job_sources.owner_problem(0, None, euid=1000) is None  # not root: the kernel's permissions decide
    assert "not by the job's user" in job_sources.owner_problem(1000, 1001, euid=1000)
