# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The XID watcher: follows the kernel log and keeps node_exporter textfile metrics current (stdlib only: runs on the
node as the gpufleet-xid-watcher service, installed by the kentino.gpufleet.gpu_monitoring role).

Following the source (journal, dmesg or a file, and the position to go on from) is kernel_log_reader's; parsing,
burst folding, XID 45 correlation, lost-GPU detection and the severity of each event are kernel_log.py's XidScanner
and xid_policy, exactly as for xid_facts: this module counts what the scanner found (XidScanner.take_new) and writes
it out.

Counting rules on top of the scanner's (why a restart never counts twice):
- the read position (journal cursor + boot id, file inode + offset, dmesg boot id + uptime) and every counter are
  saved together in one state file, atomically and fsync'ed: after a crash the watcher replays from the saved
  position with the saved counters, so replayed lines land on the same values. The state is saved at most every
  state_write_seconds while it changes, and at stop; the textfile is written more often, so after a crash it may show
  more than the state holds: at start the watcher therefore reads what the log has beyond the saved position before
  it writes the textfile, and never shows a counter lower than before;
- a GPU that fell off the bus counts one XID 79 per boot, whether the driver printed the Xid line, the "fallen off
  the bus" message, or both (the scanner folds them within one read; the watcher's reads are small);
- a journal cursor that no longer exists (journal vacuumed): resume from the saved time and skip entries at or
  before it.

