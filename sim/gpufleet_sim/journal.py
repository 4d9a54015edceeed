"""Stand-ins for journalctl and dmesg, both rendering the node's simulated kernel log (<state>/kernel.jsonl).

journalctl: -k/--dmesg, -u/--unit UNIT (the fabric manager's unit: its start-up lines, gpufleet_sim/fabric.py; any
other unit has no entries), -b [ID|OFFSET|all], --boot=all, -o json|short|short-iso|short-precise|short-monotonic|cat,
--after-cursor, --cursor, --cursor-file, --show-cursor, --since/--until (absolute, @epoch, today, yesterday, now,
"N min ago", -Nh), -n/--lines (N or all), -f/--follow, -r, -g/--grep, -p/--priority, --list-boots, FIELD=VALUE matches (_TRANSPORT=kernel,
_BOOT_ID=, PRIORITY=, SYSLOG_IDENTIFIER=), and the no-ops --no-pager -q -a --utc --no-hostname -m --system.
--output-fields (json), dmesg: plain, -T/--ctime, --time-format iso|ctime|raw|notime, -x/--decode, -r/--raw, -t/--notime, -l/--level;
current boot only, like the kernel ring buffer (optionally truncated: scenario kernel_log.ring_buffer_lines).
"""

import calendar
import json
import os
import re
import sys
import time

from . import klog, leak

LEVELS = ["emerg", "alert", "crit", "err", "warn", "notice", "info", "debug"]


def main(node, tool, argv, out=sys.stdout, err=sys.stderr):
    leak.materialize(node)  # the leak's XID lines due by the node's clock
    if tool == "dmesg":
        return dmesg(node, argv, out, err)
    return journalctl(node, argv, out, err)


# ---- journalctl ---------------------------------------------------------------------------------------------
def _parse_time(text, now):
    """journalctl's timestamp syntax (local time). Returns epoch seconds or None."""
    t = text.strip()
    utc = t.endswith(" UTC")
    if utc:
        t = t[:-4]
    if t.startswith("@"):
        try:
            return float(t[1:])
        except ValueError:
            return None
    if t == "now":
        return now
    lt = time.localtime(now)
    midnight = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, -1))
    if t == "today":
        return midnight
    if t == "yesterday":
        return midnight - 86400
    if t == "tomorrow":
        return midnight + 86400
    m = re.match(r"^([+-])?\s*(\d+)\s*(s|sec|second|seconds|m|min|minute|minutes|h|hour|hours|d|day|days|w|week|"
                 r"weeks)?\s*(ago|left)?$", t)
    if m and (m.group(1) or m.group(4)):
        unit = (m.group(3) or "s")[0]
        if m.group(3) and m.group(3).startswith("min"):
            unit = "M"
        mult = {"s": 1, "M": 60, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit]
        sign = -1 if (m.group(1) == "-" or m.group(4) == "ago") else 1
        return now + sign * int(m.group(2)) * mult
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%H:%M:%S", "%H:%M"):
        frac = 0.0
        base = t
        mf = re.match(r"^(.*:\d\d)\.(\d+)$", t)
        if mf and "%S" in fmt:
            base, frac = mf.group(1), float("0." + mf.group(2))
        try:
            parsed = time.strptime(base, fmt)
        except ValueError:
            continue
        if fmt.startswith("%H"):
            parsed = time.struct_time((lt.tm_year, lt.tm_mon, lt.tm_mday) + tuple(parsed)[3:])
        secs = calendar.timegm(parsed) if utc else time.mktime(parsed[:8] + (-1,))
        return secs + frac
    return None


class JArgs:
    def __init__(self):
        self.kernel = False
        self.unit = None
        self.boot = None  # None: all (unless -k), "0", "-1", an id, or "all"
        self.output = "short"
        self.after_cursor = None
        self.cursor = None
        self.cursor_file = None
        self.show_cursor = False
        self.since = None
        self.until = None
        self.lines = None
        self.reverse = False
        self.grep = None
        self.priority = None
        self.quiet = False
        self.list_boots = False
        self.matches = []
        self.utc = False
        self.output_fields = None
        self.follow = False
        self.error = None


