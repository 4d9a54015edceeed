# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Kernel-log XID parser (stdlib only: runs on the node).

Reads NVRM lines from dmesg, syslog files or journald and returns XID events enriched from the catalog, the GPUs that
fell off the bus, and what it could not read. Every variant of the driver's krcReportXid format
(open-gpu-kernel-modules) seen in public bug reports is accepted:

  NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
  NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 31, pid=1234, name=python3, Ch 0000000c, ...   (MIG)
  NVRM: Xid (0000:01:00): 13, Ch 0000000b, engmask 00000120, intr 10000000                     (no PCI:, no pid)
  NVRM: Xid (PCI:0008:01:00): 145, RLW_REMAP  Nonfatal   XC0 i0 Link 05 (0x004f8000 0x0 ...)  (NVLink5)
  NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)

Counting rules (why an event is not a line):
- a burst (same GPU, code, pid and MIG instance within BURST_WINDOW_S; XID 13 prints one line per SM) is ONE event,
  with line_count and up to EVIDENCE_LINES raw lines;
- NVRM lines without "Xid" that follow an event (XID 119's RPC history and stack trace) are folded into it, unless they
  name ANOTHER GPU (a different PCI address, or a different driver instance "GPU5" than the event's "GPU2");
- "RmInitAdapter failed!" / "rm_init_adapter failed" (a GPU the driver could not initialise) is never folded into an
  event: it is reported in init_failures, one entry per GPU with the count of attempts:
    NVRM: GPU 0000:04:01.0: RmInitAdapter failed! (0x11:0x45:2525)
    NVRM: GPU 0000:04:01.0: rm_init_adapter failed, device minor number 0
    NVRM: RmInitAdapter failed! (0x30:0xffff:660)            + NVRM: rm_init_adapter failed for device bearing minor number 0
    NVRM: RmInitAdapter failed! (0x30:0xffffffff:858)        + NVRM: rm_init_adapter(0) failed          (oldest drivers)
- XID 45 is correlated with the Xid that caused it (named by "caused by previous Xid NNN", or the last other Xid on the
  same GPU within CORRELATE_WINDOW_S) and then not counted again; a solo 45 is counted as a warning;
- "fallen off the bus" without an Xid line (one-line or the three-line form) is a lost GPU, reported as a synthetic
  XID 79 event unless the same read holds a real XID 79 for that GPU.
Memory stays bounded: lines are streamed, overlong lines cut at MAX_LINE_CHARS, at most max_events events kept
(the newest; counts in summary cover all).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import re

from ansible_collections.kentino.gpufleet.plugins.module_utils import xid_policy
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import journal_record, split_prefix
from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci
from ansible_collections.kentino.gpufleet.plugins.module_utils.xid_catalog import lookup

BURST_WINDOW_S = 2.0
CORRELATE_WINDOW_S = 30.0
FOLLOW_ON_WINDOW_S = 5.0
EVIDENCE_LINES = 5
MAX_LINE_CHARS = 65536
# One record of saved `journalctl -o json` output: a kernel message with journald's fields is far below this.
MAX_RECORD_BYTES = MAX_LINE_CHARS * 4
SAMPLE_CHARS = 400
MAX_SAMPLES = 5
MAX_GPU_IDS = 256
CHUNK_BYTES = 1024 * 1024  # fits the CPU caches: faster than bigger reads
MARKER = b"NVRM"
# The marker's rarest byte in kernel logs, and how many false hits of it one search takes before it falls back to the
# plain search (a log where that byte is common).
_PROBE, _PROBE_AT, _PROBE_MISSES = b"V", 1, 16


def find_marker(buf, start, end):
    """buf.find(b"NVRM", start, end), about twenty times faster on a kernel log: CPython searches a one-byte needle
    with memchr (vectorised) but a longer one byte by byte. Each hit of the marker's rarest byte is checked whole; a
    log full of that byte falls back to the plain search after a few false hits, so it never costs much more."""
    find = buf.find
    i = find(_PROBE, start + _PROBE_AT, end)
    misses = 0
    while i >= 0:
        at = i - _PROBE_AT
        if buf[at:at + len(MARKER)] == MARKER:
            return at if at + len(MARKER) <= end else -1
        misses += 1
        if misses > _PROBE_MISSES:
            return find(MARKER, at + 1, end)
        i = find(_PROBE, i + 1, end)
    return -1

RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}
NVLINK5_CODES = frozenset(range(144, 151))

_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<addr>[^\s)]*)(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\):\s*(?P<xid>\d+)"
    r"(?:,\s*(?P<rest>.*))?$"
)
_PID_RE = re.compile(r"^pid=(?P<pid>'<unknown>'|<unknown>|'?\d+'?|[^,]*)(?:,\s*name=(?P<name>[^,]*))?(?:,\s*(?P<body>.*))?$")
# "Ch 0000000c" (older), "channel 0x0000000c" (595+), "Channel ID 00000018" (XID 32), "Channel 00000028" (XID 8),
# "ChID 0010" / "ChId 0010" (XID 13 and 69 exception lines); \b keeps "Subchannel 0x0" out.
_CHANNEL_RE = re.compile(r"\b(?:ChID|Ch|Channel(?:\s+ID)?)\s+(?:0x)?([0-9a-fA-F]{1,8})\b", re.I)
_NVLINK5_RE = re.compile(
    r"^\s*(?P<unit>[A-Za-z0-9_]+)\s+(?P<status>Fatal|Nonfatal|Non-fatal)\s+(?:XC(?P<xc>\d+)\s+)?(?:i(?P<inst>\d+)\s+)?"
    r"Link\s+(?P<link>\d+)\s*\((?P<values>[^)]*)\)",
    re.I,
)
_RECOVERY_RE = re.compile(
    r"recovery action changed from (?P<from>0x[0-9a-fA-F]+|\d+)\s*(?:\((?P<from_name>[^)]*)\))?\s*to\s*"
    r"(?P<to>0x[0-9a-fA-F]+|\d+)\s*(?:\((?P<to_name>[^)]*)\))?",
    re.I,
)
_CAUSED_BY_RE = re.compile(r"previous Xid\s*\(?\s*(\d+)", re.I)
_ADDR = r"(?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?"
_ONE_LINE_LOST_RE = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?(" + _ADDR + r"):?\s.*fallen off the bus", re.I)
_THE_GPU_RE = re.compile(r"NVRM: The NVIDIA GPU (" + _ADDR + r")")
_GPU_UUID_RE = re.compile(r"NVRM: GPU at (?:PCI:)?(" + _ADDR + r"):\s*(GPU-[0-9a-fA-F-]+)")
_SERIAL_RE = re.compile(r"NVRM: GPU Board Serial Number:\s*(\S+)")
# The GPU a follow-on line names: a PCI address ("NVRM: GPU 0000:05:00.0: ...") or the driver's instance ("GPU2 ...").
_NAMED_PCI_RE = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?(" + _ADDR + r")\b")
_NAMED_INSTANCE_RE = re.compile(r"NVRM: (?:\S+: )?GPU(\d+)\b")
_BODY_INSTANCE_RE = re.compile(r"\bG(?:PU|SP)(\d+)\b")  # "... RPC response from GPU2 GSP!", "RPC from GSP0!"
_INIT_FAILED_RE = re.compile(r"RmInitAdapter failed!\s*(?:\((?P<code>[^)]*)\))?")
_INIT_MINOR_RE = re.compile(r"rm_init_adapter(?:\((?P<paren>\d+)\))? failed(?:.*?minor number (?P<minor>\d+))?")
MAX_INIT_FAILURES = 64