What it costs: nothing is polled. The watcher blocks on the source (journalctl's or dmesg's output, inotify on a
file; a file polls every poll_seconds only where inotify cannot be used) until lines come, a write is due or the
inventory changed. Lines that keep coming are read at most every read_interval_seconds (an XID after a quiet spell
is read at once); events reach the textfile at most every event_write_seconds, after a quiet spell at once.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import argparse
import datetime
import gc
import json
import os
import re
import shutil
import signal
import sys
import threading
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils import xid_policy
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import XidScanner
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_reader import (
    DmesgSource,
    FileSource,
    JournalSource,
    iso_us,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import read_boot_id, read_boot_time
from ansible_collections.kentino.gpufleet.plugins.module_utils.log_follow import wait_readable
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import QueryGpu, spec
from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci
from ansible_collections.kentino.gpufleet.plugins.module_utils.prom_textfile import MetricFamily, atomic_write, render

STATE_VERSION = 1
XID_PROM = "gpufleet_xid.prom"
STATE_FILE = "xid-watcher.state.json"
STATUS_FILE = "xid-watcher.status.json"
MAX_SERIES = 2048  # fuzzed addresses must not grow the state without bound
SCAN_BYTES = 128 * 1024
MAX_EVENTS_PER_SCAN = SCAN_BYTES // 16  # more than the lines of one scan block: the scanner never drops an event
INVENTORY_SPEC = spec("index", "pci", "uuid", "name")

DEFAULTS = {
    "source": "journal",  # journal | file | dmesg
    "log_file": None,
    "journalctl": "journalctl",
    "journal_matches": ["_TRANSPORT=kernel"],
    "journal_grep": True,
    "dmesg": "dmesg",
    "nvidia_smi": "nvidia-smi",
    "metrics_directory": "/var/lib/gpufleet-monitoring/metrics",
    "state_directory": "/var/lib/gpufleet-monitoring/state",
    "expected_gpus": 0,
    "heartbeat_seconds": 15.0,
    "poll_seconds": 0.25,  # only where a file cannot be watched with inotify
    "read_interval_seconds": 1.0,
    "event_write_seconds": 2.0,
    "write_interval_seconds": 5.0,
    "state_write_seconds": 30.0,
    "inventory_interval_seconds": 60.0,
    "tool_timeout_seconds": 20.0,
    "severity_overrides": {},
    "boot_id_file": "/proc/sys/kernel/random/boot_id",
    "proc_stat": "/proc/stat",
    # node_health (the timer's collector) reads these; the watcher ignores them
    "checkpoint_paths": [],
    "nvme": "nvme",
    "nvme_discover": True,
    "nvme_devices": [],
    "mounts_file": "/proc/mounts",
    "infiniband_root": "/sys/class/infiniband",  # no such directory: a node without InfiniBand, nothing written
    "ib_expected_rate_gbps": None,  # each port's expected rate (InfinibandPortRateLow); null: not exported
}
_NUMBERS = ("expected_gpus", "heartbeat_seconds", "poll_seconds", "read_interval_seconds", "event_write_seconds",
            "write_interval_seconds", "state_write_seconds", "inventory_interval_seconds", "tool_timeout_seconds")
_CATCH_UP_QUIET_S = 0.5  # at start: a following tool silent this long has printed what it had


class ConfigError(Exception):
    pass


def load_config(path=None, overrides=None):
    """The defaults, the JSON file at path, then overrides; checked so that a bad value stops the start, not a scan."""
    cfg = dict(DEFAULTS)
    if path:
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (IOError, OSError, ValueError) as exc:
            raise ConfigError("cannot read the configuration %s: %s" % (path, exc)) from None
        if not isinstance(data, dict):
            raise ConfigError("%s: the configuration must be a JSON object" % path)
        cfg.update(data)
    cfg.update(overrides or {})
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise ConfigError("unknown configuration key(s): %s (known: %s)" % (", ".join(unknown), ", ".join(sorted(DEFAULTS))))
    if cfg["source"] not in ("journal", "file", "dmesg"):
        raise ConfigError("source must be journal, file or dmesg, not %r" % (cfg["source"],))
    if cfg["source"] == "file" and not cfg["log_file"]:
        raise ConfigError("source file needs log_file (the kernel log file to follow, e.g. /var/log/kern.log)")
    for key in _NUMBERS:
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError("%s must be a number >= 0, not %r" % (key, value))
    for key in ("poll_seconds", "heartbeat_seconds", "tool_timeout_seconds"):
        if cfg[key] <= 0:
            raise ConfigError("%s must be > 0" % key)
    if not isinstance(cfg["journal_matches"], list) or not all(
            isinstance(m, str) and re.match(r"^[A-Z0-9_]+=.*$", m) for m in cfg["journal_matches"]):
        raise ConfigError("journal_matches must be a list of FIELD=VALUE strings such as _TRANSPORT=kernel, not %r"
                          % (cfg["journal_matches"],))
    try:
        cfg["severity_overrides"] = xid_policy.parse_overrides(cfg["severity_overrides"])
    except (ValueError, AttributeError) as exc:
        raise ConfigError(str(exc) if isinstance(exc, ValueError) else
                          "severity_overrides must be a mapping of XID code to severity") from None
    for key in ("journal_grep", "nvme_discover"):
        if not isinstance(cfg[key], bool):
            raise ConfigError("%s must be true or false, not %r" % (key, cfg[key]))
    if not isinstance(cfg["nvme_devices"], list) or not all(isinstance(d, str) for d in cfg["nvme_devices"]):
        raise ConfigError("nvme_devices must be a list of device paths such as /dev/nvme0, not %r" % (cfg["nvme_devices"],))
    if not isinstance(cfg["checkpoint_paths"], list) or not all(
            isinstance(p, str) and p.startswith("/") for p in cfg["checkpoint_paths"]):
        raise ConfigError("checkpoint_paths must be a list of absolute paths, not %r" % (cfg["checkpoint_paths"],))
    rate = cfg["ib_expected_rate_gbps"]
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0):
        raise ConfigError("ib_expected_rate_gbps must be a rate in Gb/s above 0 (such as 400) or null, not %r" % (rate,))
    for key in ("metrics_directory", "state_directory", "infiniband_root"):
        if not isinstance(cfg[key], str) or not cfg[key].startswith("/"):
            raise ConfigError("%s must be an absolute path, not %r" % (key, cfg[key]))
    return cfg


def _stderr_log(message):
    sys.stderr.write(message.rstrip() + "\n")
    sys.stderr.flush()