_NOOP = {"--no-pager", "-a", "--all", "--no-hostname", "-m", "--merge", "--system", "-x", "--catalog", "--no-full",
         "--full", "-l", "-e", "--pager-end"}


def parse_journal_args(argv, now):
    a = JArgs()
    i = 0

    def take(val):
        nonlocal i
        if val is not None:
            return val
        i += 1
        return argv[i] if i < len(argv) else None
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "=" in arg:
            key, val = arg.split("=", 1)
        elif len(arg) > 2 and arg[0] == "-" and arg[1] in "onpgSUbu" and arg[1] != "-":
            key, val = arg[:2], arg[2:]
        else:
            key, val = arg, None
        if key in ("-k", "--dmesg"):
            a.kernel = True
        elif key in ("-u", "--unit"):
            a.unit = take(val)
        elif key in ("-b", "--boot"):
            if val is None and i + 1 < len(argv) and re.match(r"^(all|[+-]?\d+|[0-9a-f]{32}([+-]\d+)?)$", argv[i + 1]):
                i += 1
                val = argv[i]
            a.boot = val if val is not None else "0"
        elif key in ("-o", "--output"):
            a.output = take(val)
        elif key == "--after-cursor":
            a.after_cursor = take(val)
        elif key in ("-c", "--cursor"):
            a.cursor = take(val)
        elif key == "--cursor-file":
            a.cursor_file = take(val)
        elif key == "--show-cursor":
            a.show_cursor = True
        elif key in ("-S", "--since", "-U", "--until"):
            raw = take(val) or ""
            ts = _parse_time(raw, now)
            if ts is None:
                a.error = "Failed to parse timestamp: %s" % raw
            elif key in ("-S", "--since"):
                a.since = ts
            else:
                a.until = ts
        elif key in ("-n", "--lines"):
            raw = take(val) or "10"
            a.lines = "all" if raw == "all" else (int(raw.lstrip("+")) if raw.lstrip("+").isdigit() else 10)
        elif key in ("-f", "--follow"):
            a.follow = True
        elif key in ("-r", "--reverse"):
            a.reverse = True
        elif key in ("-g", "--grep"):
            a.grep = take(val)
        elif key in ("-p", "--priority"):
            raw = (take(val) or "").split("..")[-1]
            a.priority = int(raw) if raw.isdigit() else (LEVELS.index(raw) if raw in LEVELS else 7)
        elif key in ("-q", "--quiet"):
            a.quiet = True
        elif key == "--list-boots":
            a.list_boots = True
        elif key == "--utc":
            a.utc = True
        elif key == "--output-fields":
            a.output_fields = set((take(val) or "").split(","))
        elif key in _NOOP or key == "--":
            pass
        elif "=" in arg and not arg.startswith("-"):
            a.matches.append(tuple(arg.split("=", 1)))
        else:
            a.error = "%s: unrecognized option '%s'" % ("journalctl", arg)
        i += 1
    return a


def _seq_of_cursor(cur):
    m = re.search(r"(?:^|;)i=([0-9a-f]+)(?:;|$)", cur or "")
    return int(m.group(1), 16) if m else None


def _unit_records(node, unit):
    """The records of a unit's journal (this boot): the fabric manager's, or none."""
    from . import fabric

    fm = fabric.fabric_manager(node)
    if fm is None or unit.replace(".service", "") != fm["service"]:
        return []
    boot = node.info["boots"][-1]
    out = []
    for i, (offset, ident, prio, msg) in enumerate(fabric.fm_journal(node)):
        rec = klog.record(node, boot, boot["start"] + offset, msg, prio)
        rec.update({"seq": 1000000 + i, "ident": ident, "unit": fm["service"] + ".service",
                    "pid": 1 if ident == "systemd" else 1507})
        out.append(rec)
    return out