def _iso(dt):
    return dt.isoformat() if dt is not None else None


def _epoch(dt):
    try:
        return dt.timestamp() if dt is not None else None
    except (OverflowError, ValueError, OSError):
        return None


def _sample(text):
    return text if len(text) <= SAMPLE_CHARS else text[:SAMPLE_CHARS] + "...[%d chars]" % len(text)


def _int_any(text):
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except (ValueError, AttributeError):
        return None


def _instance(body):
    """The driver's GPU instance an Xid body names ("... from GPU2 GSP!"), or None."""
    match = _BODY_INSTANCE_RE.search(body or "")
    return int(match.group(1)) if match else None


def parse_xid_line(message):
    """The fields of one NVRM Xid line (prefix already stripped or not), or None when it is not readable."""
    match = _XID_RE.search(message.rstrip())
    if not match:
        return None
    rest = match.group("rest") or ""
    pid = process = None
    body = rest
    pid_match = _PID_RE.match(rest) if rest.startswith("pid=") else None
    if pid_match:
        raw_pid = pid_match.group("pid").strip("'")
        pid = int(raw_pid) if raw_pid.isdigit() else None
        name = (pid_match.group("name") or "").strip()
        process = None if name in ("", "<unknown>", "'<unknown>'") else name
        body = pid_match.group("body") or ""
    fields = {
        "xid": int(match.group("xid")),
        "pci": normalize_pci(match.group("addr")),
        "pci_raw": match.group("addr"),
        "gpu_instance": int(match.group("gi")) if match.group("gi") is not None else None,
        "compute_instance": int(match.group("ci")) if match.group("ci") is not None else None,
        "pid": pid,
        "process": process,
        "message": body.strip(),
        "channel": None,
        "details": {},
    }
    channel = _CHANNEL_RE.search(body)
    if channel:
        fields["channel"] = int(channel.group(1), 16)
    fields["details"] = _details(fields["xid"], fields["message"])
    return fields


