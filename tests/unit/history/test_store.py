"""The history store on real SQLite files: runs and GPUs written and read back, a file that is not ours refused and left
untouched, an older schema migrated forward, two writers at once both landing, a writer killed mid-transaction
leaving a consistent file, retention and export."""

import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import store
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, HistoryError

REPO = Path(__file__).resolve().parents[3]
DAY = 86400.0
T0 = 1.8e9


def node(host, ts, verdict="pass", ecc=0, gpus=2, xids=(), driver="570.133.20", xid=92, severity="warning"):
    return {"host": host, "ts": ts, "verdict": verdict, "reachable": 1, "stage": "done", "grp": "H100",
            "driver": driver, "dcgm": "4.2.3", "kernel": "6.1", "bios": "2.1", "board_serial": "B1", "product": "P",
            "gpu_count": gpus, "codes": None, "figures": {"nccl_busbw_gbps": 360.0}, "versions": {"driver": driver},
            "gpus": [{"pci": "0000:%02x:00" % (i + 16), "idx": i, "uuid": "GPU-%s-%d" % (host, i), "serial": None,
                      "name": "H100", "verdict": verdict, "ts": ts, "ecc_corr_agg": ecc * (i == 1)}
                     for i in range(gpus)],
            "xids": [{"pci": "0000:11:00", "xid": xid, "ts": x, "severity": severity, "digest": "d%s" % x}
                     for x in xids],
            "baselines": [], "doc": None}


def run(run_id, ts, playbook="audit"):
    return {"run_id": run_id, "playbook": playbook, "started": None, "finished": None, "ts": ts, "verdict": "pass"}


def test_a_run_is_written_and_read_back_by_gpu_identity(tmp_path):
    path = tmp_path / "h" / store.FILE_NAME
    with History(path) as h:
        assert h.version() == store.SCHEMA_VERSION and h.integrity() == ["ok"]
        for day in range(3):
            h.record(run("r%d" % day, T0 + day * DAY), [node("n1", T0 + day * DAY, ecc=10 * day, xids=[T0 + day])])
        gpu_id = h.gpu_id("n1", "GPU-n1-1")
        assert [r["ecc_corr_agg"] for r in h.gpu_series(gpu_id)] == [0, 10, 20]
        assert h.xid_events(gpu_id, [92]) == [(T0 + d, "d%s" % (T0 + d)) for d in range(3)]
        assert [n["run_id"] for n in h.node_runs("n1")] == ["r2", "r1", "r0"]
        assert h.last_pass("n1") == T0 + 2 * DAY
        # the same run recorded again replaces itself
        h.record(run("r2", T0 + 2 * DAY), [node("n1", T0 + 2 * DAY, ecc=99)])
        assert [r["ecc_corr_agg"] for r in h.gpu_series(gpu_id)] == [0, 10, 99]
    assert oct(os.stat(path.parent).st_mode)[-3:] in ("755", "775", "700", "750")


def test_a_random_file_is_refused_and_never_overwritten(tmp_path):
    path = tmp_path / store.FILE_NAME
    junk = os.urandom(4096)
    path.write_bytes(junk)
    with pytest.raises(HistoryError, match="is not an SQLite database.*left as it is"):
        History(path)
    assert path.read_bytes() == junk


def test_a_foreign_sqlite_database_is_refused(tmp_path):
    path = tmp_path / store.FILE_NAME
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE invoices (id INTEGER)")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(HistoryError, match="not a gpufleet history.*invoices"):
        History(path)
    assert path.read_bytes() == before


def test_a_damaged_history_is_refused(tmp_path):
    path = tmp_path / store.FILE_NAME
    with History(path) as h:
        h.record(run("r0", T0), [node("n1", T0)])
    data = bytearray(path.read_bytes())
    data[100:4096] = os.urandom(3996)  # the schema page
    path.write_bytes(bytes(data))
    with pytest.raises(HistoryError, match="damaged|not a gpufleet history"):
        History(path)


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / store.FILE_NAME
    with History(path) as h:
        h.db.execute("PRAGMA user_version = %d" % (store.SCHEMA_VERSION + 1))
    with pytest.raises(HistoryError, match="newer kentino.gpufleet"):
        History(path)