def _fields(node, rec):
    msg = rec["raw"] if "raw" in rec else rec.get("msg", "")
    if rec.get("unit"):
        return {"__CURSOR": klog.cursor(node.info, rec), "__REALTIME_TIMESTAMP": str(rec["rt"]),
                "__MONOTONIC_TIMESTAMP": str(rec["mono"]), "__SEQNUM": str(rec["seq"]),
                "__SEQNUM_ID": node.info["seqnum_id"], "_BOOT_ID": rec["boot"], "_MACHINE_ID": node.info["machine_id"],
                "_HOSTNAME": node.hostname, "_TRANSPORT": "journal" if rec["ident"] == "systemd" else "stdout",
                "SYSLOG_IDENTIFIER": rec["ident"], "_PID": str(rec["pid"]), "_SYSTEMD_UNIT": rec["unit"] if rec["ident"] != "systemd"
                else "init.scope", "UNIT": rec["unit"], "PRIORITY": str(rec["prio"]), "MESSAGE": msg}
    return {
        "__CURSOR": klog.cursor(node.info, rec),
        "__REALTIME_TIMESTAMP": str(rec["rt"]),
        "__MONOTONIC_TIMESTAMP": str(rec["mono"]),
        "__SEQNUM": str(rec["seq"]),
        "__SEQNUM_ID": node.info["seqnum_id"],
        "_BOOT_ID": rec["boot"],
        "_MACHINE_ID": node.info["machine_id"],
        "_HOSTNAME": node.hostname,
        "_TRANSPORT": "kernel",
        "SYSLOG_FACILITY": "0",
        "SYSLOG_IDENTIFIER": "kernel",
        "PRIORITY": str(rec["prio"]),
        "_SOURCE_MONOTONIC_TIMESTAMP": str(rec["mono"]),
        "MESSAGE": msg,
    }


def _boot_selection(node, spec):
    boots = node.info["boots"]
    if spec is None or spec == "all":
        return None
    if re.match(r"^[+-]?\d+$", spec):
        off = int(spec)
        idx = len(boots) - 1 + off if off <= 0 else off - 1
        return {boots[idx]["id"]} if 0 <= idx < len(boots) else set()
    return {b["id"] for b in boots if b["id"] == spec[:32]}


def journalctl(node, argv, out, err):
    now = time.time()
    a = parse_journal_args(argv, now)
    if a.error:
        err.write(a.error + "\n")
        return 1
    if a.list_boots:
        return _list_boots(node, out)
    boot_spec = a.boot if a.boot is not None else ("0" if a.kernel else None)
    boots = _boot_selection(node, boot_spec)
    if boots is not None and not boots:
        err.write("Data from the specified boot (%s) is not available: No such boot ID in journal\n" % boot_spec)
        return 1
    after = a.after_cursor
    if a.cursor_file:
        try:
            with open(a.cursor_file) as fh:
                after = fh.read().strip() or after
        except OSError:
            pass
    after_seq = _seq_of_cursor(after) if after else None
    from_seq = _seq_of_cursor(a.cursor) if a.cursor else None
    if (after and after_seq is None) or (a.cursor and from_seq is None):
        err.write("Failed to seek to cursor: Invalid argument\n")
        return 1
    grep = re.compile(a.grep) if a.grep else None

    def wanted(rec):
        if boots is not None and rec["boot"] not in boots:
            return None
        if after_seq is not None and rec["seq"] <= after_seq:
            return None
        if from_seq is not None and rec["seq"] < from_seq:
            return None
        if a.since is not None and rec["rt"] < a.since * 1e6:
            return None
        if a.until is not None and rec["rt"] > a.until * 1e6:
            return None
        if a.priority is not None and rec["prio"] > a.priority:
            return None
        fields = _fields(node, rec)
        if any(str(fields.get(k)) != v for k, v in a.matches):
            return None
        if grep and not grep.search(klog.message_bytes(rec).decode("utf-8", "replace")):
            return None
        return fields

    if a.unit is not None:
        records, offset = _unit_records(node, a.unit), None
    else:
        records, offset = _read_records(node.path("kernel.jsonl"), 0)
    recs = [(rec, f) for rec, f in ((rec, wanted(rec)) for rec in records) if f is not None]
    lines = a.lines
    if lines is None and a.follow and not (a.since is not None or after or a.cursor):
        lines = 10  # like journalctl: --follow alone starts with the last 10 entries
    if lines is not None and lines != "all":
        recs = recs[-lines:] if lines else []
    if a.reverse:
        recs.reverse()
    _render(node, a, recs, out)
    if recs and (a.show_cursor or a.cursor_file):
        last = recs[0 if a.reverse else -1][1]["__CURSOR"]
        if a.show_cursor:
            out.write("-- cursor: %s\n" % last)
        if a.cursor_file:
            with open(a.cursor_file, "w") as fh:
                fh.write(last)
    if a.follow and a.unit is None:
        return _follow(node, a, wanted, out, offset, records[-1]["rt"] if records else 0)
    return 0


