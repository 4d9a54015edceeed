#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: xid_facts
short_description: Read NVIDIA XID errors and lost GPUs from the kernel log
description:
  - Reads the kernel log (journald, dmesg or a plain/gzip log file), finds NVIDIA XID lines in every known driver
    format, and returns them as events enriched from NVIDIA's XID catalog (snapshot 2025-10) with a severity.
  - A burst of related lines is one event (XID 13 prints one line per SM; XID 119 is followed by an RPC history and a
    stack trace); XID 45 is correlated with the Xid that caused it and not counted twice.
  - A GPU that "fell off the bus" is reported in RV(ansible_facts.gpufleet_xid.lost_gpus) and as an XID 79 event even
    when the driver printed no Xid line (the one-line and the three-line forms).
  - A GPU the driver could not initialise (C(RmInitAdapter failed!)) is reported in
    RV(ansible_facts.gpufleet_xid.init_failures). Lines that follow an Xid are folded into its event only when
    they name no other GPU.
  - "With O(state_file), each run returns only what was logged since the previous run: no event is missed or repeated
    across journal rotation (cursor gone: falls back to the saved time), reboots (the journal's rest of the previous
    boot is read too), log-file rotation and truncation."
  - "Default severity per code: V(critical) for 48, 63, 64, 79 and 92 (docs/failure-modes.md pages on these), for the DCGM
    health-watch failures 74, 95, 119, 120 and 140, for 54 (auxiliary power cable), and for every code whose NVIDIA
    immediate action takes the GPU or node out of service (RESET_GPU, RESTART_BM, RESTART_VM, CHECK_MECHANICALS,
    WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, NVLink5 144-150 when the line says Fatal)."
  - "V(warning) for 13, 31, 32, 43 and 94 (DCGM warns; the device plugin calls them application errors, but hardware
    causes are listed), for RESTART_APP codes whose legacy causes include hardware, bus, thermal or framebuffer, for
    CONTACT_SUPPORT/UPDATE_SWFW codes, NVLink5 Nonfatal lines, and a solo XID 45."
  - "V(info) for IGNORE codes, application-only RESTART_APP codes (68 and others), and an XID 45 that follows another
    Xid on the same GPU. XID 154 takes the severity of the recovery action it announces (none: info; drain P2P:
    warning; any reset or reboot: critical). A code absent from the catalog is V(unknown), never ignored."
  - The full per-code table and its reasoning are in hack/gen_xid_catalog.py and docs/signals.md; override any code
    with O(severity_overrides).
version_added: "0.1.0"
author:
  - kentino.gpufleet contributors
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
attributes:
  check_mode:
    support: full
    details: Check mode reads the log as a normal run does; the O(state_file) is read but not written.
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    support: full
    platforms: posix
options:
  source:
    description:
      - Where to read the kernel log.
      - V(auto) uses journald when C(journalctl) is present and answers, else C(dmesg).
      - V(file) reads O(path) (a saved dmesg, kern.log, messages, or their .gz; gzip is detected by its magic bytes).
    type: str
    choices: [auto, journal, dmesg, file]
    default: auto
  path:
    description:
      - The log file to read when O(source=file). Plain text or gzip.
    type: path
  state_file:
    description:
      - Where to keep the read position between runs. When set, only events logged after the previous run are
        returned, and the new position is saved atomically (not in check mode).
      - The position is per source; a state file written for another source is ignored (and said so).
    type: path
  since:
    description:
      - Only events at or after this time. ISO 8601 (C(2024-08-09T13:00:00Z), C(2024-08-09)) or relative to now
        (C(-2h), C(-30m), C(-1d), C(-90s), C(-1w)).
      - Events whose time the log does not give (dmesg without a boot time) are kept.
    type: str
  timeout:
    description:
      - Seconds allowed for journalctl or dmesg.
    type: int
    default: 60
  severity_overrides:
    description:
      - Severity per XID code, over the defaults. Keys are codes, values one of V(critical), V(warning), V(info),
        V(unknown).
    type: dict
    default: {}
  max_events:
    description:
      - At most this many events are returned (the newest); the counts in RV(ansible_facts.gpufleet_xid.summary)
        always cover all.
    type: int
    default: 500
  journalctl_executable:
    description:
      - Path of journalctl, when it is not on E(PATH).
    type: path
  dmesg_executable:
    description:
      - Path of dmesg, when it is not on E(PATH).
    type: path