def test_an_old_schema_is_migrated_forward_keeping_its_runs(tmp_path):
    path = tmp_path / store.FILE_NAME
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(store.MIGRATIONS[0])
    db.execute("PRAGMA application_id = %d" % store.APPLICATION_ID)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO hosts (id, name) VALUES (1, 'old-node')")
    db.execute("INSERT INTO runs (id, run_id, playbook, ts) VALUES (1, 'v1-run', 'audit', ?)", (T0,))
    db.execute("INSERT INTO node_runs (run, host, ts, verdict, reachable) VALUES (1, 1, ?, 'pass', 1)", (T0,))
    db.close()
    with History(path) as h:
        assert h.version() == store.SCHEMA_VERSION
        assert [n["run_id"] for n in h.node_runs("old-node")] == ["v1-run"]
        assert h.db.execute("SELECT value FROM meta WHERE key = 'migrated_from'").fetchone()[0] == "1"
        h.record(run("v3-run", T0 + DAY), [node("old-node", T0 + DAY, xids=[T0 + 5])])  # tables of v2 and v3
        assert h.integrity() == ["ok"]


WRITER = textwrap.dedent("""
    import contextlib, os, sqlite3, sys, time
    sys.path.insert(0, %(collections)r)
    sys.path.insert(0, %(tests)r)
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History
    from test_store import node, run
    path, name, sync, role, hosts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])

    def mark(what):
        open(os.path.join(sync, what), "w").close()

    def wait(what):
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(sync, what)):
            assert time.monotonic() < deadline, "%%s: no %%s within 120 s" %% (name, what)
            time.sleep(0.002)

    # The barrier: both writers start creating (and migrating) the file at once.
    mark("ready-" + name)
    wait("ready-a"), wait("ready-b")
    with History(path) as h:
        mark("opened-" + name)  # the second barrier: both have created or migrated the file
        wait("opened-a"), wait("opened-b")
        if role == "hold":
            # Hold the write transaction of the run until the other writer has found the file locked by it.
            plain = h.transaction

            @contextlib.contextmanager
            def held():
                with plain() as db:
                    mark("holding")
                    wait("locked-out")
                    yield db
            h.transaction = held
        else:
            wait("holding")
            probe = sqlite3.connect(path, timeout=0, isolation_level=None)
            try:
                probe.execute("BEGIN IMMEDIATE")
                raise SystemExit("%%s: the file was not locked while the other writer held its transaction" %% name)
            except sqlite3.OperationalError as exc:
                assert "locked" in str(exc), exc
            probe.close()
            mark("locked-out")  # the other writer commits now; this one's record waits for it (busy timeout)
        h.record(run(name, 1.8e9), [node("%%s-%%d" %% (name, i), 1.8e9, gpus=8) for i in range(hosts)])
    print("recorded", name)
""")


def _writer(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER % {"collections": str(REPO / "collections"), "tests": str(Path(__file__).parent)})
    return script