def _read_records(path, offset):
    """Complete records of kernel.jsonl from byte offset: (records, offset after the last complete line)."""
    out = []
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return out, offset
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out, offset + end


def _follow(node, a, wanted, out, offset, last_rt):
    """-f: print records appended to the log as they come, until killed (SIGTERM) or the reader goes away."""
    path = node.path("kernel.jsonl")
    after_reset = False
    try:
        out.flush()
        while True:
            time.sleep(0.1)
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if size < offset:  # sim/reset: a new log; print only what is newer than what was printed
                offset, after_reset = 0, True
            if size == offset:
                continue
            records, offset = _read_records(path, offset)
            fresh = [(rec, f) for rec, f in ((rec, wanted(rec)) for rec in records
                                             if not after_reset or rec["rt"] > last_rt) if f is not None]
            if records:
                last_rt = max(last_rt, records[-1]["rt"])
            if fresh:
                _render(node, a, fresh, out)
                out.flush()
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


def _render(node, a, recs, out):
    fmt = a.output or "short"
    if fmt not in ("json", "json-seq", "short", "short-iso", "short-precise", "short-monotonic", "cat",
                   "short-unix", "short-full", "with-unit"):
        out.write("")
        return
    if not recs and not fmt.startswith("json") and not a.quiet:
        out.write("-- No entries --\n")
        return
    prev_boot = None
    for rec, fields in recs:
        if fmt.startswith("json"):
            if a.output_fields is not None:
                # These always come, whatever --output-fields says (systemd.journal-fields(7)).
                keep = a.output_fields | {"__CURSOR", "__REALTIME_TIMESTAMP", "__MONOTONIC_TIMESTAMP", "_BOOT_ID",
                                          "__SEQNUM", "__SEQNUM_ID"}
                fields = {k: v for k, v in fields.items() if k in keep}
            out.write(("\x1e" if fmt == "json-seq" else "") + json.dumps(fields, ensure_ascii=False,
                                                                       separators=(",", ":")) + "\n")
            continue
        if prev_boot is not None and rec["boot"] != prev_boot and not a.quiet:
            out.write("-- Boot %s --\n" % rec["boot"])
        prev_boot = rec["boot"]
        msg = klog.message_bytes(rec).decode("utf-8", "replace")
        if fmt == "cat":
            out.write(msg + "\n")
            continue
        secs = rec["rt"] / 1e6
        tm = time.gmtime(secs) if a.utc else time.localtime(secs)
        if fmt == "short-iso":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", tm)
        elif fmt == "short-monotonic":
            stamp = "[%12.6f]" % (rec["mono"] / 1e6)
        elif fmt == "short-unix":
            stamp = "%.6f" % secs
        elif fmt == "short-precise":
            stamp = time.strftime("%b %d %H:%M:%S", tm) + ".%06d" % (rec["rt"] % 1000000)
        else:
            stamp = time.strftime("%b %d %H:%M:%S", tm)
        ident = "%s[%d]" % (rec["ident"], rec["pid"]) if rec.get("ident") else "kernel"
        out.write("%s %s %s: %s\n" % (stamp, node.hostname, ident, msg))