# ---- GPU identity (labels) -----------------------------------------------------------------------------------------
class GpuInventory:
    """nvidia-smi's view, refreshed in a thread: a hung driver (a lost GPU can make nvidia-smi hang until its timeout)
    never delays the reading of the kernel log. snapshot(): {"ok", "gpus": {pci: {index, uuid, name}}, "lost": [pci],
    "visible", "error", "time"} or None before the first answer."""

    def __init__(self, executable, interval_s, timeout_s, log, on_change=None):
        self.executable = executable
        self.on_change = on_change  # called from the inventory thread after a refresh that changed something
        self.interval_s = interval_s
        self.query = QueryGpu(executable, INVENTORY_SPEC, timeout_s) if executable else None
        self.log = log
        self._snapshot = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        if self.query is None:
            return
        self._thread = threading.Thread(target=self._loop, name="gpu-inventory", daemon=True)
        self._thread.start()

    def poke(self):
        """Refresh soon (a GPU was just reported lost)."""
        self._wake.set()

    def stop(self):
        self._stop.set()
        self._wake.set()

    def snapshot(self):
        with self._lock:
            return self._snapshot

    def refresh(self):
        out = self.query.run()
        gpus = {}
        for row in out["gpus"]:
            pci = normalize_pci(row.get("pci"))
            if pci:
                index = row.get("index")
                gpus[pci] = {"index": str(index) if index is not None else "", "uuid": row.get("uuid") or "",
                             "name": row.get("name") or ""}
        lost = sorted({p["pci"] for p in out["problems"] if p.get("kind") == "lost" and p.get("pci")})
        errors = [p["message"] for p in out["problems"] if p.get("kind") != "lost"]
        ok = bool(gpus) or (not errors and out["tool"] is not None and out["tool"].rc == 0)
        snap = {"ok": ok, "gpus": gpus, "lost": lost, "visible": len(gpus), "error": "; ".join(errors)[:500] or None,
                "time": time.time()}
        with self._lock:
            previous = self._snapshot
            self._snapshot = snap
        if snap["error"] and (previous is None or previous.get("error") != snap["error"]):
            self.log("nvidia-smi: %s" % snap["error"])
        if self.on_change is not None and (previous is None or any(previous[k] != snap[k] for k in (
                "ok", "gpus", "lost", "error"))):
            self.on_change()
        return snap

    def _loop(self):
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # never let the identity thread take the watcher down
                self.log("nvidia-smi inventory failed: %r" % (exc,))
            self._wake.wait(self.interval_s)
            self._wake.clear()