notes:
  - "Reading the kernel log needs root on most systems (C(kernel.dmesg_restrict=1), the journal's system files):
    use C(become: true)."
  - With the journal, journalctl itself keeps only NVRM entries (C(--grep), systemd 237+; older versions are retried
    without it), so a long boot's kernel log stays far below the 4 MiB of tool output the module keeps.
  - dmesg lines carry only the uptime; their time is the boot time plus the uptime (approximate after a suspend).
"""

EXAMPLES = r"""
- name: XID errors of the current boot
  kentino.gpufleet.xid_facts:
  become: true

- name: Only what is new since the previous audit run, from the journal
  kentino.gpufleet.xid_facts:
    source: journal
    state_file: /var/lib/gpufleet/xid.state
  become: true

- name: Last two hours, with a site policy for row remaps
  kentino.gpufleet.xid_facts:
    since: -2h
    severity_overrides:
      63: warning
  become: true

- name: A kern.log copied from a customer's machine
  kentino.gpufleet.xid_facts:
    source: file
    path: /tmp/case-1234/kern.log.2.gz

- name: Page on lost GPUs
  ansible.builtin.debug:
    msg: "GPU {{ item }} fell off the bus: reseat the riser and the power cable before any RMA"
  loop: "{{ ansible_facts['gpufleet_xid']['lost_gpus'] }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts under RV(ansible_facts.gpufleet_xid).
  returned: success
  type: dict
  contains:
    gpufleet_xid:
      description: The XID picture of the node.
      type: dict
      contains:
        events:
          description:
            - One dict per event (bursts folded), oldest first. Keys xid, pci (dddd:bb:dd), gpu_instance,
              compute_instance, pid, process, message, channel, mnemonic, description, action
              ({immediate, investigatory} from the catalog), severity, severity_basis, time (ISO 8601 or null),
              uptime_s, boot_id, line (the first raw line), line_count, evidence (up to 5 raw lines),
              details (NVLink5 unit/fatal/link/subcode, XID 154 recovery actions, XID 45 caused_by_xid),
              counted (false for a correlated XID 45), correlated_with, synthetic (true for a lost GPU without an
              Xid line), uuid, serial.
          type: list
          elements: dict
          sample:
            - xid: 79
              pci: "0000:3b:00"
              pid: null
              process: null
              message: GPU has fallen off the bus.
              mnemonic: GPU_HAS_FALLEN_OFF_THE_BUS
              action: {immediate: RESTART_BM, investigatory: CONTACT_SUPPORT}
              severity: critical
              time: "2024-12-02T11:38:47+00:00"
              uptime_s: 219.470994
              line: "[  219.470994] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
        lost_gpus:
          description: PCI addresses (dddd:bb:dd) of GPUs that fell off the bus, with or without an Xid line.
          type: list
          elements: str
          sample: ["0000:3b:00"]
        init_failures:
          description:
            - GPUs the driver could not initialise (C(RmInitAdapter failed!), C(rm_init_adapter failed)), one entry
              per GPU whatever the number of attempts. Never folded into an Xid event of another GPU.
            - Keys kind (V(init_failed)), pci (dddd:bb:dd, null on drivers that print no address), minor (the
              /dev/nvidiaN minor number, when printed), code (the driver's status triple such as V(0x26:0x56:1474)),
              count (attempts in this read), time, uptime_s, boot_id, line (the first raw line), evidence (up to 5
              raw lines).
          type: list
          elements: dict
          sample:
            - kind: init_failed
              pci: "0000:3b:00"
              minor: 1
              code: "0x26:0x56:1474"
              count: 2
              line: "[ 8120.901114] NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x56:1474)"
        gpu_ids:
          description: UUID and board serial per PCI address, from the lines the driver prints after a first Xid.
          type: dict
          sample: {"0000:3b:00": {"uuid": "GPU-5a1c7e2b-3f4d-4e21-9c0a-000000012345", "serial": "1652123456789"}}
        summary:
          description:
            - Counts of counted events by_code, by_pci and by_severity; events; correlated (XID 45 not counted
              again); burst_lines_folded; xid_lines; lines_read or bytes_read; skipped_before_since; events_dropped;
              init_failures (GPUs in init_failures).
          type: dict
        highest_severity:
          description: The worst severity among counted events (info < warning < unknown < critical), or V(none).
          type: str
          sample: critical
        unparsed:
          description:
            - What could not be read, counted by reason (xid_line, overlong_line, journal_json, journal_message_null,
              fallen_off_without_pci, output_cut), with up to 5 samples.
          type: dict
          sample: {"count": 1, "by_reason": {"xid_line": 1}, "samples": [{"reason": "xid_line", "line": "NVRM: Xid (PCI:0000:3b"}]}
        source:
          description: The source actually read (journal, dmesg or file).
          type: str
          sample: journal
        position:
          description:
            - Where this read ended (journal cursor/realtime_us/boot_id; dmesg boot_id/uptime_s; file path/inode/
              offset), whether it was saved to O(state_file), and notes on rotation, reboot or fallback.
          type: dict
        notes:
          description: Remarks about the read (source fallback, truncated tool output, unreadable journal entries).
          type: list
          elements: str
tool:
  description: The external tool run (argv, rc, timed_out, duration_s, error); null for O(source=file).
  returned: always
  type: dict
"""

import datetime
import hashlib
import json
import os
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import XidScanner
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import is_gzip, open_log
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool, run_tool
from ansible_collections.kentino.gpufleet.plugins.module_utils.xid_catalog import SEVERITIES

STATE_VERSION = 1
_RELATIVE_RE = re.compile(r"^-\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)$", re.I)
_UNITS_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


class ReadError(Exception):
    """A source could not be read: the message names the tool/file, what failed and the fix."""

    def __init__(self, msg, tool=None):
        super(ReadError, self).__init__(msg)
        self.tool = tool


def _utcnow():
    return datetime.datetime.now(datetime.timezone.utc)


def parse_since(text, now=None):
    """ISO 8601, @epoch or -2h-style relative time -> aware datetime; ValueError with the accepted forms."""
    if text is None or str(text).strip() == "":
        return None
    text = str(text).strip()
    now = now or _utcnow()
    match = _RELATIVE_RE.match(text)
    if match:
        return now - datetime.timedelta(seconds=float(match.group(1)) * _UNITS_S[match.group(2).lower()])
    if text.startswith("@"):
        return datetime.datetime.fromtimestamp(float(text[1:]), datetime.timezone.utc)
    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        value = datetime.datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError("since=%r is neither ISO 8601 (2024-08-09T13:00:00Z, 2024-08-09) nor relative "
                         "(-2h, -30m, -1d, -90s, -1w)" % text) from None
    if value.tzinfo is None:
        value = value.astimezone()  # a naive time is the node's local time
    return value


def _boot_id():
    """This boot's id in journald's spelling (32 hex digits; /proc writes it as a dashed UUID)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip().replace("-", "").lower() or None
    except (IOError, OSError):
        return None


def _boot_time():
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return datetime.datetime.fromtimestamp(int(line.split()[1]), datetime.timezone.utc)
    except (IOError, OSError, ValueError, IndexError):
        pass
    return None


# ---- state file ----------------------------------------------------------------------------------------------------
def load_state(path):
    """(state dict or None, note or None). A missing file is a first run; a corrupt one is ignored, said so."""
    if not path or not os.path.exists(path):
        return None, None
    try:
        with open(path) as fh:
            state = json.load(fh)
    except (IOError, OSError, ValueError) as exc:
        return None, "state file %s unreadable (%s): read as a first run" % (path, exc)
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        return None, "state file %s has an unknown format: read as a first run" % path
    return state, None


def save_state(path, state):
    """Write the state atomically: a temp file in the same directory, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o700)
    fd, tmp = tempfile.mkstemp(prefix=".xid_state.", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(state, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.rename(tmp, path)
    except Exception:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---- journal -------------------------------------------------------------------------------------------------------
def _journal_failed(res):
    """Why a journalctl run is unusable, or None. 'No entries' with rc 1 (newer systemd) is not a failure."""
    if res.error:
        return res.error
    if res.timed_out:
        return "journalctl timed out after %.0f s" % res.duration_s
    err = (res.stderr or "").strip()
    if "No journal files were found" in err:
        return "journalctl found no journal files (journald not running or not persistent here)"
    if res.rc != 0 and not (res.rc == 1 and not res.stdout.strip() and ("No entries" in err or not err)):
        return "journalctl exited %s: %s" % (res.rc, err[-300:] or "no message")
    return None


# journalctl filters in C: only NVRM entries (--grep, systemd >= 237) and only the fields we read (--output-fields,
# systemd >= 236; the cursor, times and _BOOT_ID always come). That keeps a busy boot's kernel log far below the
# output run_tool keeps. Older journalctl rejects the options: drop them one by one.
_JOURNAL_EXTRAS = (("--grep=NVRM", ("grep", "pattern", "PCRE")),
                   ("--output-fields=MESSAGE,_SOURCE_MONOTONIC_TIMESTAMP", ("output-fields",)))


def _run_journalctl(base, window, timeout):
    extras = [opt for opt, _ in _JOURNAL_EXTRAS]
    res = run_tool(base + extras + window, timeout)
    for opt, markers in _JOURNAL_EXTRAS:
        if res.rc not in (0, None) and not res.timed_out and any(m in (res.stderr or "") for m in markers):
            extras.remove(opt)
            res = run_tool(base + extras + window, timeout)
    return res


def read_journal(exe, params, state, since, scanner_opts, notes):
    timeout = params["timeout"]
    base = [exe, "-o", "json", "--no-pager", "--all"]
    prev = (state or {}).get("journal") or {}
    position_notes = []
    after_us = None
    after_cursor = None
    if prev.get("cursor"):
        window = ["--after-cursor=" + prev["cursor"], "_TRANSPORT=kernel"]  # all boots after the cursor
        after_cursor = prev["cursor"]
    elif since is not None:
        window = ["--since=@%d" % int(since.timestamp()), "_TRANSPORT=kernel"]
    else:
        window = ["-k"]  # current boot, kernel transport
    res = _run_journalctl(base, window, timeout)
    failure = _journal_failed(res)
    if failure and prev.get("cursor") and not res.timed_out and not res.error:
        # The cursor points into a rotated/vacuumed journal file: resume from the saved time instead.
        saved_us = prev.get("realtime_us")
        if saved_us:
            after_us = int(saved_us)
            window = ["--since=@%d" % (after_us // 1000000), "_TRANSPORT=kernel"]
        else:
            window = ["-k"]
        position_notes.append("the journal cursor of the last run is gone (%s): read from the saved time %s instead"
                              % (failure, _iso_us(saved_us) if saved_us else "(none saved: current boot)"))
        res = _run_journalctl(base, window, timeout)
        failure = _journal_failed(res)
    if failure:
        raise ReadError(failure + ". Fix: run with become: true (the system journal needs root or the "
                        "systemd-journal group), or use source=dmesg", res.as_dict())
    if "not seeing messages from other users" in (res.stderr or ""):
        notes.append("journalctl hides system messages from this user: run with become: true")
    scanner = XidScanner(after_realtime_us=after_us, after_cursor=after_cursor, **scanner_opts)
    for line in res.stdout.splitlines():
        scanner.feed_journal_line(line)
    later_boots = [b for b in scanner.journal_boot_ids if prev.get("boot_id") and b != prev["boot_id"]]
    if later_boots and after_cursor:
        position_notes.append("rebooted since the last run (boot %s -> %s): read the rest of the previous boot from "
                              "the journal too" % (prev["boot_id"], ", ".join(later_boots)))
    last = scanner.last_journal
    if last is not None:
        position = {"cursor": last.cursor, "realtime_us": last.realtime_us, "boot_id": last.boot_id,
                    "uptime_s": last.uptime_s}
    else:
        position = {k: prev.get(k) for k in ("cursor", "realtime_us", "boot_id", "uptime_s")}
    if scanner.unparsed_reasons.get("output_cut"):
        notes.append("journalctl printed more than the module keeps (4 MiB): the middle of the log was not read; "
                     "use state_file or since to read smaller windows")
    return scanner, position, position_notes, res


def _iso_us(us):
    try:
        return datetime.datetime.fromtimestamp(int(us) / 1e6, datetime.timezone.utc).isoformat()
    except (TypeError, ValueError, OverflowError, OSError):
        return None


# ---- dmesg ---------------------------------------------------------------------------------------------------------
_UPTIME_RE = re.compile(r"^\[\s*(\d+\.\d+)\]")


def read_dmesg(exe, params, state, scanner_opts, notes):
    res = run_tool([exe], params["timeout"])
    if res.error or res.timed_out or res.rc != 0:
        err = (res.stderr or "").strip()
        if res.error:
            why = res.error
        elif res.timed_out:
            why = "dmesg timed out after %.0f s" % res.duration_s
        else:
            why = "dmesg exited %s: %s" % (res.rc, err[-300:] or "no message")
        if "not permitted" in err or "denied" in err.lower():
            why += (". The kernel restricts the ring buffer to root (kernel.dmesg_restrict=1): run this task with "
                    "become: true, or set sysctl kernel.dmesg_restrict=0, or use source=journal")
        raise ReadError(why, res.as_dict())
    boot_id = _boot_id()
    prev = (state or {}).get("dmesg") or {}
    lines = res.stdout.splitlines()
    stamps = []
    for line in lines:
        match = _UPTIME_RE.match(line)
        stamps.append(float(match.group(1)) if match else None)
    known = [s for s in stamps if s is not None]
    start = 0
    position_notes = []
    if prev.get("uptime_s") is not None:
        saved_up = float(prev["uptime_s"])
        same_boot = (prev.get("boot_id") == boot_id) if (prev.get("boot_id") and boot_id) else \
            (bool(known) and max(known) >= saved_up)
        if not same_boot:
            position_notes.append("rebooted since the last run (boot %s -> %s, uptime reset): dmesg holds only the "
                                  "current boot, so events of the previous boot after uptime %.6f s are not visible "
                                  "here; source=journal reads them" % (prev.get("boot_id"), boot_id, saved_up))
        else:
            if known and min(known) > saved_up:
                position_notes.append("the kernel ring buffer wrapped since the last run: lines logged between "
                                      "uptime %.6f s and %.6f s are lost" % (saved_up, min(known)))
            skip_same = int(prev.get("same_stamp_lines") or 0)
            start = len(lines)
            for i, stamp in enumerate(stamps):
                if stamp is None:
                    continue
                if stamp < saved_up:
                    continue
                if stamp == saved_up and skip_same > 0:
                    skip_same -= 1
                    continue
                start = i
                break
    scanner = XidScanner(boot_id=boot_id, boot_time=_boot_time(), **scanner_opts)
    for line in lines[start:]:
        scanner.feed_line(line)
    position = {"boot_id": boot_id, "uptime_s": prev.get("uptime_s") if boot_id == prev.get("boot_id") else None,
                "same_stamp_lines": prev.get("same_stamp_lines") if boot_id == prev.get("boot_id") else 0}
    if known:
        last = known[-1]
        position = {"boot_id": boot_id, "uptime_s": last, "same_stamp_lines": sum(1 for s in known if s == last)}
    return scanner, position, position_notes, res


# ---- file ----------------------------------------------------------------------------------------------------------
def _rotated_sibling(path, prev):
    """The file that was `path` at the last run (kern.log -> kern.log.1), found by its inode."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    base = os.path.basename(path)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    for name in names:
        if name == base or not name.startswith(base):
            continue
        candidate = os.path.join(directory, name)
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if _same_file(candidate, st, prev):
            return candidate
    return None


HEAD_BYTES = 512


def _head(path, length=HEAD_BYTES):
    """(bytes hashed, sha256) of the first bytes of a (decompressed) file: tells a new file from a grown one when the
    filesystem reuses the inode number of a deleted log."""
    try:
        with open_log(path) as fh:
            data = fh.read(length)
    except (IOError, OSError, EOFError):
        return 0, None
    return len(data), hashlib.sha256(data).hexdigest()


def _same_file(path, st, prev):
    if prev.get("inode") != st.st_ino or prev.get("dev") != st.st_dev:
        return False
    length, digest = _head(path, int(prev.get("head_bytes") or 0))
    return prev.get("head_sha256") is None or (length == prev.get("head_bytes") and digest == prev["head_sha256"])


def _scan(scanner, fh, consume_tail):
    """Scan a stream: kernel log text with the fast binary search, or saved `journalctl -o json` output line by line.

    Returns the bytes consumed (a half-written last line is left for the next run unless consume_tail)."""
    if fh.peek(64)[:64].lstrip().startswith(b"{"):
        consumed = 0
        for line in fh:
            if not line.endswith(b"\n") and not consume_tail:
                break
            scanner.feed_journal_line(line)
            consumed += len(line)
        scanner.bytes_read += consumed
        return consumed
    return scanner.scan_binary(fh, consume_partial_tail=consume_tail)


def _skip(fh, count):
    """Move a plain or gzip stream forward by count bytes (GzipFile.seek reads forward; plain files seek)."""
    fh.seek(count)


def read_file(path, params, state, scanner_opts, notes):
    if not path:
        raise ReadError("source=file needs path")
    try:
        st = os.stat(path)
        gz = is_gzip(path)
    except (IOError, OSError) as exc:
        raise ReadError("cannot read %s: %s. Fix: check the path and run with become: true for system logs"
                        % (path, exc.strerror or exc)) from None
    prev = (state or {}).get("file") or {}
    if prev and prev.get("path") != os.path.abspath(path):
        notes.append("state file was written for %s, not %s: read from the start" % (prev.get("path"), path))
        prev = {}
    opts = dict(scanner_opts)
    opts["reference"] = datetime.datetime.fromtimestamp(st.st_mtime).astimezone()  # syslog has no year
    scanner = XidScanner(**opts)
    consume_tail = not params.get("state_file")  # an unterminated last line may still be being written
    position_notes = []
    offset = 0
    try:
        if prev:
            saved_off = int(prev.get("offset") or 0)
            if prev.get("inode") == st.st_ino and prev.get("dev") == st.st_dev:
                if st.st_size < int(prev.get("size") or 0) or (not gz and st.st_size < saved_off):
                    position_notes.append("%s was truncated since the last run (size %s -> %d): read from the start"
                                          % (path, prev.get("size"), st.st_size))
                elif not _same_file(path, st, prev):
                    position_notes.append("%s was replaced since the last run (same inode number, different content): "
                                          "read from the start; lines logged to the old file after the last run may "
                                          "be missed" % path)
                else:
                    offset = saved_off
            else:
                old = _rotated_sibling(path, prev)
                if old:
                    position_notes.append("%s was rotated since the last run: read the rest of %s from byte %d, "
                                          "then %s from the start" % (path, old, saved_off, path))
                    with open_log(old) as fh:
                        _skip(fh, saved_off)
                        _scan(scanner, fh, True)
                else:
                    position_notes.append("%s was rotated since the last run and the previous file (inode %s) is "
                                          "gone: lines logged between the last run and the rotation may be missed"
                                          % (path, prev.get("inode")))
        with open_log(path) as fh:
            if offset:
                _skip(fh, offset)
            consumed = _scan(scanner, fh, consume_tail)
    except (IOError, OSError, EOFError) as exc:
        raise ReadError("cannot read %s: %s. Fix: check the file (a damaged .gz?) and the permissions (become: true)"
                        % (path, exc)) from None
    head_bytes, head_sha = _head(path)
    position = {"path": os.path.abspath(path), "inode": st.st_ino, "dev": st.st_dev, "gzip": gz,
                "offset": offset + consumed, "size": st.st_size, "head_bytes": head_bytes, "head_sha256": head_sha}
    return scanner, position, position_notes, None


# ---- main ----------------------------------------------------------------------------------------------------------
def _overrides(module):
    result = {}
    for code, severity in (module.params["severity_overrides"] or {}).items():
        try:
            key = int(str(code).strip())
        except ValueError:
            module.fail_json(msg="severity_overrides: key %r is not an XID code (an integer such as 63)" % (code,))
        if severity not in SEVERITIES:
            module.fail_json(msg="severity_overrides: XID %s -> %r is not one of %s"
                             % (code, severity, ", ".join(SEVERITIES)))
        result[key] = severity
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            source=dict(type="str", default="auto", choices=["auto", "journal", "dmesg", "file"]),
            path=dict(type="path"),
            state_file=dict(type="path"),
            since=dict(type="str"),
            timeout=dict(type="int", default=60),
            severity_overrides=dict(type="dict", default={}),
            max_events=dict(type="int", default=500),
            journalctl_executable=dict(type="path"),
            dmesg_executable=dict(type="path"),
        ),
        required_if=[("source", "file", ("path",))],
        supports_check_mode=True,
    )
    params = module.params
    overrides = _overrides(module)
    try:
        since = parse_since(params["since"])
    except (ValueError, OverflowError, OSError) as exc:
        module.fail_json(msg=str(exc))
    if params["timeout"] <= 0 or params["max_events"] <= 0:
        module.fail_json(msg="timeout and max_events must be positive")
    notes = []
    state, state_note = load_state(params["state_file"])
    if state_note:
        notes.append(state_note)
    scanner_opts = {"severity_overrides": overrides, "max_events": params["max_events"], "since": since}
    source = params["source"]
    tool = None
    try:
        if source == "auto":
            jexe = find_tool(module, "journalctl", params["journalctl_executable"])
            if jexe:
                try:
                    scanner, position, pos_notes, res = read_journal(jexe, params, _for(state, "journal", notes),
                                                                     since, scanner_opts, notes)
                    source = "journal"
                except ReadError as exc:
                    notes.append("journal not usable (%s): read dmesg instead" % exc)
                    source = "dmesg"
            else:
                notes.append("journalctl not found: read dmesg")
                source = "dmesg"
        if source == "journal" and params["source"] == "journal":
            jexe = find_tool(module, "journalctl", params["journalctl_executable"])
            if not jexe:
                raise ReadError("journalctl not found%s. Fix: install systemd, set journalctl_executable, or use "
                                "source=dmesg" % (" at " + params["journalctl_executable"]
                                                  if params["journalctl_executable"] else " on PATH"))
            scanner, position, pos_notes, res = read_journal(jexe, params, _for(state, "journal", notes), since,
                                                             scanner_opts, notes)
        elif source == "dmesg":
            dexe = find_tool(module, "dmesg", params["dmesg_executable"])
            if not dexe:
                raise ReadError("dmesg not found%s. Fix: install util-linux, set dmesg_executable, or use "
                                "source=journal" % (" at " + params["dmesg_executable"]
                                                    if params["dmesg_executable"] else " on PATH"))
            scanner, position, pos_notes, res = read_dmesg(dexe, params, _for(state, "dmesg", notes), scanner_opts,
                                                           notes)
        elif source == "file":
            scanner, position, pos_notes, res = read_file(params["path"], params, _for(state, "file", notes),
                                                          scanner_opts, notes)
    except ReadError as exc:
        module.fail_json(msg="xid_facts on %s: %s" % (os.uname()[1], exc), tool=exc.tool,
                         notes=notes)
    tool = res.as_dict() if res is not None else None
    facts = scanner.result()
    unparsed = facts["unparsed"]["by_reason"]
    if unparsed.get("journal_message_null"):
        notes.append("%d journal entries had no MESSAGE (over 4096 bytes without --all)" % unparsed["journal_message_null"])
    saved = False
    if params["state_file"] and not module.check_mode:
        try:
            save_state(params["state_file"], {"version": STATE_VERSION, "source": source, source: position,
                                              "saved_at": _utcnow().isoformat()})
            saved = True
        except (IOError, OSError) as exc:
            module.fail_json(msg="xid_facts: cannot save the read position to %s: %s. Fix: make its directory "
                                 "writable (become: true) or choose another state_file" % (params["state_file"], exc),
                             tool=tool)
    position = dict(position)
    position.update({"kind": source, "state_file": params["state_file"], "saved": saved, "notes": pos_notes})
    facts["source"] = source
    facts["position"] = position
    facts["notes"] = notes + pos_notes
    for note in pos_notes:
        module.warn(note)
    module.exit_json(changed=False, ansible_facts={"gpufleet_xid": facts}, tool=tool)


def _for(state, source, notes):
    """The part of the saved state for this source; a state of another source is ignored, said so."""
    if state is None:
        return None
    if state.get("source") != source:
        notes.append("state file was written for source %s, not %s: read as a first run" % (state.get("source"), source))
        return None
    return state


if __name__ == "__main__":
    main()
