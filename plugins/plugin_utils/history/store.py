# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The history store: every run's per-node and per-GPU figures and verdicts in one SQLite file (controller side,
stdlib sqlite3).

- The file is ours or refused: SQLite's header, then PRAGMA application_id (GPFH) and user_version (the schema
  version). A random file, a foreign database or one written by a newer gpufleet is refused with a message that
  names the file and what to do; it is never overwritten. An older schema is migrated forward in one transaction.
- WAL journal and a busy timeout: readers never block, and two runs writing at once both land (each run is one
  BEGIN IMMEDIATE transaction; the second waits for the first). A run killed mid-write leaves the file as it was
  before that run (SQLite's atomic commit).
- Tables: hosts, gpus (one row per GPU identity: UUID, else serial, else host+PCI), runs, node_runs (verdict,
  versions, figures, finding codes), gpu_runs (counters and figures of one GPU in one run, indexed by GPU and time),
  xid_events (deduplicated by host and event digest), baselines (a node's own reference figures), node_docs (the
  report's node of burn-ins and preflights, compressed: the evidence a handover sheet shows), lifecycle (each node's
  transitions between healthy, suspect, quarantined, ... with reason, finding, evidence and actor: lifecycle.py).
"""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import time
import urllib.parse
import zlib
from contextlib import contextmanager

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import PASSING
from ansible_collections.kentino.gpufleet.plugins.module_utils.xid_policy import interrupts_job

_PLACES = ", ".join("?" * len(PASSING))
APPLICATION_ID = 0x47504648  # "GPFH"
FILE_NAME = "gpufleet-history.sqlite3"
SQLITE_HEADER = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 120000

# GPU columns of gpu_runs (besides node_run, gpu, ts, idx, verdict), in the order rows are written and exported.
GPU_COLUMNS = (
    "vbios", "inforom", "temperature_c", "power_w", "power_limit_w", "util_pct", "ecc_corr_vol", "ecc_uncorr_vol",
    "ecc_corr_agg", "ecc_uncorr_agg", "retired_sbe", "retired_dbe", "retired_pending", "remap_corr", "remap_uncorr",
    "remap_pending", "remap_failure", "banks_max", "banks_high", "banks_partial", "banks_low", "banks_none",
    "pcie_replays", "pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max", "burn_gflops", "codes",
)
NODE_COLUMNS = ("verdict", "reachable", "stage", "grp", "driver", "dcgm", "kernel", "bios", "board_serial",
                "product", "gpu_count", "codes", "figures", "versions")

# Forward migrations: MIGRATIONS[i] takes the schema from version i to i + 1. Never edit a released step: add one.
MIGRATIONS = (
    # 1: runs, nodes and GPUs with their figures
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
    CREATE TABLE hosts (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
    CREATE TABLE runs (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE, playbook TEXT, started TEXT,
                       finished TEXT, ts REAL NOT NULL, verdict TEXT, nodes INTEGER, interrupted INTEGER DEFAULT 0,
                       recorded_at REAL);
    CREATE INDEX runs_ts ON runs (ts);
    CREATE TABLE node_runs (id INTEGER PRIMARY KEY,
                            run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
                            host INTEGER NOT NULL REFERENCES hosts (id), ts REAL NOT NULL, verdict TEXT NOT NULL,
                            reachable INTEGER NOT NULL, stage TEXT, grp TEXT, driver TEXT, dcgm TEXT, kernel TEXT,
                            bios TEXT, board_serial TEXT, product TEXT, gpu_count INTEGER, codes TEXT, figures TEXT,
                            versions TEXT, UNIQUE (run, host));
    CREATE INDEX node_runs_host_ts ON node_runs (host, ts);
    CREATE TABLE gpus (id INTEGER PRIMARY KEY, host INTEGER NOT NULL REFERENCES hosts (id), ident TEXT NOT NULL,
                       uuid TEXT, serial TEXT, pci TEXT, idx INTEGER, name TEXT, first_ts REAL, last_ts REAL,
                       UNIQUE (host, ident));
    CREATE TABLE gpu_runs (node_run INTEGER NOT NULL REFERENCES node_runs (id) ON DELETE CASCADE,
                           gpu INTEGER NOT NULL REFERENCES gpus (id), ts REAL NOT NULL, idx INTEGER, verdict TEXT,
                           vbios TEXT, inforom TEXT, temperature_c REAL, power_w REAL, power_limit_w REAL,
                           util_pct REAL, ecc_corr_vol INTEGER, ecc_uncorr_vol INTEGER, ecc_corr_agg INTEGER,
                           ecc_uncorr_agg INTEGER, retired_sbe INTEGER, retired_dbe INTEGER, retired_pending INTEGER,
                           remap_corr INTEGER, remap_uncorr INTEGER, remap_pending INTEGER, remap_failure INTEGER,
                           banks_max INTEGER, banks_high INTEGER, banks_partial INTEGER, banks_low INTEGER,
                           banks_none INTEGER, pcie_replays INTEGER, pcie_gen INTEGER, pcie_width INTEGER,
                           pcie_gen_max INTEGER, pcie_width_max INTEGER, burn_gflops REAL, codes TEXT,
                           PRIMARY KEY (gpu, node_run));
    CREATE INDEX gpu_runs_gpu_ts ON gpu_runs (gpu, ts);
    CREATE INDEX gpu_runs_node_run ON gpu_runs (node_run);
    """,
    # 2: XID events (rates per GPU) and each node's own baselines
    """
    CREATE TABLE xid_events (id INTEGER PRIMARY KEY, host INTEGER NOT NULL REFERENCES hosts (id),
                             gpu INTEGER REFERENCES gpus (id), pci TEXT, xid INTEGER, ts REAL, severity TEXT,
                             run INTEGER REFERENCES runs (id) ON DELETE CASCADE, digest TEXT NOT NULL,
                             UNIQUE (host, digest));
    CREATE INDEX xid_events_gpu ON xid_events (gpu, xid, ts);
    CREATE TABLE baselines (host INTEGER NOT NULL REFERENCES hosts (id), gpu INTEGER NOT NULL DEFAULT 0,
                            metric TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '', value REAL NOT NULL,
                            run_id TEXT, ts REAL, PRIMARY KEY (host, gpu, metric, detail));
    """,
    # 3: the report's node of burn-ins and preflights (the handover sheet's evidence)
    """
    CREATE TABLE node_docs (node_run INTEGER PRIMARY KEY REFERENCES node_runs (id) ON DELETE CASCADE,
                            doc BLOB NOT NULL);
    """,
    # 4: each node's lifecycle (history/lifecycle.py): one row per transition, never pruned with the runs
    """
    CREATE TABLE lifecycle (id INTEGER PRIMARY KEY, host INTEGER NOT NULL REFERENCES hosts (id), ts REAL NOT NULL,
                            from_state TEXT NOT NULL, to_state TEXT NOT NULL, reason TEXT NOT NULL, code TEXT,
                            gpu TEXT, evidence TEXT, actor TEXT NOT NULL);
    CREATE INDEX lifecycle_host_ts ON lifecycle (host, ts);
    """,
    # 5: the fabric search's pair figures per link (a, b: the two nodes' names, a < b), for each link's own median
    """
    CREATE TABLE fabric_links (run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE, a TEXT NOT NULL,
                               b TEXT NOT NULL, ts REAL NOT NULL, busbw_gbps REAL NOT NULL);
    CREATE INDEX fabric_links_link_ts ON fabric_links (a, b, ts);
    """,
    # 6: the ticket each fault opened through the webhook (plugin_utils/tickets.py): a repeat within a day updates it
    """
    CREATE TABLE tickets (id INTEGER PRIMARY KEY, host INTEGER NOT NULL REFERENCES hosts (id), code TEXT NOT NULL,
                          gpu TEXT NOT NULL DEFAULT '', tracker TEXT NOT NULL, ticket TEXT NOT NULL,
                          created REAL NOT NULL, updated REAL NOT NULL, updates INTEGER NOT NULL DEFAULT 0);
    CREATE INDEX tickets_host_code ON tickets (host, code, gpu, updated);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
# The runs that watch nodes in production: their time is the checkpoint plan's GPU-hours, their XIDs its interruptions.
PRODUCTION_PLAYBOOKS = ("audit",)


class HistoryError(Exception):
    """The history cannot be used as asked: the message names the file, what is wrong and what to do. kind: damaged
    (SQLite finds the file malformed: never written into), access (a healthy file this process cannot write or read:
    read-only mount, permissions), refused (not ours, newer, missing) or failed (a write failed for another reason)."""

    def __init__(self, message, kind="refused"):
        super().__init__(message)
        self.kind = kind


# SQLite's result codes (sqlite3.Error.sqlite_errorname) that say the file or its directory cannot be used as asked,
# never that its contents are wrong.
ACCESS_CODES = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH")
DAMAGED_CODES = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
BUSY_CODES = ("SQLITE_BUSY", "SQLITE_LOCKED")
DAMAGED_FIX = ("restore it from a backup, or move it away (the next run starts a new history); nothing is written "
               "into a damaged file")


def default_path(history_dir):
    return os.path.join(os.path.expanduser(str(history_dir)), FILE_NAME)


def run_path(report_dir, history_dir=None):
    """The history file of a run: in history_dir (gpufleet_history_dir) when set, else <report_dir>/history."""
    return default_path(history_dir or os.path.join(os.path.expanduser(str(report_dir or "reports")), "history"))


def _is_damage(exc):
    """Whether an sqlite3 error means the file is damaged (not an I/O error, a full disk or a lock)."""
    code = getattr(exc, "sqlite_errorname", None)
    if code:  # Python 3.11 and later
        return code in DAMAGED_CODES
    return "malformed" in str(exc) or "not a database" in str(exc)  # SQLite's texts for CORRUPT and NOTADB


def _refuse(path, why, fix, kind="refused"):
    raise HistoryError("history %s: %s; %s (the file is left as it is)" % (path, why, fix), kind)


def _uri(path, readonly, immutable=False):
    """The file's SQLite URI: the path quoted whole (a directory named `%41` or `a#b` is that directory), and its
    parameters."""
    params = (["mode=ro"] if readonly else []) + (["immutable=1"] if immutable else [])
    return "file:%s%s" % (urllib.parse.quote(path), "?" + "&".join(params) if params else "")


def _existing(directory):
    """The directory, or its nearest ancestor that exists (where a missing history directory would be created)."""
    while directory and not os.path.exists(directory) and os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)
    return directory


def write_problem(path):
    """(why, fix) when this process cannot write the history at `path` (the file, and its directory, where SQLite
    keeps its -wal and -shm files): a read-only file system or missing permissions. None when it can."""
    directory = _existing(os.path.dirname(path))
    other = "or point gpufleet_history_dir at a directory this user can write"
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return ("cannot be written: %s is on a read-only file system (the file itself may be fine)" % directory,
                    "remount it read-write, " + other)
    except OSError:
        pass
    if not os.path.isdir(directory):
        return "cannot create its directory: %s is not a directory" % directory, "move that file away, " + other
    for target in [p for p in (path, directory) if os.path.exists(p)]:
        if not os.access(target, os.W_OK | (os.X_OK if os.path.isdir(target) else 0)):
            return ("cannot be written: no write permission on %s for uid %d (the file itself may be fine)" % (
                target, os.getuid()), "give this user write access to the file and its directory (SQLite writes "
                    "its -wal and -shm files beside it), run as the history's owner, " + other)
    return None


def _check_file(path):
    """Refuse what is not a gpufleet history before SQLite touches it (SQLite would happily 'open' a text file)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(100)
    except OSError as exc:
        _refuse(path, "cannot be read (%s)" % (exc.strerror or exc), "fix its permissions or gpufleet_history_dir",
                "access")
    if head and not head.startswith(SQLITE_HEADER):
        _refuse(path, "is not an SQLite database (it starts with %r)" % head[:16],
                "move it away or point gpufleet_history_dir elsewhere")
    if len(head) >= 72:
        app_id = int.from_bytes(head[68:72], "big")
        if app_id not in (0, APPLICATION_ID):
            _refuse(path, "is an SQLite database of another application (application_id 0x%08x)" % app_id,
                    "point gpufleet_history_dir at a directory of its own")


class History:
    """One open history file. Use as a context manager, or call close().

    Opening checks the whole file (PRAGMA quick_check: every page read once, no index cross-check), so a damaged
    file is refused before anything reads or writes it; a write that fails runs the full integrity_check to tell
    damage from other faults. A writer refuses at once where it cannot write (read-only mount, permissions)."""

    def __init__(self, path, create=True, readonly=False):
        self.path = os.path.abspath(os.path.expanduser(str(path)))
        self.db = None
        exists = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        if not exists and (readonly or not create):
            raise HistoryError("history %s does not exist yet: it is written by the first run with history enabled"
                               % self.path)
        if not readonly:
            problem = write_problem(self.path)
            if problem:
                _refuse(self.path, problem[0], problem[1], "access")
        if exists:
            _check_file(self.path)
        else:
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
            except OSError as exc:
                _refuse(self.path, "cannot create its directory (%s)" % (exc.strerror or exc),
                        "point gpufleet_history_dir at a directory this user can write", "access")
        # A reader that cannot create SQLite's -shm file beside a WAL file (a read-only mount, another user's
        # directory) opens it immutable when no writer is at work (no -wal file): SQLite refuses it otherwise.
        immutable = readonly and not os.path.exists(self.path + "-wal") and write_problem(self.path) is not None
        try:
            self.db = sqlite3.connect(_uri(self.path, readonly, immutable), uri=True,
                                      timeout=BUSY_TIMEOUT_MS / 1000.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._failure(exc, "cannot be opened") from exc
        self.db.row_factory = sqlite3.Row
        try:
            self.db.execute("PRAGMA busy_timeout = %d" % BUSY_TIMEOUT_MS)
            self.db.execute("PRAGMA foreign_keys = ON")
            # Check first, change nothing until the file is known to be ours and whole (even WAL mode rewrites the
            # header).
            current = self._check_schema(readonly)
            self._check_integrity("quick_check", "")
            if not readonly:
                self._use_wal()
                self.db.execute("PRAGMA synchronous = NORMAL")
                if current < SCHEMA_VERSION:
                    self.migrate()
        except HistoryError:
            self.db.close()
            raise
        except sqlite3.Error as exc:
            failure = self._failure(exc, "cannot be opened")
            self.db.close()
            raise failure from exc

    def _use_wal(self):
        """Switch the file to WAL unless it is already. SQLite answers that switch with "database is locked" at once,
        without waiting out the busy timeout, when it meets another run's lock (two runs creating the file together):
        retried here until the busy timeout, as every other statement waits."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000.0
        while True:
            try:
                if self.db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    self.db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                # (Python 3.10, a controller ansible-core 2.17 supports, has no sqlite_errorname: SQLite's text)
                busy = getattr(exc, "sqlite_errorname", "") in BUSY_CODES or "locked" in str(exc)
                if not busy or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _check_integrity(self, pragma, consequence):
        """HistoryError (damaged) unless PRAGMA quick_check / integrity_check says ok; SQLite's first lines quoted."""
        try:
            lines = [r[0] for r in self.db.execute("PRAGMA %s(5)" % pragma)]
        except sqlite3.DatabaseError as exc:
            if not _is_damage(exc):  # the check itself could not run: that says nothing about the file
                _refuse(self.path, "could not be checked (PRAGMA %s: %s)%s" % (pragma, exc, consequence),
                        "the file may be whole: look at the disk, the mount and this process's limits, then run "
                        "again", "failed")
            lines = [str(exc)]
        if lines != ["ok"]:
            found = [" ".join(part.split()) for line in lines for part in line.splitlines()
                     if not part.startswith("*** in database")]  # SQLite's heading of a multi-database report
            _refuse(self.path, "is damaged (PRAGMA %s: %s)%s" % (pragma, "; ".join(found[:3]), consequence),
                    DAMAGED_FIX, "damaged")

    def _failure(self, exc, doing, consequence=""):
        """The HistoryError for an sqlite3 error: damage, a file this process cannot use, or the fault itself."""
        code = getattr(exc, "sqlite_errorname", "")
        if code in ACCESS_CODES:
            problem = write_problem(self.path)
            if problem:
                return HistoryError("history %s: %s%s; %s (the file is left as it is)" % (
                    self.path, problem[0], consequence, problem[1]), "access")
            return HistoryError("history %s %s (%s)%s; check that this user can read it and write its directory "
                                "(or gpufleet_history_dir)" % (self.path, doing, exc, consequence), "access")
        if code == "SQLITE_FULL":
            return HistoryError("history %s %s: the disk is full (%s)%s; free space there" % (
                self.path, doing, exc, consequence), "failed")
        if code in BUSY_CODES:
            return HistoryError("history %s %s: another process held it for more than %d s (%s)%s; run again when "
                                "it is done" % (self.path, doing, BUSY_TIMEOUT_MS // 1000, exc, consequence),
                                "failed")
        if self.db is not None:
            try:
                self._check_integrity("integrity_check", consequence)
            except HistoryError as checked:
                if checked.kind == "damaged":
                    return checked
        if code.startswith("SQLITE_IOERR") or (not code and "disk I/O error" in str(exc)):
            return HistoryError("history %s %s (%s)%s; the file may be whole: look at the disk, the mount and this "
                                "process's limits (a file size limit, ulimit -f, makes SQLite's writes of its "
                                "shared-memory file fail this way), then run again" % (self.path, doing, exc,
                                                                                      consequence), "failed")
        if code in DAMAGED_CODES:
            return HistoryError("history %s: is damaged (%s)%s; %s (the file is left as it is)" % (
                self.path, exc, consequence, DAMAGED_FIX), "damaged")
        return HistoryError("history %s %s (%s: %s)%s; `sqlite3 FILE 'PRAGMA integrity_check'` says whether the file"
                            " is whole" % (self.path, doing, type(exc).__name__, exc, consequence), "failed")

    @contextmanager
    def _writing(self):
        """A write: any SQLite error becomes a HistoryError that says why (integrity_check tells damage apart)."""
        try:
            yield
        except sqlite3.Error as exc:
            raise self._failure(exc, "could not be written", "; this run is not recorded") from exc

    # ---- schema ----------------------------------------------------------------------------------------------
    def _check_schema(self, readonly):
        """The file's schema version, or HistoryError when the file is not ours or cannot be used as asked."""
        # One read transaction: another run creating the file commits its tables and its application_id at once, and
        # three separate reads could see the id before that commit and the tables after it ("not a gpufleet history").
        self.db.execute("BEGIN")
        try:
            app_id = self.db.execute("PRAGMA application_id").fetchone()[0]
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            tables = [r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        except BaseException:
            # SQLite may have ended the transaction itself (an I/O error does): a COMMIT here would raise "no
            # transaction is active" and hide the error that says what happened.
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        if app_id != APPLICATION_ID:
            if app_id != 0 or tables:
                _refuse(self.path, "is an SQLite database but not a gpufleet history (application_id 0x%08x, tables "
                        "%s)" % (app_id, ", ".join(sorted(tables)[:5]) or "none"),
                        "point gpufleet_history_dir at a directory of its own")
        if version > SCHEMA_VERSION:
            _refuse(self.path, "was written by a newer kentino.gpufleet (schema %d, this one knows %d)" % (
                version, SCHEMA_VERSION), "upgrade the collection on this controller")
        if version < SCHEMA_VERSION and readonly:
            _refuse(self.path, "has schema %d, older than %d" % (version, SCHEMA_VERSION),
                    "run an audit (or `gpufleet history --migrate`) to migrate it")
        return version

    def migrate(self):
        """Run the missing migrations forward, in one transaction that also re-checks the version (two processes
        opening an old file at once migrate it once)."""
        with self.transaction():
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            for step in range(version, SCHEMA_VERSION):
                for statement in [s.strip() for s in MIGRATIONS[step].split(";") if s.strip()]:
                    self.db.execute(statement)
            if version == 0:
                self.db.execute("INSERT OR REPLACE INTO meta VALUES ('created_at', ?)", (str(time.time()),))
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('migrated_from', ?)", (str(version),))
            self.db.execute("PRAGMA application_id = %d" % APPLICATION_ID)
            self.db.execute("PRAGMA user_version = %d" % SCHEMA_VERSION)

    def version(self):
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    @contextmanager
    def transaction(self):
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the transaction is gone already (SQLite rolls back on some errors): the first error counts
            raise
        self.db.execute("COMMIT")

    def close(self):
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def integrity(self):
        return [r[0] for r in self.db.execute("PRAGMA integrity_check")]

    # ---- writing ---------------------------------------------------------------------------------------------
    def _host_id(self, name):
        row = self.db.execute("SELECT id FROM hosts WHERE name = ?", (name,)).fetchone()
        if row:
            return row[0]
        return self.db.execute("INSERT INTO hosts (name) VALUES (?)", (name,)).lastrowid

    def _gpu_ids(self, host_id, gpus):
        """{ident: gpu id} for a node's GPUs: known identities updated where their slot or name changed (a GPU moved
        to another index or PCI address), new ones inserted; last_ts in one statement per node."""
        known = dict((r[0], tuple(r[1:])) for r in self.db.execute(
            "SELECT ident, id, pci, idx, name, serial FROM gpus WHERE host = ?", (host_id,)))
        out = {}
        for gpu in gpus:
            ident = ident_of(gpu)
            row = known.get(ident)
            if row is None:
                out[ident] = self.db.execute(
                    "INSERT INTO gpus (host, ident, uuid, serial, pci, idx, name, first_ts, last_ts) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?)", (host_id, ident, gpu.get("uuid"), gpu.get("serial"), gpu.get("pci"),
                                                     gpu.get("idx"), gpu.get("name"), gpu["ts"], gpu["ts"])).lastrowid
                continue
            out[ident] = row[0]
            if row[1:] != (gpu.get("pci"), gpu.get("idx"), gpu.get("name") or row[3], gpu.get("serial") or row[4]):
                self.db.execute("UPDATE gpus SET pci = ?, idx = ?, name = COALESCE(?, name), serial = COALESCE(?, "
                                "serial) WHERE id = ?", (gpu.get("pci"), gpu.get("idx"), gpu.get("name"),
                                                         gpu.get("serial"), row[0]))
        if gpus:
            self.db.execute("UPDATE gpus SET last_ts = MAX(COALESCE(last_ts, 0), ?) WHERE host = ? AND id IN (%s)" % (
                ", ".join("?" * len(out))), [max(g["ts"] for g in gpus), host_id] + list(out.values()))
        return out

    def record(self, run, nodes):
        """Write one run: run = {run_id, playbook, started, finished, ts, verdict, interrupted, fabric_links: [{a, b,
        busbw_gbps}] (a fabric search's figures)}; nodes = [{host, ts,
        <NODE_COLUMNS>, gpus: [{uuid, serial, pci, idx, name, ts, verdict, <GPU_COLUMNS>}], xids: [{pci, xid, ts,
        severity, digest}], baselines: [{metric, detail, gpu_pci or None, value}], doc: dict or None}].
        A run already recorded (same run_id) is replaced. Returns the number of GPU rows written."""
        gpu_rows = 0
        with self._writing(), self.transaction():
            self.db.execute("DELETE FROM runs WHERE run_id = ?", (run["run_id"],))
            run_pk = self.db.execute(
                "INSERT INTO runs (run_id, playbook, started, finished, ts, verdict, nodes, interrupted, recorded_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run["run_id"], run.get("playbook"), run.get("started"), run.get("finished"), run["ts"],
                 run.get("verdict"), len(nodes), 1 if run.get("interrupted") else 0, time.time())).lastrowid
            self.db.executemany("INSERT INTO fabric_links (run, a, b, ts, busbw_gbps) VALUES (?, ?, ?, ?, ?)",
                                [(run_pk, link["a"], link["b"], run["ts"], float(link["busbw_gbps"]))
                                 for link in run.get("fabric_links") or []])
            for node in nodes:
                host_id = self._host_id(node["host"])
                values = [_cell(node.get(c)) for c in NODE_COLUMNS]
                for i, c in enumerate(NODE_COLUMNS):
                    if c in ("figures", "versions") and values[i] is not None:
                        values[i] = json.dumps(values[i], sort_keys=True)
                node_pk = self.db.execute(
                    "INSERT INTO node_runs (run, host, ts, %s) VALUES (?, ?, ?, %s)" % (
                        ", ".join(NODE_COLUMNS), ", ".join("?" * len(NODE_COLUMNS))),
                    [run_pk, host_id, node["ts"]] + values).lastrowid
                gpu_ids = {}
                rows = []
                ids = self._gpu_ids(host_id, node.get("gpus") or [])
                for gpu in node.get("gpus") or []:
                    gpu_id = ids[ident_of(gpu)]
                    gpu_ids[gpu.get("pci")] = gpu_id
                    rows.append([node_pk, gpu_id, gpu["ts"], gpu.get("idx"), gpu.get("verdict")]
                                + [_cell(gpu.get(c)) for c in GPU_COLUMNS])
                self.db.executemany("INSERT OR REPLACE INTO gpu_runs (node_run, gpu, ts, idx, verdict, %s) VALUES "
                                    "(?, ?, ?, ?, ?, %s)" % (", ".join(GPU_COLUMNS), ", ".join("?" * len(GPU_COLUMNS))),
                                    rows)
                gpu_rows += len(rows)
                for event in node.get("xids") or []:
                    self.db.execute("INSERT OR IGNORE INTO xid_events (host, gpu, pci, xid, ts, severity, run, digest)"
                                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                    (host_id, gpu_ids.get(event.get("pci")) or self._known_gpu(host_id, event),
                                     event.get("pci"), event.get("xid"), event.get("ts"), event.get("severity"),
                                     run_pk, event["digest"]))
                for base in node.get("baselines") or []:
                    gpu_id = gpu_ids.get(base.get("gpu_pci")) if base.get("gpu_pci") else 0
                    if gpu_id is None:
                        continue
                    self.db.execute("INSERT OR REPLACE INTO baselines (host, gpu, metric, detail, value, run_id, ts) "
                                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                                    (host_id, gpu_id, base["metric"], base.get("detail") or "", base["value"],
                                     run["run_id"], node["ts"]))
                if node.get("doc") is not None:
                    self.db.execute("INSERT INTO node_docs (node_run, doc) VALUES (?, ?)", (
                        node_pk, zlib.compress(json.dumps(node["doc"], sort_keys=True).encode("utf-8"), 6)))
        return gpu_rows

    def link_figures(self, a, b, before_ts=None, limit=20):
        """The latest `limit` figures (GB/s) of the link between nodes a and b, newest first, before before_ts."""
        a, b = sorted((a, b))
        return [r[0] for r in self.db.execute(
            "SELECT busbw_gbps FROM fabric_links WHERE a = ? AND b = ? AND ts < ? ORDER BY ts DESC LIMIT ?",
            (a, b, before_ts if before_ts is not None else float("inf"), limit))]

    def _known_gpu(self, host_id, event):
        if not event.get("pci"):
            return None
        row = self.db.execute("SELECT id FROM gpus WHERE host = ? AND pci = ? ORDER BY last_ts DESC LIMIT 1",
                              (host_id, event["pci"])).fetchone()
        return row[0] if row else None

    def change_lifecycle(self, host, decide):
        """Add a node's lifecycle transitions atomically: decide(rows) gets the node's transitions so far (oldest
        first, as lifecycle_of returns them) inside one write transaction, so two triggers at once see each other,
        and returns the new rows ({ts, from_state, to_state, reason, code, gpu, evidence, actor}). Returns them."""
        with self._writing(), self.transaction():
            rows = self.lifecycle_of(host)
            new = decide(rows)
            host_id = self._host_id(host) if new else None
            for row in new:
                self.db.execute(
                    "INSERT INTO lifecycle (host, ts, from_state, to_state, reason, code, gpu, evidence, actor) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?)", (host_id, row["ts"], row["from_state"], row["to_state"],
                                                    row["reason"], row.get("code"), row.get("gpu"),
                                                    json.dumps(list(row.get("evidence") or [])), row["actor"]))
        return new

    def ticket_of(self, host, code, gpu, since):
        """The newest ticket of this fault (node, finding code, GPU) updated at or after `since`, or None."""
        row = self.db.execute(
            "SELECT t.tracker, t.ticket, t.created, t.updated, t.updates FROM tickets t JOIN hosts h ON h.id = t.host "
            "WHERE h.name = ? AND t.code = ? AND t.gpu = ? AND t.updated >= ? ORDER BY t.updated DESC, t.id DESC "
            "LIMIT 1", (host, code, gpu or "", since)).fetchone()
        return dict(row) if row else None

    def record_ticket(self, host, code, gpu, tracker, ticket, now, update):
        """Keep a fault's ticket: a new row when it was created, its update time and count when it was updated."""
        with self._writing(), self.transaction():
            host_id = self._host_id(host)
            if update:
                self.db.execute("UPDATE tickets SET updated = ?, updates = updates + 1 WHERE host = ? AND code = ? "
                                "AND gpu = ? AND tracker = ? AND ticket = ?", (now, host_id, code, gpu or "", tracker,
                                                                               ticket))
            else:
                self.db.execute("INSERT INTO tickets (host, code, gpu, tracker, ticket, created, updated) VALUES "
                                "(?, ?, ?, ?, ?, ?, ?)", (host_id, code, gpu or "", tracker, ticket, now, now))

    def lifecycle_of(self, host):
        """A node's lifecycle transitions, oldest first (evidence as a list)."""
        rows = self.db.execute(
            "SELECT l.ts, l.from_state, l.to_state, l.reason, l.code, l.gpu, l.evidence, l.actor FROM lifecycle l "
            "JOIN hosts h ON h.id = l.host WHERE h.name = ? ORDER BY l.ts, l.id", (host,))
        out = []
        for r in rows:
            item = dict(r)
            try:
                item["evidence"] = json.loads(item["evidence"] or "[]")
            except ValueError:
                item["evidence"] = [item["evidence"]]
            out.append(item)
        return out

    def prune(self, days, now=None):
        """Delete runs older than `days` (their node and GPU rows and XID events go with them). Returns the count."""
        if not days or days <= 0:
            return 0
        cutoff = (now or time.time()) - days * 86400.0
        with self._writing(), self.transaction():
            count = self.db.execute("DELETE FROM runs WHERE ts < ?", (cutoff,)).rowcount
            self.db.execute("DELETE FROM gpus WHERE last_ts < ? AND id NOT IN (SELECT gpu FROM gpu_runs) "
                            "AND id NOT IN (SELECT gpu FROM baselines)", (cutoff,))
        return count

    # ---- reading ---------------------------------------------------------------------------------------------
    def host_id(self, name):
        row = self.db.execute("SELECT id FROM hosts WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    def gpu_id(self, host, ident):
        row = self.db.execute("SELECT g.id FROM gpus g JOIN hosts h ON h.id = g.host WHERE h.name = ? AND "
                              "g.ident = ?", (host, ident)).fetchone()
        return row[0] if row else None

    def xid_events(self, gpu_id, xids, since=None):
        """[(ts, digest)] of the GPU's events of the given XID codes, oldest first."""
        xids = [int(x) for x in xids] or [-1]
        rows = self.db.execute("SELECT ts, digest FROM xid_events WHERE gpu = ? AND xid IN (%s) AND ts >= ? ORDER BY "
                               "ts" % ", ".join("?" * len(xids)),
                               [gpu_id] + xids + [since if since is not None else -1e18])
        return [(r[0], r[1]) for r in rows if r[0] is not None]

    def gpus_of(self, host, index=None):
        """GPU identities of a host (newest first), optionally only those last seen at nvidia-smi index `index`."""
        sql = ("SELECT g.* FROM gpus g JOIN hosts h ON h.id = g.host WHERE h.name = ?" +
               (" AND g.idx = ?" if index is not None else "") + " ORDER BY g.last_ts DESC")
        return [dict(r) for r in self.db.execute(sql, (host,) if index is None else (host, index))]

    def gpu_series(self, gpu_id, since=None, until=None):
        """Rows of one GPU identity, oldest first."""
        rows = self.db.execute("SELECT * FROM gpu_runs WHERE gpu = ? AND ts >= ? AND ts <= ? ORDER BY ts",
                               (gpu_id, since if since is not None else -1e18,
                                until if until is not None else 1e18))
        return [dict(r) for r in rows]

    def xid_times(self, gpu_id, xid, since=None):
        rows = self.db.execute("SELECT ts FROM xid_events WHERE gpu = ? AND xid = ? AND ts >= ? ORDER BY ts",
                               (gpu_id, xid, since if since is not None else -1e18))
        return [r[0] for r in rows if r[0] is not None]

    def node_runs(self, host, limit=50, playbook=None, before_ts=None):
        """A host's node rows with their run id and playbook, newest first."""
        sql = ("SELECT n.*, r.run_id, r.playbook FROM node_runs n JOIN runs r ON r.id = n.run JOIN hosts h ON "
               "h.id = n.host WHERE h.name = ?")
        args = [host]
        if playbook:
            sql += " AND r.playbook = ?"
            args.append(playbook)
        if before_ts is not None:
            sql += " AND n.ts < ?"
            args.append(before_ts)
        sql += " ORDER BY n.ts DESC LIMIT ?"
        args.append(limit)
        return [_node_row(r) for r in self.db.execute(sql, args)]

    def gpu_rows_of(self, node_run_id):
        rows = self.db.execute("SELECT gr.*, g.uuid, g.serial, g.pci, g.name FROM gpu_runs gr JOIN gpus g ON "
                               "g.id = gr.gpu WHERE gr.node_run = ? ORDER BY gr.idx", (node_run_id,))
        return [dict(r) for r in rows]

    def last_pass(self, host):
        """ts of the host's newest passing run (findings.PASSING: what the default gate lets through), or None."""
        row = self.db.execute("SELECT MAX(n.ts) FROM node_runs n JOIN hosts h ON h.id = n.host WHERE h.name = ? AND "
                              "n.verdict IN (%s)" % _PLACES, (host,) + PASSING).fetchone()
        return row[0] if row else None

    def latest_versions(self, since_ts):
        """{host: (grp, versions dict)} from each host's newest reachable run since since_ts."""
        rows = self.db.execute(
            "SELECT h.name, n.grp, n.versions, n.ts FROM node_runs n JOIN hosts h ON h.id = n.host "
            "WHERE n.reachable = 1 AND n.versions IS NOT NULL AND n.ts >= ? ORDER BY n.ts", (since_ts,))
        out = {}
        for r in rows:
            out[r[0]] = (r[1], json.loads(r[2]))
        return out

    def baselines(self, host):
        """{(gpu identity or '', metric, detail): {value, run_id, ts, samples, last}}: the baseline row marks where
        the node's baseline started (its first good burn-in, or the last reset) with that run's value; samples are
        the figures the burn-ins since then recorded as good (records' figures["baseline"] entries [ident, metric,
        detail, value, state]), oldest first; last is the state of the newest recorded figure (any playbook). A
        history without such entries gives the row's value alone."""
        rows = self.db.execute(
            "SELECT b.*, g.ident FROM baselines b JOIN hosts h ON h.id = b.host LEFT JOIN gpus g ON g.id = b.gpu "
            "WHERE h.name = ?", (host,))
        out = {(r["ident"] or "", r["metric"], r["detail"]): {"value": r["value"], "run_id": r["run_id"],
                                                             "ts": r["ts"], "samples": [], "last": None} for r in rows}
        if not out:
            return out
        since = min(b["ts"] if b["ts"] is not None else -1e18 for b in out.values())
        runs = self.db.execute(
            "SELECT n.ts, n.figures, r.playbook FROM node_runs n JOIN runs r ON r.id = n.run JOIN hosts h ON "
            "h.id = n.host WHERE h.name = ? AND n.ts >= ? AND n.figures IS NOT NULL ORDER BY n.ts", (host, since))
        for ts, figures, playbook in runs:
            try:
                entries = json.loads(figures).get("baseline") or []
            except (ValueError, AttributeError):
                continue
            for entry in entries:
                if not isinstance(entry, list) or len(entry) != 5:
                    continue
                base = out.get((entry[0], entry[1], entry[2]))
                if base is None or (base["ts"] is not None and ts < base["ts"]):
                    continue
                base["last"] = entry[4]
                if entry[4] == "ok" and playbook == "burn_in" and isinstance(entry[3], (int, float)):
                    base["samples"].append(entry[3])
        return out

    def latest_of_group(self, playbook, grp):
        """Each host's newest node row of `playbook` among the hosts whose newest such row is in group `grp`."""
        rows = self.db.execute(
            "SELECT n.*, h.name AS host_name, r.run_id FROM node_runs n JOIN runs r ON r.id = n.run "
            "JOIN hosts h ON h.id = n.host WHERE r.playbook = ? AND n.grp = ? AND n.reachable = 1 AND n.ts = "
            "(SELECT MAX(n2.ts) FROM node_runs n2 JOIN runs r2 ON r2.id = n2.run WHERE n2.host = n.host AND "
            "r2.playbook = ? AND n2.reachable = 1)", (playbook, grp, playbook))
        return [_node_row(r) for r in rows]

    def node_doc(self, node_run_id):
        row = self.db.execute("SELECT doc FROM node_docs WHERE node_run = ?", (node_run_id,)).fetchone()
        return json.loads(zlib.decompress(row[0]).decode("utf-8")) if row else None

    def runs(self, limit=20):
        return [dict(r) for r in self.db.execute("SELECT * FROM runs ORDER BY ts DESC LIMIT ?", (limit,))]

    def hosts(self):
        return [r[0] for r in self.db.execute("SELECT name FROM hosts ORDER BY name")]

    def fleet_summary(self, now=None, stale_days=2.0):
        """One row per host: its newest run (verdict, when, playbook), its newest passing run (pass_ts: what the
        default gate lets through, findings.PASSING; never merely a run it answered), and whether it is stale (not
        reached for stale_days: seen_ts is its newest reachable run)."""
        now = now or time.time()
        out = []
        for row in self.db.execute(
                "SELECT h.name, n.verdict, n.ts, r.run_id, r.playbook, n.gpu_count, n.codes, "
                "(SELECT MAX(n2.ts) FROM node_runs n2 WHERE n2.host = h.id AND n2.verdict IN (%s)) AS pass_ts, "
                "(SELECT MAX(n4.ts) FROM node_runs n4 WHERE n4.host = h.id AND n4.reachable = 1) AS seen_ts "
                "FROM hosts h JOIN node_runs n ON n.id = (SELECT n3.id FROM node_runs n3 WHERE n3.host = h.id "
                "ORDER BY n3.ts DESC LIMIT 1) JOIN runs r ON r.id = n.run ORDER BY h.name" % _PLACES, PASSING):
            item = dict(row)
            item["stale"] = item["seen_ts"] is None or now - item["seen_ts"] >= stale_days * 86400.0
            out.append(item)
        return out

    def failure_observations(self, days, now=None, max_gap_days=2.0, incident_s=3600.0):
        """The fleet's own interruption rate for the checkpoint plan (plugin_utils/cadence.py, `gpufleet plan`):
        {failures, gpu_hours, window_days}, or None before any GPU-hour is known. The one definition of an
        interruption (docs/training.md), counted in production only, i.e. between audits (PRODUCTION_PLAYBOOKS; a
        burn-in or preflight provokes faults before production, and its reruns must not change the plan):
        GPU-hours: each host's GPUs times the time between its consecutive audits in the window, a gap capped at
        max_gap_days (an unaudited week is not known to have been up). Failures: incidents that stop a job, i.e. an
        XID that interrupts a job (xid_policy.interrupts_job: critical and not contained; one incident per hour per
        GPU: a burst is one failure) logged in that time, and a host that went from reachable to unreachable."""
        now = now or time.time()
        since = now - days * 86400.0
        gpu_hours = 0.0
        failures = 0
        first = None
        previous = {}
        production = ", ".join("?" * len(PRODUCTION_PLAYBOOKS))
        for host, ts, gpus, reachable in self.db.execute(
                "SELECT n.host, n.ts, n.gpu_count, n.reachable FROM node_runs n JOIN runs r ON r.id = n.run "
                "WHERE n.ts >= ? AND r.playbook IN (%s) ORDER BY n.host, n.ts" % production,
                (since,) + PRODUCTION_PLAYBOOKS):
            first = ts if first is None else min(first, ts)
            last = previous.get(host)
            if last is not None:
                gpu_hours += (last[1] or 0) * min(ts - last[0], max_gap_days * 86400.0) / 3600.0
                failures += 1 if last[2] and not reachable else 0
            previous[host] = (ts, gpus if reachable else last[1] if last else gpus, reachable)
        incidents = set()
        for host, gpu, pci, ts, xid, severity in self.db.execute(
                "SELECT e.host, e.gpu, e.pci, e.ts, e.xid, e.severity FROM xid_events e JOIN runs r ON r.id = e.run "
                "WHERE e.ts >= ? AND r.playbook IN (%s) ORDER BY e.ts" % production,
                (max(since, first or now),) + PRODUCTION_PLAYBOOKS):
            if not interrupts_job(xid, severity):
                continue
            key = (host, gpu if gpu is not None else pci)
            if not any((key, bucket) in incidents for bucket in (int(ts // incident_s) - 1, int(ts // incident_s))):
                incidents.add((key, int(ts // incident_s)))
        failures += len(incidents)
        if gpu_hours <= 0:
            return None
        return {"failures": failures, "gpu_hours": round(gpu_hours, 1),
                "window_days": round((now - first) / 86400.0, 1)}

    # ---- export ----------------------------------------------------------------------------------------------
    def export_rows(self, since=None, host=None):
        """Every GPU row joined with its node and run (for CSV/JSON export), oldest first."""
        sql = ("SELECT r.run_id, r.playbook, h.name AS host, n.verdict AS node_verdict, n.driver, n.dcgm, n.kernel, "
               "g.uuid, g.serial, g.pci, gr.* FROM gpu_runs gr JOIN node_runs n ON n.id = gr.node_run JOIN runs r ON "
               "r.id = n.run JOIN hosts h ON h.id = n.host JOIN gpus g ON g.id = gr.gpu WHERE gr.ts >= ?")
        args = [since if since is not None else -1e18]
        if host:
            sql += " AND h.name = ?"
            args.append(host)
        for row in self.db.execute(sql + " ORDER BY gr.ts, h.name, gr.idx", args):
            item = dict(row)
            item.pop("node_run", None)
            item.pop("gpu", None)
            yield item

    def export(self, fmt, out, since=None, host=None):
        """Write the GPU rows as CSV or JSON lines to the text stream `out`; returns the row count."""
        count = 0
        writer = None
        for item in self.export_rows(since, host):
            if fmt == "csv":
                if writer is None:
                    writer = csv.DictWriter(out, fieldnames=list(item))
                    writer.writeheader()
                writer.writerow({k: _csv_cell(v) for k, v in item.items()})
            elif fmt == "json":
                out.write(json.dumps(item, sort_keys=True) + "\n")
            else:
                raise HistoryError("export format must be csv or json, got %r" % fmt)
            count += 1
        return count


def _csv_cell(value):
    """A text value a spreadsheet would run as a formula (a GPU serial or VBIOS string from the node that starts with
    = + - @, a tab or a carriage return) is written with a leading apostrophe, as OWASP advises for CSV files: the
    sheet shows the text. Numbers are numbers; JSON export keeps every value as it is."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _cell(value):
    """A value SQLite can hold: an integer outside 64 bits or a float that is not finite (garbage from a node) is
    stored as unknown rather than failing the whole run's write."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and not -(1 << 63) <= value < (1 << 63):
        return None
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def ident_of(gpu):
    """A GPU's identity across runs: its UUID, else its board serial, else its PCI slot on the host."""
    if gpu.get("uuid"):
        return gpu["uuid"]
    if gpu.get("serial"):
        return "serial:" + gpu["serial"]
    return "pci:%s" % (gpu.get("pci") or gpu.get("idx"))


def _node_row(row):
    item = dict(row)
    for key in ("figures", "versions"):
        if item.get(key):
            try:
                item[key] = json.loads(item[key])
            except ValueError:
                item[key] = None
    item["codes"] = [c for c in (item.get("codes") or "").split(",") if c]
    return item


def export_text(path, fmt, since=None, host=None):
    """The export as one string (small histories, tests)."""
    buf = io.StringIO()
    with History(path, readonly=True) as history:
        history.export(fmt, buf, since, host)
    return buf.getvalue()