def _details(xid, body):
    """Code-specific decoding of the message body (NVLink5 unit/status/link/subcode, 154 actions, 45 cause)."""
    details = {}
    if xid in NVLINK5_CODES:
        match = _NVLINK5_RE.search(body)
        if match:
            values = [v for v in (_int_any(t) for t in match.group("values").split()) if v is not None]
            details["nvlink"] = {
                "unit": match.group("unit"),
                "fatal": match.group("status").lower() == "fatal",
                "link": int(match.group("link")),
                "xc": int(match.group("xc")) if match.group("xc") is not None else None,
                "instance": int(match.group("inst")) if match.group("inst") is not None else None,
                "values": ["0x%08x" % v for v in values],
                # the subcode is bits 20-25 of the first value
                "subcode": (values[0] >> 20) & 0x3F if values else None,
            }
        else:
            details["problem"] = "NVLink5 body not in the expected '<UNIT> Fatal|Nonfatal ... Link NN (0x...)' form"
    elif xid == 154:
        match = _RECOVERY_RE.search(body)
        if match:
            src, dst = _int_any(match.group("from")), _int_any(match.group("to"))
            details["recovery_action_from"] = {"code": src, "name": RECOVERY_ACTIONS.get(src, match.group("from_name"))}
            details["recovery_action_to"] = {"code": dst, "name": RECOVERY_ACTIONS.get(dst, match.group("to_name"))}
        else:
            details["problem"] = "recovery action not found in the XID 154 body"
    elif xid == 45:
        match = _CAUSED_BY_RE.search(body)
        if match:
            details["caused_by_xid"] = int(match.group(1))
    return details