def test_two_runs_writing_at_the_same_moment_both_land(tmp_path):
    """Two writers meet at a barrier, race to create and migrate the file, then overlap for certain: one holds its
    run's write transaction until the other has found the file locked (a probe with no busy timeout), and the other
    then records its run through the store's busy timeout. Both runs land, the file is sound."""
    path = tmp_path / store.FILE_NAME  # not created yet: both writers race to create and migrate it too
    script = _writer(tmp_path)
    sync = tmp_path / "sync"
    sync.mkdir()
    procs = [subprocess.Popen([sys.executable, str(script), str(path), name, str(sync), role, "40"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, role in (("a", "hold"), ("b", "try"))]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(  # each writer's own reason, whole
        "writer %s: exit %s\n%s%s" % (name, p.returncode, out, err[-3000:])
        for name, p, (out, err) in zip("ab", procs, outs, strict=True))
    assert sorted(p.name for p in sync.iterdir()) == ["holding", "locked-out", "opened-a", "opened-b", "ready-a",
                                                      "ready-b"]
    with History(path) as h:
        assert sorted(r["run_id"] for r in h.runs()) == ["a", "b"]
        assert h.db.execute("SELECT COUNT(*) FROM gpu_runs").fetchone()[0] == 2 * 40 * 8
        assert h.integrity() == ["ok"]


def test_a_writer_killed_mid_transaction_leaves_a_consistent_file(tmp_path):
    path = tmp_path / store.FILE_NAME
    with History(path) as h:
        h.record(run("before", T0), [node("n1", T0)])
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        sys.path.insert(0, %r)
        sys.path.insert(0, %r)
        from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History
        from test_store import node, run
        with History(sys.argv[1]) as h:
            with h.transaction():
                h.db.execute("INSERT INTO runs (run_id, ts) VALUES ('half', 1.9e9)")
                h.db.executemany("INSERT INTO hosts (name) VALUES (?)", [("h%%d" %% i,) for i in range(5000)])
                print("in transaction", flush=True)
                time.sleep(60)
    """) % (str(REPO / "collections"), str(Path(__file__).parent)))
    proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "in transaction"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with History(path) as h:
        assert h.integrity() == ["ok"]
        assert [r["run_id"] for r in h.runs()] == ["before"]
        assert h.db.execute("SELECT COUNT(*) FROM hosts").fetchone()[0] == 1
        h.record(run("after", T0 + DAY), [node("n1", T0 + DAY)])  # the next run works
        assert [r["run_id"] for r in h.runs()] == ["after", "before"]


def test_retention_drops_old_runs_with_their_rows(tmp_path):
    with History(tmp_path / store.FILE_NAME) as h:
        for day in range(10):
            h.record(run("r%d" % day, T0 + day * DAY), [node("n1", T0 + day * DAY, xids=[T0 + day * DAY])])
        assert h.prune(5, now=T0 + 9 * DAY) == 4  # days 0-3 are more than 5 days before day 9
        assert len(h.runs(100)) == 6
        assert h.db.execute("SELECT COUNT(*) FROM gpu_runs").fetchone()[0] == 6 * 2
        assert h.db.execute("SELECT COUNT(*) FROM xid_events").fetchone()[0] == 6
        assert h.prune(0) == 0


def test_export_csv_and_json(tmp_path):
    path = tmp_path / store.FILE_NAME
    with History(path) as h:
        for day in range(2):
            h.record(run("r%d" % day, T0 + day * DAY), [node("n1", T0 + day * DAY, ecc=5), node("n2", T0)])
    rows = list(csv.DictReader(io.StringIO(store.export_text(path, "csv"))))
    assert len(rows) == 2 * 2 * 2 and {"run_id", "host", "uuid", "ecc_corr_agg", "ts"} <= set(rows[0])
    lines = [json.loads(x) for x in store.export_text(path, "json", host="n1").splitlines()]
    assert len(lines) == 4 and all(x["host"] == "n1" for x in lines)
    with pytest.raises(HistoryError, match="csv or json"):
        store.export_text(path, "xml")


def test_a_csv_export_never_hands_a_spreadsheet_a_formula(tmp_path):
    """Serials and versions come from the node's tools: one that starts like a formula is shown as text in the sheet;
    the JSON export keeps it as it is, and numbers stay numbers."""
    path = tmp_path / store.FILE_NAME
    hostile = node("n1", T0, ecc=3)
    hostile["driver"] = "=HYPERLINK(\"http://x.invalid\",\"570\")"
    hostile["gpus"][0]["serial"] = "@SUM(1+1)"
    hostile["gpus"][1]["serial"] = "+1650000001"
    with History(path) as h:
        h.record(run("r0", T0), [hostile])
    rows = list(csv.DictReader(io.StringIO(store.export_text(path, "csv"))))
    assert [r["serial"] for r in rows] == ["'@SUM(1+1)", "'+1650000001"]
    assert {r["driver"] for r in rows} == {"'=HYPERLINK(\"http://x.invalid\",\"570\")"}
    assert [r["ecc_corr_agg"] for r in rows] == ["0", "3"]
    lines = [json.loads(x) for x in store.export_text(path, "json").splitlines()]
    assert [x["serial"] for x in lines] == ["@SUM(1+1)", "+1650000001"] and lines[1]["ecc_corr_agg"] == 3


def test_last_pass_is_the_newest_passing_run_not_the_newest_reachable_one(tmp_path):
    """An operator reads "last pass" as the last run the node passed: a node that answered but failed every run
    since has not passed since (on main "last good" was the newest reachable run, failing or not)."""
    with History(tmp_path / store.FILE_NAME) as h:
        h.record(run("r0", T0), [node("n1", T0), node("n2", T0, verdict="warn")])
        for day in (1, 2, 3):
            h.record(run("r%d" % day, T0 + day * DAY), [node("n1", T0 + day * DAY, verdict="fail"),
                                                       node("n2", T0 + day * DAY, verdict="error")])
        assert h.last_pass("n1") == T0 and h.last_pass("n2") == T0, "warn passes the default gate"
        summary = {s["name"]: s for s in h.fleet_summary(now=T0 + 3 * DAY + 60)}
        assert summary["n1"]["pass_ts"] == T0 and summary["n1"]["verdict"] == "fail"
        assert summary["n1"]["stale"] is False, "reached every night: failing, not stale"


def test_fleet_summary_marks_a_node_never_reached_as_stale(tmp_path):
    with History(tmp_path / store.FILE_NAME) as h:
        dead = dict(node("dead", T0, verdict="unreachable", gpus=0), reachable=0)
        h.record(run("r0", T0), [node("ok", T0), dead])
        summary = {s["name"]: s for s in h.fleet_summary(now=T0 + 60)}
        assert summary["dead"]["stale"] is True and summary["ok"]["stale"] is False


def test_failure_observations_for_the_checkpoint_plan(tmp_path):
    """GPU-hours between each host's audits (a gap capped at two days), a burst of XIDs that interrupt a job on one
    GPU is one failure, a host that became unreachable is one; the package function reads the same file read-only."""
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils import history as history_pkg

    path = store.default_path(tmp_path)
    with History(path) as h:
        assert h.failure_observations(30, now=T0 + 10 * DAY) is None  # nothing known yet
        for day in range(4):  # nightly audits of a 2-GPU host, days 0-3
            burst = (T0 + 2.5 * DAY, T0 + 2.5 * DAY + 60, T0 + 2.5 * DAY + 600) if day == 3 else ()
            h.record(run("r%d" % day, T0 + day * DAY), [node("a", T0 + day * DAY, xids=burst, xid=48,
                                                             severity="critical")])
        h.record(run("r9", T0 + 9 * DAY), [node("a", T0 + 9 * DAY)])  # after a week unaudited: counts 2 days
        h.record(run("r1b", T0 + 1 * DAY + 1), [dict(node("b", T0 + 1 * DAY + 1, gpus=8), reachable=1)])
        h.record(run("r2b", T0 + 2 * DAY + 1), [dict(node("b", T0 + 2 * DAY + 1, gpus=8), reachable=0,
                                                     verdict="unreachable")])
        obs = h.failure_observations(30, now=T0 + 10 * DAY)
    assert obs == {"failures": 2, "gpu_hours": round(2 * 24 * 5 + 8 * 24, 1), "window_days": 10.0}
    assert history_pkg.failure_observations(str(tmp_path), 30) is not None
    assert history_pkg.failure_observations(str(tmp_path / "none"), 30) is None


def test_one_definition_of_an_interruption_contained_xids_and_burn_ins_are_not(tmp_path):
    """docs/training.md: an interruption is an XID the policy rates critical and the driver did not contain (not XID
    92's single-bit ECC, not XID 63's remap record), or a node lost, in production (between audits). On main every
    critical event counted, burn-ins included: a leaking GPU's XID 92s tripled the checkpoint cadence, and two
    identical demo burn-ins changed the advice."""
    with History(tmp_path / store.FILE_NAME) as h:
        for day in range(4):  # nightly audits of a node whose GPU leaks: XID 92 (warning), XID 63 (contained)
            events = [T0 + (day - 1) * DAY + 3600] if day else []
            xid, severity = (92, "warning") if day % 2 else (63, "critical")
            h.record(run("a%d" % day, T0 + day * DAY), [node("leak", T0 + day * DAY, xids=events, xid=xid,
                                                             severity=severity)])
        obs = h.failure_observations(30, now=T0 + 4 * DAY)
        assert obs["failures"] == 0 and obs["gpu_hours"] == 2 * 24 * 3
        # burn-ins (two identical demo runs, their faults included) are not production: nothing changes
        for i in (0, 1):
            h.record(run("burn%d" % i, T0 + 3.5 * DAY + i, playbook="burn_in"),
                     [node("demo", T0 + 3.5 * DAY + i, xids=[T0 + 3.5 * DAY + i], xid=79, severity="critical")])
        assert h.failure_observations(30, now=T0 + 4 * DAY) == obs
        # a GPU lost in production is one
        h.record(run("a9", T0 + 4 * DAY), [node("leak", T0 + 4 * DAY, xids=[T0 + 3.9 * DAY], xid=79,
                                                severity="critical")])
        assert h.failure_observations(30, now=T0 + 4 * DAY)["failures"] == 1