def _list_boots(node, out):
    boots = node.info["boots"]
    recs = node.kernel_records()
    out.write("IDX BOOT ID                          FIRST ENTRY                  LAST ENTRY\n")
    for i, b in enumerate(boots):
        mine = [r["rt"] for r in recs if r["boot"] == b["id"]]
        if not mine:
            continue
        first = time.strftime("%a %Y-%m-%d %H:%M:%S %Z", time.localtime(min(mine) / 1e6))
        last = time.strftime("%a %Y-%m-%d %H:%M:%S %Z", time.localtime(max(mine) / 1e6))
        out.write("%3d %s %s %s\n" % (i - (len(boots) - 1), b["id"], first, last))
    return 0


# ---- dmesg --------------------------------------------------------------------------------------------------
def dmesg(node, argv, out, err):
    if node.scen["kernel_log"].get("dmesg_restricted"):
        err.write("dmesg: read kernel buffer failed: Operation not permitted\n")
        return 1
    mode, decode, raw, levels = "plain", False, False, None
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, _, val = arg.partition("=")
        if key in ("-T", "--ctime"):
            mode = "ctime"
        elif key == "--time-format":
            if not val:
                i += 1
                val = argv[i] if i < len(argv) else ""
            mode = {"iso": "iso", "ctime": "ctime", "raw": "plain", "notime": "notime"}.get(val)
            if mode is None:
                err.write("dmesg: unknown time format: %s\n" % val)
                return 1
        elif key in ("-x", "--decode"):
            decode = True
        elif key in ("-r", "--raw"):
            raw = True
        elif key in ("-t", "--notime"):
            mode = "notime"
        elif key in ("-l", "--level"):
            if not val:
                i += 1
                val = argv[i] if i < len(argv) else ""
            levels = set(LEVELS.index(x) for x in val.split(",") if x in LEVELS)
        elif key in ("-k", "--kernel", "-P", "--nopager", "-L", "--color", "-H", "--human", "-w", "--follow") or \
                key.startswith("--color"):
            pass
        else:
            err.write("dmesg: unrecognized option '%s'\nTry 'dmesg --help' for more information.\n" % arg)
            return 1
        i += 1
    boot = node.boot
    recs = [r for r in node.kernel_records() if r["boot"] == boot["id"]]
    ring = int(node.scen["kernel_log"].get("ring_buffer_lines", 0))
    if ring:
        recs = recs[-ring:]  # the ring buffer forgot the oldest lines
    for rec in recs:
        if levels is not None and rec["prio"] not in levels:
            continue
        msg = _escape(klog.message_bytes(rec))
        secs = boot["start"] + rec["mono"] / 1e6
        if raw:
            out.write("<%d>[%5d.%06d] %s\n" % (rec["prio"], rec["mono"] // 1000000, rec["mono"] % 1000000, msg))
            continue
        if mode == "ctime":
            prefix = "[%s] " % time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(secs))
        elif mode == "iso":
            tm = time.localtime(secs)
            off = tm.tm_gmtoff if hasattr(tm, "tm_gmtoff") else 0
            prefix = "%s,%06d%+03d:%02d " % (time.strftime("%Y-%m-%dT%H:%M:%S", tm), rec["mono"] % 1000000,
                                             off // 3600, abs(off) % 3600 // 60)
        elif mode == "notime":
            prefix = ""
        else:
            prefix = "[%5d.%06d] " % (rec["mono"] // 1000000, rec["mono"] % 1000000)
        if decode:
            prefix = "%-6s:%-6s: " % ("kern", LEVELS[rec["prio"]]) + prefix
        out.write(prefix + msg + "\n")
    return 0


def _escape(data):
    """dmesg prints bytes that are not valid UTF-8 as \\xNN escapes."""
    text = data.decode("utf-8", "backslashreplace")
    return text