class XidScanner:
    """Streaming XID parser: feed lines (feed_line / feed_journal_line / scan_binary), then result().

    severity_overrides: {code (int or str): severity} applied last. since: aware datetime; events known to be older
    are skipped. boot_time: aware datetime of the current boot, to date dmesg lines that carry only uptime.
    boot_id: stamped on lines whose source does not say (dmesg). reference: datetime for syslog's missing year.
    after_realtime_us: journald entries at or before this time (and the entry at after_cursor) were read before.
    """

    def __init__(self, severity_overrides=None, max_events=1000, since=None, boot_time=None, boot_id=None,
                 reference=None, after_realtime_us=None, after_cursor=None):
        self.overrides = {}
        for code, severity in (severity_overrides or {}).items():
            self.overrides[int(code)] = severity
        self.max_events = max(1, int(max_events))
        self.since = since
        self.boot_time = boot_time
        self.boot_id = boot_id
        self.reference = reference or datetime.datetime.now().astimezone()
        self.after_realtime_us = after_realtime_us
        self.after_cursor = after_cursor
        self.journal_skipped = 0
        self.journal_boot_ids = []  # distinct boots seen in the journal entries, in order
        self.events = []
        self.dropped = 0
        self.seq = 0
        self.lines_read = 0  # lines fed one by one (journal, dmesg); binary scans count bytes_read instead
        self.bytes_read = 0
        self.xid_lines = 0
        self.skipped_before_since = 0
        self.counts_by_code = {}
        self.counts_by_pci = {}
        self.counts_by_severity = {}
        self.correlated = 0
        self.folded = 0
        self.unparsed_count = 0
        self.unparsed_reasons = {}
        self.unparsed_samples = []
        self.gpu_ids = {}
        self.lost = {}  # pci -> {"line", "time", "uptime_s", "boot_id", "seq", "evidence"}
        self.init_failures = []  # GPUs the driver could not initialise (RmInitAdapter failed), one entry per GPU
        self._last_init = None  # the entry an "rm_init_adapter failed ... minor number N" line completes
        self._last_by_pci = {}  # pci -> last event (for bursts, follow-ons and 45 correlation)
        self._recent_by_pci = {}  # pci -> list of recent events (bounded) for 45 correlation
        self._last_event = None
        self._last_nvrm_kind = None
        self._pending_gpu = None  # [pci, lines left] of "NVRM: The NVIDIA GPU <pci>" awaiting "fallen off the bus"
        self._pending_uuid_pci = None
        self.last_journal = None  # last JournalRecord read (position for incremental reads)
        self._result = None

    # ---- problems -------------------------------------------------------------------------------------------
    def _unparsed(self, reason, line):
        self.unparsed_count += 1
        self.unparsed_reasons[reason] = self.unparsed_reasons.get(reason, 0) + 1
        if len(self.unparsed_samples) < MAX_SAMPLES:
            self.unparsed_samples.append({"reason": reason, "line": _sample(line)})

    # ---- inputs ---------------------------------------------------------------------------------------------
    def feed_line(self, line, boot_id=None):
        """One text line with any dmesg/syslog prefix (str or bytes)."""
        self.lines_read += 1
        if isinstance(line, bytes):
            if b"NVRM" not in line:
                return
            line = line.decode("utf-8", "replace")
        elif "NVRM" not in line:
            return
        self._line(line, boot_id)

    def _line(self, line, boot_id=None):
        if len(line) > MAX_LINE_CHARS:
            self._unparsed("overlong_line", line)
            line = line[:MAX_LINE_CHARS]
        if line.lstrip().startswith("{"):
            self._journal(journal_record(line))
            return
        # Dates are costly to build: skip them for NVRM lines that can only be follow-ons with an uptime stamp.
        init = "nitAdapter" in line or "init_adapter" in line
        want_time = ("Xid" in line or "fallen off" in line or init or self._last_event is None
                     or self._last_event["_t_up"] is None)
        if (not want_time and self._last_nvrm_kind not in ("xid", "follow_on") and self._pending_gpu is None
                and "GPU at " not in line and "The NVIDIA GPU" not in line and "Serial Number" not in line):
            return  # a plain NVRM line with no event to follow (driver banner, GSP notes)
        prefix = split_prefix(line, self.reference, want_time)
        if prefix.uptime_s is None and not want_time:
            prefix = split_prefix(line, self.reference)
        self.feed_message(prefix.message, prefix.time, prefix.uptime_s, boot_id or self.boot_id, line.rstrip("\r\n"))

    def feed_journal_line(self, line):
        """One line of `journalctl -o json` output."""
        self.lines_read += 1
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        if not line.strip():
            return
        if line.startswith("[... ") and "cut by gpufleet" in line:
            self._unparsed("output_cut", line)
            return
        if len(line) > MAX_RECORD_BYTES:
            self._unparsed("overlong_line", line)
            return
        self._journal(journal_record(line))

    def skip_overlong(self, head):
        """A record over the length limit, of which the reader kept only `head`: counted, not parsed."""
        self.lines_read += 1
        self._unparsed("overlong_line", head.decode("utf-8", "replace") if isinstance(head, bytes) else head)

    def _journal(self, rec):
        if (self.after_cursor is not None and rec.cursor == self.after_cursor) or (
                self.after_realtime_us is not None and rec.realtime_us is not None
                and rec.realtime_us <= self.after_realtime_us):
            self.journal_skipped += 1  # read by the previous run (cursor fallback re-reads from its time)
            return
        if rec.problem:
            if rec.problem != "empty":
                self._unparsed("journal_" + rec.problem, "%s (cursor %s)" % (rec.problem, rec.cursor))
            if rec.cursor:
                self.last_journal = rec
            return
        if rec.cursor:
            self.last_journal = rec
        if rec.boot_id and rec.boot_id not in self.journal_boot_ids and len(self.journal_boot_ids) < 16:
            self.journal_boot_ids.append(rec.boot_id)
        for message in rec.messages:
            if "NVRM" in message:
                for part in message.splitlines() or [message]:
                    self.feed_message(part, rec.time, rec.uptime_s, rec.boot_id, part)

    def scan_binary(self, fh, consume_partial_tail=True, chunk_bytes=CHUNK_BYTES):
        """Stream a binary file object: find NVRM lines with bytearray.find (no per-line Python work for the rest).

        One reused buffer (readinto): no fresh allocation and page faults per chunk. Lines are not counted (that alone
        would cost more than the search). Returns the bytes consumed (through the last complete line; the
        unterminated tail too when consume_partial_tail): the resume offset for incremental reads.
        """
        consumed = 0
        carry = b""  # head of an unfinished line, at most MAX_LINE_CHARS bytes
        carry_len = 0  # its true length
        buf = bytearray(max(1, int(chunk_bytes)))
        while True:
            size = fh.readinto(buf)
            if not size:
                break
            first_nl = buf.find(b"\n", 0, size)
            if first_nl < 0:
                if len(carry) < MAX_LINE_CHARS:
                    carry += bytes(buf[:min(size, MAX_LINE_CHARS - len(carry))])
                carry_len += size
                continue
            if carry_len:
                line = carry + bytes(buf[:min(first_nl, max(0, MAX_LINE_CHARS - len(carry)))])
                self._bytes_line(line, carry_len + first_nl)
            elif find_marker(buf, 0, first_nl) >= 0:
                self._bytes_line(bytes(buf[:min(first_nl, MAX_LINE_CHARS)]), first_nl)
            last_nl = buf.rfind(b"\n", 0, size)
            if last_nl > first_nl:
                self._scan_region(buf, first_nl + 1, last_nl)
            consumed += carry_len + last_nl + 1
            carry = bytes(buf[last_nl + 1:min(size, last_nl + 1 + MAX_LINE_CHARS)])
            carry_len = size - last_nl - 1
        if carry_len and consume_partial_tail:
            self._bytes_line(carry, carry_len)
            consumed += carry_len
        self.bytes_read += consumed
        return consumed

    def scan_lines(self, block, start=0, end=None):
        """block[start:end], whole lines (the last ending with a newline, as a follower hands them out): its NVRM
        lines, found with bytes.find in place (no copy of the block, no per-line Python work for the rest)."""
        end = len(block) if end is None else end
        if end > start:
            self._scan_region(block, start, end - 1)
            self.bytes_read += end - start

    def _scan_region(self, buf, start, end):
        """Lines of buf[start:end] (end is the index of a newline) that contain NVRM."""
        find = buf.find
        pos = start
        while True:
            i = find_marker(buf, pos, end)
            if i < 0:
                return
            line_start = buf.rfind(b"\n", pos, i) + 1
            if line_start == 0:
                line_start = pos
            line_end = find(b"\n", i, end + 1)
            if i >= line_start + MAX_LINE_CHARS:  # NVRM only beyond the part of an overlong line we read
                self._unparsed("overlong_line", bytes(buf[line_start:line_start + SAMPLE_CHARS]).decode("utf-8", "replace"))
            else:
                self._bytes_line(bytes(buf[line_start:min(line_end, line_start + MAX_LINE_CHARS)]),
                                 line_end - line_start)
            pos = line_end + 1

    def _bytes_line(self, data, true_len):
        if b"NVRM" not in data:
            if true_len > MAX_LINE_CHARS and b"Xid" in data:
                self._unparsed("overlong_line", data[:SAMPLE_CHARS].decode("utf-8", "replace"))
            return
        text = data.decode("utf-8", "replace")
        if true_len > MAX_LINE_CHARS:
            self._unparsed("overlong_line", text)
        self._line(text[:MAX_LINE_CHARS])

    # ---- one kernel message -------------------------------------------------------------------------------
    def feed_message(self, message, time=None, uptime_s=None, boot_id=None, raw=None):
        """One kernel message without its prefix. time: aware datetime or None; uptime_s: float or None."""
        if "NVRM" not in message:
            return
        raw = raw if raw is not None else message
        if time is None and uptime_s is not None and self.boot_time is not None:
            try:
                time = self.boot_time + datetime.timedelta(seconds=uptime_s)
            except OverflowError:
                time = None
        if "RmInitAdapter failed" not in message and "rm_init_adapter" not in message:
            self._last_init = None  # the companion line follows its RmInitAdapter line directly
        if "NVRM: Xid" in message:
            self._xid(message, time, uptime_s, boot_id, raw)
            self._last_nvrm_kind = "xid"
            return
        lower = message.lower()
        if "fallen off the bus" in lower:
            self._fallen_off(message, time, uptime_s, boot_id, raw)
        elif "NVRM: The NVIDIA GPU " in message:
            match = _THE_GPU_RE.search(message)
            self._pending_gpu = [normalize_pci(match.group(1)) if match else None, 3, raw]
            self._last_nvrm_kind = "other"
        elif "NVRM: GPU at " in message:
            match = _GPU_UUID_RE.search(message)
            if match:
                pci = normalize_pci(match.group(1))
                if pci and (pci in self.gpu_ids or len(self.gpu_ids) < MAX_GPU_IDS):
                    self.gpu_ids.setdefault(pci, {"uuid": None, "serial": None})["uuid"] = match.group(2)
                    self._pending_uuid_pci = pci
        elif "GPU Board Serial Number" in message:
            match = _SERIAL_RE.search(message)
            if match and self._pending_uuid_pci in self.gpu_ids:
                self.gpu_ids[self._pending_uuid_pci]["serial"] = match.group(1)
            self._pending_uuid_pci = None
        elif "RmInitAdapter failed" in message or "rm_init_adapter" in message:
            self._init_failed(message, time, uptime_s, boot_id, raw)
        elif self._pending_gpu is None:
            self._follow_on(message, raw, time, uptime_s)
        if self._pending_gpu is not None and "NVRM: The NVIDIA GPU " not in message:
            self._pending_gpu[1] -= 1
            if self._pending_gpu[1] <= 0:
                self._pending_gpu = None

    def _before_since(self, time):
        if self.since is None or time is None:
            return False
        try:
            return time < self.since
        except TypeError:
            return False

    def _fallen_off(self, message, time, uptime_s, boot_id, raw):
        match = _ONE_LINE_LOST_RE.search(message)
        pci = normalize_pci(match.group(1)) if match else None
        evidence = [raw]
        if pci is None and self._pending_gpu is not None:
            pci = self._pending_gpu[0]
            evidence = [self._pending_gpu[2], raw]
        self._pending_gpu = None
        if self._before_since(time):
            self.skipped_before_since += 1
            return
        if pci is None:
            self._unparsed("fallen_off_without_pci", raw)
            return
        self.seq += 1
        if pci not in self.lost:
            self.lost[pci] = {"line": evidence[0], "evidence": evidence, "time": time, "uptime_s": uptime_s,
                              "boot_id": boot_id, "seq": self.seq}

    def _init_failed(self, message, time, uptime_s, boot_id, raw):
        """RmInitAdapter failed (the GPU did not initialise) and its companion rm_init_adapter line: one entry per GPU
        (PCI address, or the device minor number on drivers that print no address), attempts counted."""
        if self._before_since(time):
            self.skipped_before_since += 1
            return
        named = _NAMED_PCI_RE.search(message)
        pci = normalize_pci(named.group(1)) if named else None
        init = _INIT_FAILED_RE.search(message)
        if init:
            self.seq += 1
            # Without an address, which GPU this is is known only from the companion line (minor number): merged there.
            entry = next((e for e in self.init_failures if e["pci"] == pci), None) if pci is not None else None
            if entry is None:
                entry = {"kind": "init_failed", "pci": pci, "minor": None, "code": init.group("code"), "count": 0,
                         "time": _iso(time), "uptime_s": uptime_s, "boot_id": boot_id, "line": _sample(raw),
                         "evidence": [], "_seq": self.seq}
                if len(self.init_failures) < MAX_INIT_FAILURES:
                    self.init_failures.append(entry)
            entry["count"] += 1
            if len(entry["evidence"]) < EVIDENCE_LINES:
                entry["evidence"].append(_sample(raw))
            self._last_init = entry
            return
        match = _INIT_MINOR_RE.search(message)
        if not match:
            return
        minor = match.group("minor") or match.group("paren")
        minor = int(minor) if minor is not None else None
        entry = self._last_init
        self._last_init = None
        if entry is None or (pci is not None and entry["pci"] not in (None, pci)):
            return  # a companion line without its RmInitAdapter line: nothing to add to
        if len(entry["evidence"]) < EVIDENCE_LINES:
            entry["evidence"].append(_sample(raw))
        if entry["minor"] is None and minor is not None:
            entry["minor"] = minor
            if entry["pci"] is None:  # a retry of an address-less GPU: its first entry has the same minor number
                first = next((e for e in self.init_failures if e is not entry and e["pci"] is None
                              and e["minor"] == minor), None)
                if first is not None:
                    first["count"] += entry["count"]
                    for line in entry["evidence"]:
                        if len(first["evidence"]) < EVIDENCE_LINES:
                            first["evidence"].append(line)
                    if entry in self.init_failures:
                        self.init_failures.remove(entry)

    def _follow_on(self, message, raw, time, uptime_s):
        """An NVRM line without Xid right after an event (XID 119's RPC history, stack notes) belongs to it, unless it
        names another GPU: such a line is not this event's (and does not end the event's run of follow-ons)."""
        event = self._last_event
        if event is None or self._last_nvrm_kind not in ("xid", "follow_on"):
            return
        if not self._close(event, time, uptime_s, FOLLOW_ON_WINDOW_S):
            return
        named = _NAMED_PCI_RE.search(message)
        if named and event["pci"] is not None and normalize_pci(named.group(1)) not in (None, event["pci"]):
            return
        instance = _NAMED_INSTANCE_RE.search(message)
        if instance and event.get("_instance") is not None and int(instance.group(1)) != event["_instance"]:
            return
        if instance and event.get("_instance") is None:
            event["_instance"] = int(instance.group(1))
        event["line_count"] += 1
        if len(event["evidence"]) < EVIDENCE_LINES:
            event["evidence"].append(_sample(raw))
        self._last_nvrm_kind = "follow_on"

    @staticmethod
    def _close(event, time, uptime_s, window):
        """Whether a line at (time, uptime_s) is within window seconds after the event's last line."""
        if uptime_s is not None and event["_t_up"] is not None:
            return 0 <= uptime_s - event["_t_up"] <= window
        epoch = _epoch(time)
        if epoch is not None and event["_t_epoch"] is not None:
            return 0 <= epoch - event["_t_epoch"] <= window
        # no usable time on either side: only a directly following line belongs
        return True

    def _xid(self, message, time, uptime_s, boot_id, raw):
        self.xid_lines += 1
        fields = parse_xid_line(message)
        if fields is None:
            self._unparsed("xid_line", raw)
            self._last_event = None
            return
        if self._before_since(time):
            self.skipped_before_since += 1
            self._last_event = None
            return
        pci = fields["pci"]
        key = (pci, fields["gpu_instance"], fields["compute_instance"], fields["xid"], fields["pid"],
               (fields["details"].get("nvlink") or {}).get("link"))
        last = self._last_by_pci.get(pci)
        if (last is not None and fields["xid"] != 154 and last["_key"] == key
                and (self._last_event is last or uptime_s is not None or time is not None)
                and self._close(last, time, uptime_s, BURST_WINDOW_S)):
            last["line_count"] += 1
            last["_t_up"] = uptime_s if uptime_s is not None else last["_t_up"]
            last["_t_epoch"] = _epoch(time) if time is not None else last["_t_epoch"]
            if len(last["evidence"]) < EVIDENCE_LINES:
                last["evidence"].append(_sample(raw))
            if last["channel"] is None:  # XID 13 bursts name the channel on a later line ("ChID 0010")
                last["channel"] = fields["channel"]
            self.folded += 1
            self._last_event = last
            return
        info = lookup(fields["xid"])
        self.seq += 1
        event = {
            "xid": fields["xid"],
            "pci": pci,
            "gpu_instance": fields["gpu_instance"],
            "compute_instance": fields["compute_instance"],
            "pid": fields["pid"],
            "process": fields["process"],
            "message": _sample(fields["message"]),
            "channel": fields["channel"],
            "mnemonic": info["mnemonic"],
            "description": info["description"],
            "action": info["action"],
            "severity": None,
            "severity_basis": None,
            "time": _iso(time),
            "uptime_s": uptime_s,
            "boot_id": boot_id,
            "line": _sample(raw),
            "line_count": 1,
            "evidence": [_sample(raw)],
            "details": fields["details"],
            "counted": True,
            "correlated_with": None,
            "synthetic": False,
            "uuid": None,
            "serial": None,
            "_key": key,
            "_seq": self.seq,
            "_t_up": uptime_s,
            "_t_epoch": _epoch(time),
            "_instance": _instance(fields["message"]),
        }
        if fields["xid"] == 45:
            self._correlate_45(event)
        # One policy (xid_policy): the fleet report recomputes the same severity from the same event.
        event["severity"], event["severity_basis"] = xid_policy.severity(
            event["xid"], event["details"], event["correlated_with"], self.overrides)
        self._add(event)

    def _correlate_45(self, event):
        cause = event["details"].get("caused_by_xid")
        for prior in reversed(self._recent_by_pci.get(event["pci"], [])):
            if prior["xid"] == 45 or (cause is not None and prior["xid"] != cause):
                continue
            if not self._close(prior, *self._event_when(event), window=CORRELATE_WINDOW_S):
                if cause is None:
                    continue
            event["counted"] = False
            event["correlated_with"] = {"xid": prior["xid"], "line": prior["line"]}
            return

    @staticmethod
    def _event_when(event):
        time = None
        if event["_t_epoch"] is not None:
            time = datetime.datetime.fromtimestamp(event["_t_epoch"], datetime.timezone.utc)
        return time, event["_t_up"]

    def _add(self, event):
        pci = event["pci"]
        self._last_by_pci[pci] = event
        recent = self._recent_by_pci.setdefault(pci, [])
        recent.append(event)
        if len(recent) > 16:
            del recent[0]
        if len(self._recent_by_pci) > MAX_GPU_IDS:  # fuzzed input with endless addresses: forget the oldest
            oldest = next(iter(self._recent_by_pci))
            self._recent_by_pci.pop(oldest, None)
            self._last_by_pci.pop(oldest, None)
        self._last_event = event
        self._count(event)
        self.events.append(event)
        if len(self.events) > self.max_events:
            del self.events[0]
            self.dropped += 1

    def _count(self, event):
        if not event["counted"]:
            self.correlated += 1
            return
        code = str(event["xid"])
        pci = event["pci"] or "unknown"
        self.counts_by_code[code] = self.counts_by_code.get(code, 0) + 1
        self.counts_by_pci[pci] = self.counts_by_pci.get(pci, 0) + 1
        self.counts_by_severity[event["severity"]] = self.counts_by_severity.get(event["severity"], 0) + 1

    # ---- output ---------------------------------------------------------------------------------------------
    def _public(self, event):
        out = {k: v for k, v in event.items() if not k.startswith("_")}
        ids = self.gpu_ids.get(event["pci"]) or {}
        out["uuid"], out["serial"] = ids.get("uuid"), ids.get("serial")
        return out

    def take_new(self):
        """What was found since the previous call, for a reader that never stops (the XID watcher); result() is for
        one read. Returns {"events": new events oldest first (result()'s keys plus epoch_s, the time of the event's
        latest line), "lost": [{pci, epoch_s, boot_id, line, evidence}] of GPUs newly reported fallen off the bus
        (with or without an Xid line), "unparsed": {reason: lines}, "events_dropped": events beyond max_events}.

        What is handed out is forgotten, and so are the per-read tallies of result()'s summary: months of following
        keep memory bounded. Bursts and XID 45 correlation still see the recent events (a burst continued in a later
        read is folded into its event, not counted again). A GPU reported lost again is handed out again: the caller
        decides what one loss is (the watcher counts one per GPU and boot).
        """
        events = []
        for event in self.events:
            out = self._public(event)
            out["epoch_s"] = event["_t_epoch"]
            events.append(out)
        lost = [{"pci": pci, "epoch_s": _epoch(item["time"]), "boot_id": item["boot_id"], "line": item["line"],
                 "evidence": list(item["evidence"])}
                for pci, item in sorted(self.lost.items(), key=lambda kv: kv[1]["seq"])]
        taken = {"events": events, "lost": lost, "unparsed": dict(self.unparsed_reasons),
                 "events_dropped": self.dropped}
        del self.events[:]
        self.lost.clear()
        self.unparsed_reasons.clear()
        self.dropped = 0
        self.counts_by_code.clear()
        self.counts_by_pci.clear()
        self.counts_by_severity.clear()
        return taken

    def result(self):
        """{events, lost_gpus, init_failures, gpu_ids, summary, highest_severity, unparsed} (docs/contracts.md)."""
        if self._result is not None:  # synthetic events are added once
            return self._result
        xid79 = {e["pci"] for e in self.events if e["xid"] == 79}
        xid79.update(p for p, e in self._last_by_pci.items() if e["xid"] == 79)
        for pci, lost in sorted(self.lost.items(), key=lambda kv: kv[1]["seq"]):
            if pci in xid79:
                continue
            info = lookup(79)
            severity, basis = xid_policy.severity(79, overrides=self.overrides, synthetic=True)
            event = {
                "xid": 79, "pci": pci, "gpu_instance": None, "compute_instance": None, "pid": None, "process": None,
                "message": "GPU has fallen off the bus (no Xid line)", "channel": None,
                "mnemonic": info["mnemonic"], "description": info["description"], "action": info["action"],
                "severity": severity, "severity_basis": basis, "time": _iso(lost["time"]),
                "uptime_s": lost["uptime_s"], "boot_id": lost["boot_id"], "line": _sample(lost["line"]),
                "line_count": len(lost["evidence"]), "evidence": [_sample(x) for x in lost["evidence"]],
                "details": {}, "counted": True, "correlated_with": None, "synthetic": True, "uuid": None,
                "serial": None, "_seq": lost["seq"],
            }
            self._count(event)
            self.events.append(event)
        self.events.sort(key=lambda e: e["_seq"])
        while len(self.events) > self.max_events:
            del self.events[0]
            self.dropped += 1
        events = [self._public(event) for event in self.events]
        counted = [s for s, n in self.counts_by_severity.items() if n]
        highest = max(counted, key=xid_policy.rank) if counted else "none"
        lost_gpus = sorted(set(self.lost) | xid79 - {None})
        self._result = {
            "events": events,
            "lost_gpus": lost_gpus,
            "init_failures": [{k: v for k, v in e.items() if not k.startswith("_")}
                              for e in sorted(self.init_failures, key=lambda e: e["_seq"])],
            "gpu_ids": {pci: dict(v) for pci, v in sorted(self.gpu_ids.items())},
            "summary": {
                "events": sum(self.counts_by_code.values()),
                "by_code": dict(sorted(self.counts_by_code.items(), key=lambda kv: int(kv[0]))),
                "by_pci": dict(sorted(self.counts_by_pci.items())),
                "by_severity": dict(self.counts_by_severity),
                "correlated": self.correlated,
                "burst_lines_folded": self.folded,
                "xid_lines": self.xid_lines,
                "lines_read": self.lines_read,
                "bytes_read": self.bytes_read,
                "skipped_before_since": self.skipped_before_since,
                "events_dropped": self.dropped,
                "init_failures": len(self.init_failures),
            },
            "highest_severity": highest,
            "unparsed": {
                "count": self.unparsed_count,
                "by_reason": dict(self.unparsed_reasons),
                "samples": list(self.unparsed_samples),
            },
        }
        return self._result


def parse_kernel_log(text, **options):
    """Parse kernel log text from dmesg (any -T/-x/iso form) or a syslog file. Never raises on bad input.

    options: those of XidScanner. Returns XidScanner.result().
    """
    scanner = XidScanner(**options)
    for line in (text or "").splitlines():
        scanner.feed_line(line)
    return scanner.result()


def parse_journal_json(text, **options):
    """Parse `journalctl -k -o json` output (one JSON object a line). Never raises on bad input."""
    scanner = XidScanner(**options)
    for line in (text or "").splitlines():
        scanner.feed_journal_line(line)
    return scanner.result()