# ---- the watcher ---------------------------------------------------------------------------------------------------
class Watcher:
    def __init__(self, cfg, log=None, clock=time.time, inventory=None):
        self.cfg = cfg
        self.log = log or _stderr_log
        self.clock = clock
        self.boot_id = read_boot_id(cfg["boot_id_file"])
        self.boot_time = read_boot_time(cfg["proc_stat"])
        self.textfile = os.path.join(cfg["metrics_directory"], XID_PROM)
        self.state_path = os.path.join(cfg["state_directory"], STATE_FILE)
        self.status_path = os.path.join(cfg["state_directory"], STATUS_FILE)
        self.stopping = False
        boot_dt = (datetime.datetime.fromtimestamp(self.boot_time, datetime.timezone.utc)
                   if self.boot_time is not None else None)
        self.scanner = XidScanner(severity_overrides=cfg["severity_overrides"], max_events=MAX_EVENTS_PER_SCAN,
                                  boot_time=boot_dt, boot_id=self.boot_id if cfg["source"] == "dmesg" else None)
        self._lost_severity = xid_policy.severity(79, overrides=cfg["severity_overrides"], synthetic=True)[0]
        # what is counted (all saved in the state file)
        self.counters = {}  # (pci, xid, severity) -> {"gpu", "uuid", "value"}
        self.last_ts = {}  # (pci, xid, severity) -> epoch seconds: the alerts select on the severity written here
        self.lost = {}  # pci -> {"time", "line"}: lost in the current boot
        self.counted_79 = []  # [boot_id, pci] pairs with an XID 79 counted (one per GPU and boot)
        self.identity = {}  # pci -> {"index", "uuid", "name"}
        self.max_visible = 0
        self.bytes_read = 0
        self.unparsed = {}  # reason -> lines
        self.series_dropped = 0
        self._overlong_seen = 0
        # bookkeeping
        self.started = self.clock()
        self._last_write = 0.0
        self._last_save = 0.0
        self._last_lines = 0.0  # monotonic time of the last read that found lines
        self._events_dirty = False
        self._dirty = True
        self._state_dirty = True
        self._textfile_error = None
        self._next_retry = 0.0
        # a byte in this pipe ends a wait: a stop signal, a changed GPU inventory
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        self.inventory = inventory if inventory is not None else GpuInventory(
            shutil.which(cfg["nvidia_smi"]) if cfg["nvidia_smi"] else None, cfg["inventory_interval_seconds"],
            cfg["tool_timeout_seconds"], self.log, on_change=self.wake)
        self._inventory_seen = None
        position = self._load_state()
        self.source = self._make_source(position)

    # ---- state ----------------------------------------------------------------------------------------------
    def _load_state(self):
        try:
            with open(self.state_path) as fh:
                state = json.load(fh)
        except (IOError, OSError) as exc:
            if os.path.exists(self.state_path):
                self.log("cannot read the state %s (%s): starting without it" % (self.state_path, exc))
            return None
        except ValueError as exc:
            self.log("state %s is corrupt (%s): starting without it" % (self.state_path, exc))
            return None
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            self.log("state %s has an unknown format: starting without it" % self.state_path)
            return None
        try:
            for pci, xid, severity, gpu, uuid, value in state.get("counters", []):
                self.counters[(pci, str(xid), severity)] = {"gpu": gpu, "uuid": uuid, "value": int(value)}
            for key, ts in (state.get("last_ts") or {}).items():
                parts = key.split("|")
                if len(parts) == 3:
                    self.last_ts[tuple(parts)] = float(ts)
                else:  # a state written before the severity label: the counters know each code's severities
                    for pci, xid, severity in [k for k in self.counters if k[:2] == tuple(parts[-2:])]:
                        self.last_ts[(pci, xid, severity)] = float(ts)
            self.identity = dict(state.get("identity") or {})
            self.max_visible = int(state.get("max_visible") or 0)
            self.bytes_read = int(state.get("bytes_read") or 0)  # a state before bytes: its "lines_read" is no byte count
            self.unparsed = {str(k): int(v) for k, v in (state.get("unparsed") or {}).items()}
            self.series_dropped = int(state.get("series_dropped") or 0)
            self.counted_79 = [list(p) for p in state.get("counted_79") or []]
            lost = state.get("lost") or {}
        except (TypeError, ValueError) as exc:
            self.log("state %s does not read (%s): starting without it" % (self.state_path, exc))
            self.counters, self.last_ts = {}, {}
            return None
        if lost.get("boot_id") and lost.get("boot_id") == self.boot_id:
            self.lost = dict(lost.get("gpus") or {})
        elif lost.get("gpus"):
            self.log("rebooted since the last run (boot %s -> %s): GPUs lost in the previous boot (%s) are not "
                     "counted as lost now" % (lost.get("boot_id"), self.boot_id, ", ".join(sorted(lost["gpus"]))))
        if state.get("source") != self.cfg["source"]:
            if state.get("source"):
                self.log("the state was written for source %s, now %s: reading the new source from its start "
                         "(counters continue)" % (state.get("source"), self.cfg["source"]))
            return None
        return state.get("position")

    def _state(self):
        return {
            "version": STATE_VERSION,
            "source": self.cfg["source"],
            "position": self.source.position(),
            "counters": [[k[0], k[1], k[2], v["gpu"], v["uuid"], v["value"]] for k, v in sorted(self.counters.items())],
            "last_ts": {"%s|%s|%s" % k: v for k, v in self.last_ts.items()},
            "lost": {"boot_id": self.boot_id, "gpus": self.lost},
            "counted_79": self.counted_79[-256:],
            "identity": self.identity,
            "max_visible": self.max_visible,
            "bytes_read": self.bytes_read,
            "unparsed": self.unparsed,
            "series_dropped": self.series_dropped,
            "saved_at": self.clock(),
        }

    def save_state(self):
        try:
            atomic_write(self.state_path, json.dumps(self._state(), sort_keys=True), mode=0o600)
            self._state_dirty = False
            self._last_save = self.clock()
            return True
        except OSError as exc:
            self.log("cannot save the state %s: %s" % (self.state_path, exc))
            return False

    def _write_status(self):
        status = {"textfile": self.textfile, "textfile_ok": self._textfile_error is None,
                  "textfile_error": self._textfile_error, "source": self.cfg["source"], "pid": os.getpid(),
                  "boot_id": self.boot_id, "updated": self.clock()}
        try:
            atomic_write(self.status_path, json.dumps(status, sort_keys=True) + "\n", sync_file=False)
        except OSError as exc:
            self.log("cannot write the status file %s: %s" % (self.status_path, exc))

    # ---- source ---------------------------------------------------------------------------------------------
    def _make_source(self, position):
        kind = self.cfg["source"]
        cfg = self.cfg
        if kind == "file":
            return FileSource(cfg["log_file"], position, cfg["poll_seconds"], self.log, read_bytes=SCAN_BYTES)
        if kind == "dmesg":
            return DmesgSource(cfg["dmesg"], position, self.boot_id, self.log)
        return JournalSource(cfg["journalctl"], cfg["journal_matches"], cfg["journal_grep"], position, self.scanner,
                             self.log)

    def _feed_block(self, block, start, end):
        self.scanner.reference = datetime.datetime.now().astimezone()  # syslog lines have no year
        self.scanner.scan_lines(block, start, end)

    def _feed_lines(self, lines):
        self.scanner.reference = datetime.datetime.now().astimezone()
        journal = self.source.kind == "journal"
        prefilter = journal and not self.source.use_grep
        for start in range(0, len(lines), 1024):
            for line in lines[start:start + 1024]:
                if journal:
                    # Without --grep every kernel entry comes: decode only NVRM ones (and non-UTF-8 messages,
                    # which journald writes as byte arrays, where the text cannot be searched).
                    if prefilter and b"NVRM" not in line and b'"MESSAGE":[' not in line:
                        continue
                    self.scanner.feed_journal_line(line)
                else:
                    self.scanner.feed_line(line)
            self._take_events()

    # ---- counting -------------------------------------------------------------------------------------------
    def _is_current(self, boot_id, epoch):
        if boot_id and self.boot_id:
            return boot_id == self.boot_id
        if epoch is not None and self.boot_time is not None:
            return epoch >= self.boot_time - 1.0
        return True

    def _learn(self, pci, **ids):
        entry = self.identity.setdefault(pci, {"index": "", "uuid": "", "name": ""})
        for key, value in ids.items():
            if value and entry.get(key) != value:
                entry[key] = value
                self._state_dirty = self._dirty = True

    def _count(self, pci, xid, severity, epoch, boot_id, line):
        pci = pci or "unknown"
        if xid == 79:
            if boot_id:
                boot = boot_id
            elif self._is_current(None, epoch):
                boot = self.boot_id or ""
            else:  # a log file line of an earlier boot: losses of one GPU within 10 minutes are one
                boot = "earlier@%d" % (int(epoch or 0) // 600)
            pair = [boot, pci]
            if pair in self.counted_79:
                return  # this GPU's loss in this boot is counted already (Xid line and "fallen off" message)
            self.counted_79.append(pair)
        key = (pci, str(xid), severity)
        series = self.counters.get(key)
        if series is None:
            if len(self.counters) >= MAX_SERIES:
                self.series_dropped += 1
                return
            ident = self.identity.get(pci) or {}
            series = self.counters[key] = {"gpu": ident.get("index", ""), "uuid": ident.get("uuid", ""), "value": 0}
        series["value"] += 1
        when = epoch if epoch is not None else self.clock()
        if when > self.last_ts.get(key, 0.0):
            if key in self.last_ts or len(self.last_ts) < MAX_SERIES:
                self.last_ts[key] = when
        if xid == 79 and self._is_current(boot_id, epoch) and pci not in self.lost:
            self.lost[pci] = {"time": when, "line": (line or "")[:400]}
            index = (self.identity.get(pci) or {}).get("index")
            self.log("GPU %s%s fell off the bus: %s" % (pci, " (index %s)" % index if index else "", (line or "")[:300]))
            self.inventory.poke()
        self._events_dirty = self._dirty = self._state_dirty = True

    def _take_events(self):
        new = self.scanner.take_new()
        for event in new["events"]:
            if event["counted"]:
                if event["uuid"]:
                    self._learn(event["pci"], uuid=event["uuid"])
                self._count(event["pci"], event["xid"], event["severity"], event["epoch_s"], event["boot_id"],
                            event["line"])
        for lost in new["lost"]:
            self._count(lost["pci"], 79, self._lost_severity, lost["epoch_s"], lost["boot_id"], lost["line"])
        for reason, lines in new["unparsed"].items():
            self.unparsed[reason] = self.unparsed.get(reason, 0) + lines
            self._dirty = self._state_dirty = True
        overlong = self.source.overlong
        if overlong > self._overlong_seen:
            self.unparsed["overlong_line_cut"] = self.unparsed.get("overlong_line_cut", 0) + overlong - self._overlong_seen
            self._overlong_seen = overlong

    def _apply_inventory(self):
        snap = self.inventory.snapshot()
        if snap is None or snap is self._inventory_seen:
            return
        self._inventory_seen = snap
        for pci, ids in snap["gpus"].items():
            self._learn(pci, index=ids["index"], uuid=ids["uuid"], name=ids["name"])
        if snap["ok"] and snap["visible"] > self.max_visible:
            self.max_visible = snap["visible"]
            self._state_dirty = True
        self._dirty = True

    # ---- output ---------------------------------------------------------------------------------------------
    def families(self, up=1):
        now = self.clock()
        fam = []
        f = MetricFamily("gpufleet_xid_events_total", "counter",
                         "NVIDIA XID events in the kernel log, by GPU, code and severity (xid_policy: the catalog, the "
                         "line, gpufleet_xid_severity_overrides; a burst of lines is one event; an XID 45 that follows "
                         "another Xid is not counted again).")
        for (pci, xid, severity), v in sorted(self.counters.items()):
            f.add(v["value"], pci=pci, gpu=v["gpu"], uuid=v["uuid"], xid=xid, severity=severity)
        fam.append(f)
        f = MetricFamily("gpufleet_xid_last_event_timestamp_seconds", "gauge",
                         "Time of the newest event per GPU, XID code and severity (the log's time; the watcher's when "
                         "the log gives none). The alerts select on the severity.")
        for (pci, xid, severity), ts in sorted(self.last_ts.items()):
            f.add(ts, pci=pci, xid=xid, severity=severity)
        fam.append(f)
        snap = self.inventory.snapshot()
        known = set(self.identity) | set(self.lost) | {k[0] for k in self.counters if k[1] == "79"}
        if snap is not None:
            known |= set(snap["lost"])
        f = MetricFamily("gpufleet_gpu_lost", "gauge",
                         "1: the GPU fell off the bus in this boot (XID 79 or the driver's 'fallen off the bus' "
                         "message, or nvidia-smi says it is lost).")
        for pci in sorted(known):
            lost = pci in self.lost or (snap is not None and pci in snap["lost"])
            f.add(1 if lost else 0, pci=pci)
        fam.append(f)
        f = MetricFamily("gpufleet_gpu_info", "gauge", "GPU identity (value 1): PCI address, index, UUID, model.")
        for pci in sorted(self.identity):
            ident = self.identity[pci]
            f.add(1, pci=pci, gpu=ident.get("index", ""), uuid=ident.get("uuid", ""), name=ident.get("name", ""))
        fam.append(f)
        if snap is not None and snap["ok"]:
            expected = int(self.cfg["expected_gpus"]) or self.max_visible
            fam.append(MetricFamily("gpufleet_gpus_expected", "gauge",
                                    "GPUs this node should have: the configured count, else the most nvidia-smi "
                                    "ever listed here.").add(expected))
            fam.append(MetricFamily("gpufleet_gpus_visible", "gauge",
                                    "GPUs nvidia-smi lists now.").add(snap["visible"]))
        fam.append(MetricFamily("gpufleet_gpu_inventory_up", "gauge",
                                "1: nvidia-smi answered at its last run (the GPU count and identities are current).")
                   .add(1 if snap is not None and snap["ok"] else 0))
        fam.append(MetricFamily("gpufleet_watcher_up", "gauge",
                                "1 while the XID watcher runs; 0 written when it stops.").add(up))
        fam.append(MetricFamily("gpufleet_watcher_last_update_timestamp_seconds", "gauge",
                                "When the watcher last wrote this file (at least every heartbeat).").add(now))
        fam.append(MetricFamily("gpufleet_watcher_start_time_seconds", "gauge",
                                "When the watcher process started.").add(self.started))
        fam.append(MetricFamily("gpufleet_watcher_bytes_read_total", "counter",
                                "Bytes of the source the watcher read: the log file's, journalctl's or dmesg's "
                                "output (bytes, not lines: counting lines would cost the watcher more than finding "
                                "the XIDs does).").add(self.bytes_read))
        f = MetricFamily("gpufleet_watcher_lines_unparsed_total", "counter",
                         "Lines that could not be read as what they seemed to be, by reason (an NVRM Xid line the "
                         "parser does not know, bad journal JSON, an overlong line).")
        for reason in sorted(self.unparsed):
            f.add(self.unparsed[reason], reason=reason)
        fam.append(f)
        fam.append(MetricFamily("gpufleet_watcher_series_dropped_total", "counter",
                                "Events not counted because the watcher already keeps %d series (a flood of bogus PCI "
                                "addresses)." % MAX_SERIES).add(self.series_dropped))
        fam.append(MetricFamily("gpufleet_watcher_source_info", "gauge", "The kernel log source the watcher follows.")
                   .add(1, source=self.cfg["source"], path=self.cfg["log_file"] or ""))
        return fam

    def write_textfile(self, up=1):
        now = self.clock()
        try:
            # No fsync: the textfile is rendered from the state (synced before it), and rewritten at start.
            atomic_write(self.textfile, render(self.families(up)), sync_file=False)
        except OSError as exc:
            message = "cannot write %s: %s" % (self.textfile, exc.strerror or exc)
            if self._textfile_error is None or self._textfile_error["error"] != message:
                self.log("%s. Prometheus sees stale GPU metrics until this is fixed; the watcher keeps reading the "
                         "kernel log and retries every second." % message)
                self._textfile_error = {"error": message, "since": now}
                self._write_status()
            self._next_retry = now + 1.0
            return False
        if self._textfile_error is not None:
            self.log("%s is writable again (it was not since %s)" % (self.textfile, iso_us(self._textfile_error["since"] * 1e6, "(none)")))
            self._textfile_error = None
            self._write_status()
        self._last_write = now
        self._events_dirty = self._dirty = False
        return True

    def maybe_write(self, force=False):
        """Save the state (counters and position together) and write the textfile when each is due."""
        now = self.clock()
        if self._state_dirty and (force or now - self._last_save >= self.cfg["state_write_seconds"]):
            self.save_state()
        since = now - self._last_write
        due = force or since >= self.cfg["heartbeat_seconds"] or (
            self._events_dirty and since >= self.cfg["event_write_seconds"]) or (
            self._dirty and since >= self.cfg["write_interval_seconds"])
        if not due or (self._textfile_error is not None and now < self._next_retry and not force):
            return False
        return self.write_textfile()

    def _next_due(self):
        """Seconds until the next write (or state save, or retry) is due, at most a heartbeat."""
        due = [self._last_write + self.cfg["heartbeat_seconds"]]
        if self._events_dirty:
            due.append(self._last_write + self.cfg["event_write_seconds"])
        if self._dirty:
            due.append(self._last_write + self.cfg["write_interval_seconds"])
        if self._state_dirty:
            due.append(self._last_save + self.cfg["state_write_seconds"])
        if self._textfile_error is not None:
            due.append(self._next_retry)
        return min(max(0.0, min(due) - self.clock()), self.cfg["heartbeat_seconds"])

    # ---- main loop ------------------------------------------------------------------------------------------
    def wake(self):
        """End the current wait (from a signal handler or another thread)."""
        try:
            os.write(self._wake_w, b"w")
        except OSError:
            pass  # the pipe is full: a wake is pending anyway

    def _drain_wake(self):
        try:
            while os.read(self._wake_r, 4096):
                pass
        except OSError:
            pass

    def stop(self):
        self.stopping = True
        self.wake()

    def read(self):
        """Read what is new once and count it. Returns the bytes read (whole lines)."""
        if self.source.kind == "file":
            size = self.source.read(self._feed_block)
            if size:
                self._take_events()
        else:
            size = self.source.read(self._feed_lines)
        if size:
            self.bytes_read += size
            self._dirty = self._state_dirty = True  # the position moved
            self._last_lines = time.monotonic()
        return size

    def wait(self):
        """Block until lines come, a write is due, or a wake. Lines that keep coming gather for read_interval_seconds
        after the last read that found some, so a stream costs one read a second, not one per line."""
        timeout = self._next_due()
        if self.source.wait(timeout, [self._wake_r]) and not self.stopping:
            rest = min(self.cfg["read_interval_seconds"] - (time.monotonic() - self._last_lines), self._next_due())
            if rest > 0:
                wait_readable([self._wake_r], rest)
        self._drain_wake()

    def step(self):
        """Read what is new once, count it, write when due, wait when nothing was new. Returns the bytes read."""
        count = self.read()
        self._apply_inventory()
        self.maybe_write()
        if not count and not self.stopping:
            self.wait()
        return count

    def catch_up(self):
        """Read what the log holds beyond the saved position (bounded by a heartbeat) before the first write."""
        deadline = self.clock() + self.cfg["heartbeat_seconds"]
        while not self.stopping and self.clock() < deadline:
            if self.read():
                continue
            if self.source.kind == "file" or not self.source.wait(min(_CATCH_UP_QUIET_S, deadline - self.clock()),
                                                                  [self._wake_r]):
                return

    def run(self):
        os.makedirs(self.cfg["state_directory"], exist_ok=True)
        self.log("gpufleet XID watcher: source %s%s, metrics %s, state %s, boot %s"
                 % (self.cfg["source"], " " + self.cfg["log_file"] if self.cfg["source"] == "file" else "",
                    self.textfile, self.state_path, self.boot_id))
        self.inventory.start()
        self._write_status()
        # What exists now (modules, code, configuration) lives as long as the process: the cyclic garbage collector
        # would walk it again at every collection, most of the watcher's CPU while it follows a busy log.
        gc.collect()
        gc.freeze()
        try:
            self.catch_up()
            self._apply_inventory()
            self.maybe_write(force=True)
            while not self.stopping:
                self.step()
        finally:
            self.inventory.stop()
            self.source.close()
            self.save_state()
            self.write_textfile(up=0)
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            self.log("gpufleet XID watcher stopped")
        return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="gpufleet-xid-watcher",
                                     description="Follow the kernel log and keep GPU XID metrics for node_exporter.")
    parser.add_argument("--config", default="/etc/gpufleet/monitoring.json", help="JSON configuration file")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        _stderr_log("gpufleet-xid-watcher: %s" % exc)
        return 2
    watcher = Watcher(cfg)

    def stop(_signum, _frame):
        watcher.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return watcher.run()
