# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Read PyTorch flight-recorder dumps safely and reduce them to what the analysis needs.

A dump is a pickle written by a training process on a node (TORCH_NCCL_DEBUG_INFO_TEMP_FILE / TORCH_FR_DUMP_TEMP_FILE
prefix + rank) into a directory every user can write. Unpickling runs code chosen by whoever wrote the file, so:
- find_class refuses every global and persistent_load every persistent id: no callable can reach the pickle machine,
  so REDUCE/BUILD/NEWOBJ have nothing to call. Only dict, list, tuple, str, int, float, bool, None (and bytes) result;
  sets and byte arrays (opcodes without a global) are refused by a type check;
- the input is size-limited, its opcodes are walked first (memo_scan: a store to a memo index the stream cannot
  have filled would make the C unpickler allocate gigabytes in one step), and its worst-case memory (containers per
  opcode byte, the memo array) is estimated before loading;
- every read of the unpickler goes through a reader that stops at a deadline of the reading thread's CPU time (a
  slow pickle costs CPU; a busy controller stretches wall time, and must not refuse a dump a quiet one would read).
Format (torch/csrc/distributed/c10d/FlightRecorder.hpp, fr_trace's loader): {version "2.x", pg_config {pg name:
{name, desc, ranks "[0, 1]"}}, pg_status {pg id: {last_enqueued_collective, last_started_collective,
last_completed_collective}} (2.4+), entries [{record_id, pg_id, process_group (name, desc), collective_seq_id,
p2p_seq_id, is_p2p, profiling_name "nccl:all_reduce", input_sizes, output_sizes, input_dtypes, output_dtypes, state
scheduled|started|completed, time_created_ns, timeout_ms, frames [{name, filename, line}]}]}. Unknown keys are ignored.
"""

from __future__ import annotations

import base64
import gc
import json
import pickle
import pickletools
import time

MAX_DUMP_BYTES = 64 * 1024 * 1024
MAX_DUMP_SECONDS = 20.0
MAX_MEMORY_BYTES = 1024 * 1024 * 1024
TAIL_ENTRIES = 64  # per process group: the entries kept for the stuck region (the rest only feeds the mismatch scan)
# Opcode bytes that create a container or string object (each at most ~72 bytes of memory); every other byte adds
# at most a pointer slot or a small int. An upper bound, because the same bytes also occur inside strings.
_CREATORS = b"}]\x8f\x85\x86\x87tld\x8cXUTBC\x8e\x8d\x96\x95\x94"
# Collectives whose per-rank sizes differ legitimately (uneven splits, root-only buffers, point-to-point).
_SIZE_FREE = ("all_to_all", "scatter", "gather", "_v", "send", "recv", "coalesced", "barrier")


class DumpError(Exception):
    """A dump that cannot be used; the message names the file, what is wrong and what to do."""


class _Deadline:
    """A read-only file over bytes whose every call checks the CPU-time deadline (the C unpickler reads through it)."""

    def __init__(self, data, name, seconds):
        self._view = memoryview(data)
        self._pos = 0
        self._name = name
        self._seconds = seconds
        self._deadline = time.thread_time() + seconds

    def _check(self):
        if time.thread_time() > self._deadline:
            raise DumpError("%s: reading took more than %.0f s of CPU time (time limit): not used"
                            % (self._name, self._seconds))

    def read(self, n=-1):
        self._check()
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        out = self._view[self._pos:end].tobytes()
        self._pos = end
        return out

    def readinto(self, buf):
        self._check()
        n = min(len(buf), len(self._view) - self._pos)
        buf[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def readline(self):
        self._check()
        chunk = self._view[self._pos:self._pos + 65536].tobytes()
        cut = chunk.find(b"\n")
        out = chunk if cut < 0 else chunk[:cut + 1]
        self._pos += len(out)
        return out

    def peek(self, n=0):
        self._check()
        return self._view[self._pos:self._pos + max(n, 65536)].tobytes()


class _Restricted(pickle.Unpickler):
    def __init__(self, fh, name):
        super().__init__(fh)
        self._name = name

    def find_class(self, module, name):
        raise DumpError("%s: refused, the pickle asks for %s.%s: a flight-recorder dump holds only dicts, lists, "
                        "strings and numbers. Nothing from it was run; find out who wrote this file"
                        % (self._name, str(module)[:80], str(name)[:80]))

    def persistent_load(self, pid):
        raise DumpError("%s: refused, the pickle references a persistent object (%r): not a flight-recorder dump"
                        % (self._name, str(pid)[:80]))


def memory_estimate(data, memo_slots=0):
    """Worst-case bytes of Python objects the pickle can create (an upper bound, computed at C speed), plus the C
    unpickler's memo array for memo_slots entries (it doubles: 16 bytes a slot)."""
    creators = len(data) - len(data.translate(None, _CREATORS))
    return 12 * len(data) + 72 * creators + 16 * memo_slots


def _opcode_table():
    """Per opcode byte, from pickletools' descriptions: ("fixed", argument bytes), ("line", newline-terminated
    arguments) or ("counted", bytes of the little-endian length before the data, signed); None: not an opcode."""
    table = [None] * 256
    counted = {pickletools.TAKEN_FROM_ARGUMENT1: (1, False), pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
               pickletools.TAKEN_FROM_ARGUMENT4U: (4, False), pickletools.TAKEN_FROM_ARGUMENT8U: (8, False)}
    for op in pickletools.opcodes:
        arg = op.arg
        if arg is None or arg.n >= 0:
            table[ord(op.code)] = ("fixed", arg.n if arg is not None else 0, False)
        elif arg.n == pickletools.UP_TO_NEWLINE:
            table[ord(op.code)] = ("line", 2 if arg.name == "stringnl_noescape_pair" else 1, False)
        else:
            table[ord(op.code)] = ("counted",) + counted[arg.n]
    return table


_OPCODES = _opcode_table()
_FIXED = [entry[1] if entry and entry[0] == "fixed" else -1 for entry in _OPCODES]
_PUT, _BINPUT, _LONG_BINPUT, _MEMOIZE = (ord(pickletools.code2op[c].code) for c in "pqr\x94")
_MEMO = [code if code in (_BINPUT, _LONG_BINPUT, _MEMOIZE) else 0 for code in range(256)]  # stores of fixed size


def memo_scan(data, name):
    """Walk the opcodes (arguments skipped by their length, not parsed) and return how many memo stores there are.

    Raises DumpError for a store to an index no sequence of stores in this stream could have reached (pickle and
    torch's pickler number them 0, 1, 2 ...): one such opcode makes the C unpickler grow its memo to that index at
    once, gigabytes from a few bytes. A stream that ends early or holds an unknown byte or a negative length is left
    to the unpickler, which refuses it."""
    fixed, memo, table, find, n = _FIXED, _MEMO, _OPCODES, data.find, len(data)  # locals: the loop runs per opcode
    pos = stores = 0
    while pos < n:
        code = data[pos]
        pos += 1
        size = fixed[code]
        if size >= 0:
            pos += size
            if not memo[code]:
                continue
            if pos > n:
                return stores
            if memo[code] == _MEMOIZE:
                stores += 1
                continue
            index = int.from_bytes(data[pos - size:pos], "little")  # BINPUT, LONG_BINPUT
        elif table[code] is None:
            return stores
        elif table[code][0] == "counted":
            _kind, size, signed = table[code]
            length = int.from_bytes(data[pos:pos + size], "little", signed=signed)
            if length < 0:
                return stores
            pos += size + length
            continue
        else:
            index = None
            for _line in range(table[code][1]):
                end = find(b"\n", pos)
                if end < 0:
                    return stores
                if code == _PUT:
                    text = data[pos:end]
                    if text.isdigit():  # anything else is the unpickler's to refuse
                        index = int(text) if len(text) < 20 else 10 ** 19
                pos = end + 1
        if index is not None:
            if index > stores:
                raise DumpError("%s: refused, the pickle stores to memo index %d after %d stores (a forged pickle: it "
                                "would take gigabytes to unpickle): not a flight-recorder dump" % (name, index, stores))
            stores += 1
    return stores


def _check_types(obj, name):
    """Refuse sets, frozensets and byte arrays (the only other types a pickle without globals can make).

    Pickled again with protocol 2, every plain type (dict, list, tuple, str, int, float, bool, None) needs no global
    and bytes needs only _codecs.encode; sets and byte arrays need builtins.<type>. Done in C and memoized, so shared
    and self-referencing containers cost nothing extra. A string that happens to hold such a global's text is refused
    too: refusing is the safe side."""
    try:
        again = pickle.dumps(obj, protocol=2, fix_imports=False)
    except (RecursionError, pickle.PicklingError, TypeError, ValueError, MemoryError) as exc:
        raise DumpError("%s: refused, its structure cannot be checked (%s): not used" % (name, type(exc).__name__)) \
            from None
    for kind in (b"set", b"frozenset", b"bytearray"):
        if b"cbuiltins\n" + kind + b"\n" in again:
            raise DumpError("%s: refused, it contains a %s; a flight-recorder dump holds only dicts, lists, tuples, "
                            "strings and numbers" % (name, kind.decode()))
    if b"cbuiltins\n" in again:
        raise DumpError("%s: refused, it contains an object of an unexpected type" % name)


def load_dump(data, name, max_bytes=MAX_DUMP_BYTES, max_seconds=MAX_DUMP_SECONDS, max_memory=MAX_MEMORY_BYTES):
    """Unpickle a dump with the restrictions above. Returns the top-level dict; raises DumpError naming the file."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DumpError("%s: no dump bytes (got %s)" % (name, type(data).__name__))
    data = bytes(data)
    if not data:
        raise DumpError("%s: empty file (the process died while dumping, or the dump was never written)" % name)
    if len(data) > max_bytes:
        raise DumpError("%s: %d bytes, over the %d-byte limit: not read (raise the limit or lower "
                        "TORCH_NCCL_TRACE_BUFFER_SIZE)" % (name, len(data), max_bytes))
    estimate = memory_estimate(data, memo_scan(data, name))
    if estimate > max_memory:
        raise DumpError("%s: could need up to %d MiB of memory to unpickle (limit %d MiB): not read"
                        % (name, estimate // 1048576, max_memory // 1048576))
    if data[:1] != b"\x80":
        raise DumpError("%s: not a pickle (no protocol header): not a flight-recorder dump" % name)
    try:
        obj = _Restricted(_Deadline(data, name, max_seconds), name).load()
    except DumpError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            OverflowError, MemoryError, RecursionError, UnicodeDecodeError) as exc:
        raise DumpError("%s: unreadable pickle (%s: %s): truncated or damaged; the other ranks are analysed without "
                        "it" % (name, type(exc).__name__, str(exc)[:200])) from None
    _check_types(obj, name)
    if not isinstance(obj, dict):
        raise DumpError("%s: the pickle holds a %s, not a flight-recorder dict" % (name, type(obj).__name__))
    if "entries" not in obj and "pg_status" not in obj:
        raise DumpError("%s: a dict without entries or pg_status: not a flight-recorder dump" % name)
    return obj


# ---- reduction -------------------------------------------------------------------------------------------------------
def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value, limit=200):
    return value[:limit] if isinstance(value, str) else None


def _sizes(value):
    """input_sizes [[4096, 1024]] -> '4096x1024' (one string a tensor, comma-joined)."""
    if not isinstance(value, (list, tuple)):
        return ""
    parts = []
    for shape in value[:64]:
        if isinstance(shape, (list, tuple)):
            parts.append("x".join(str(d) for d in shape[:16] if isinstance(d, int)))
    return ",".join(parts)


def _ranks(text):
    if isinstance(text, (list, tuple)):
        return sorted(r for r in text if isinstance(r, int))
    if not isinstance(text, str) or len(text) > 2000000:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return sorted(r for r in value if isinstance(r, int)) if isinstance(value, list) else None


def frame_text(frame):
    if not isinstance(frame, dict):
        return None
    return "%s at %s:%s" % (_str(frame.get("name"), 120) or "?", _str(frame.get("filename"), 300) or "?",
                            frame.get("line") if isinstance(frame.get("line"), int) else "?")


def user_frames(frames, limit=6):
    """The stack of an entry, innermost torch frames dropped: where in the training code the collective was called."""
    if not isinstance(frames, (list, tuple)):
        return []
    out = []
    for frame in frames:
        text = frame_text(frame)
        if text is None:
            continue
        filename = _str(frame.get("filename"), 300) or ""
        if not out and ("-packages/torch/" in filename or filename.startswith(("torch/", "../torch/"))):
            continue  # torch's own wrappers (distributed_c10d.py, c10d_logger.py) sit above the caller
        out.append(text)
        if len(out) >= limit:
            break
    return out


def op_name(profiling_name):
    name = _str(profiling_name) or "?"
    return name.split(":", 1)[1] if ":" in name else name


_SIGNATURES = {}


def signature(entry):
    """What every rank of a collective must agree on: the op, and for plain collectives sizes and dtypes.

    Most entries repeat a few shapes: the result is cached on the raw fields' text (C-speed str of short lists)."""
    key = (str(entry.get("profiling_name")), str(entry.get("input_sizes")), str(entry.get("output_sizes")),
           str(entry.get("input_dtypes")), str(entry.get("output_dtypes")))
    sig = _SIGNATURES.get(key)
    if sig is None:
        if len(_SIGNATURES) > 100000:
            _SIGNATURES.clear()
        sig = _SIGNATURES[key] = _signature(entry)
    return sig


def _signature(entry):
    op = op_name(entry.get("profiling_name"))
    if any(tag in op for tag in _SIZE_FREE):
        return op
    dtypes = "%s>%s" % (",".join(d for d in (entry.get("input_dtypes") or [])[:8] if isinstance(d, str)),
                        ",".join(d for d in (entry.get("output_dtypes") or [])[:8] if isinstance(d, str)))
    return "%s(%s -> %s; %s)" % (op, _sizes(entry.get("input_sizes")), _sizes(entry.get("output_sizes")), dtypes)


def reduce_dump(dump, rank, name):
    """Dump dict -> {rank, file, version, pgs {pg name: {...}}, signatures {pg name: [(seq, sig)]}, problems}.

    Per process group: desc, pg_id, ranks (from pg_config, None when unknown), last enqueued/started/completed
    (pg_status first: gloo leaves entry states at 'scheduled'; else from the entries), the last TAIL_ENTRIES
    collectives {seq, op, sig, state, time_created_ns, frames}: the stuck region, and what the cross-rank mismatch
    scan compares (a desync that hangs a job sits at its end; older history only feeds the status).
    """
    problems = []
    version = _str(dump.get("version"), 20)
    config = dump.get("pg_config") if isinstance(dump.get("pg_config"), dict) else {}
    status = dump.get("pg_status") if isinstance(dump.get("pg_status"), dict) else {}
    entries = dump.get("entries") if isinstance(dump.get("entries"), list) else []
    pgs = {}
    last_pg, info = None, None
    # With pg_status (2.4+ dumps) the status is read from it: only the end of the buffer is needed (the stuck region),
    # so the entries are walked from the end until every group has its tail. Without it, all entries give the status.
    backwards = any(isinstance(v, dict) for v in status.values())
    enough = 4 * TAIL_ENTRIES * max(1, len(config), len(status))
    scanned = 0
    for entry in (reversed(entries) if backwards else entries):
        if backwards:
            scanned += 1
            if scanned > enough and all(len(i["entries"]) >= TAIL_ENTRIES for i in pgs.values()):
                break
        if type(entry) is not dict:
            continue
        pg = entry.get("process_group")
        if pg is not last_pg:  # consecutive entries of one group share nothing but the names: look them up once
            if type(pg) in (list, tuple) and pg:
                pg_name, pg_desc = _str(pg[0], 100), (_str(pg[1], 100) if len(pg) > 1 else None)
            else:
                pg_name, pg_desc = _str(entry.get("pg_name"), 100), None
            if pg_name is None:
                pg_name = str(_int(entry.get("pg_id")))
            info = pgs.get(pg_name)
            if info is None:
                info = pgs[pg_name] = {"name": pg_name, "desc": pg_desc, "pg_id": _int(entry.get("pg_id")),
                                       "ranks": None, "entries": [], "max_seq": -1, "max_started": -1,
                                       "max_completed": -1, "status_source": "entries", "last_enqueued": None,
                                       "last_started": None, "last_completed": None, "entries_read": 0}
            last_pg = pg
        info["entries_read"] += 1
        if entry.get("is_p2p") is True:
            continue  # point-to-point ops have their own sequence; the status below is about collectives
        seq = entry.get("collective_seq_id")
        if type(seq) is not int:
            continue
        state = entry.get("state")
        if seq > info["max_seq"]:
            info["max_seq"] = seq
        if state == "completed":
            if seq > info["max_completed"]:
                info["max_completed"] = seq
            if seq > info["max_started"]:
                info["max_started"] = seq
        elif state == "started" and seq > info["max_started"]:
            info["max_started"] = seq
        tail = info["entries"]
        if backwards:
            if len(tail) < TAIL_ENTRIES:
                tail.append(entry)
            continue
        tail.append(entry)
        if len(tail) > 2 * TAIL_ENTRIES:
            del tail[:TAIL_ENTRIES]
    if backwards:
        for info in pgs.values():
            info["entries"].reverse()
    _apply_config(pgs, config, problems, name)
    signatures = {}
    for info in pgs.values():
        kept = []
        for entry in info["entries"][-TAIL_ENTRIES:]:
            op = op_name(entry.get("profiling_name"))
            if op in ("send", "recv"):
                continue
            kept.append({"seq": entry["collective_seq_id"], "op": op, "sig": signature(entry),
                         "state": _str(entry.get("state"), 20), "time_created_ns": _int(entry.get("time_created_ns")),
                         "timeout_ms": _int(entry.get("timeout_ms")), "frames": user_frames(entry.get("frames"))})
        info["entries"] = kept
        signatures[info["name"]] = [(e["seq"], e["sig"]) for e in kept]
        st = status.get(str(info["pg_id"])) if info["pg_id"] is not None else None
        if isinstance(st, dict) and _int(st.get("last_enqueued_collective")) is not None:
            info["last_enqueued"] = _int(st.get("last_enqueued_collective"))
            info["last_started"] = _int(st.get("last_started_collective"))
            info["last_completed"] = _int(st.get("last_completed_collective"))
            info["status_source"] = "pg_status"
        else:
            info["last_enqueued"], info["last_started"], info["last_completed"] = (
                info["max_seq"], info["max_started"], info["max_completed"])
        for key in ("max_seq", "max_started", "max_completed"):
            info.pop(key)
    if not entries and not status:
        problems.append("%s: the dump holds no entries and no pg_status (flight recorder off: set "
                        "TORCH_NCCL_TRACE_BUFFER_SIZE, e.g. 20000)" % name)
    return {"rank": rank, "file": name, "version": version, "pgs": pgs, "signatures": signatures,
            "entries_total": len(entries), "problems": problems}


def _apply_config(pgs, config, problems, name):
    """Members of each process group from pg_config (keyed by pg name; gloo in torch 2.13 writes one entry keyed '')."""
    by_name = {}
    for key, value in config.items():
        if isinstance(value, dict):
            ranks = _ranks(value.get("ranks"))
            by_name[_str(value.get("name"), 100) or _str(key, 100) or ""] = (ranks, _str(value.get("desc"), 100))
    for info in pgs.values():
        found = by_name.get(info["name"])
        if found is None and len(by_name) == 1 and len(pgs) == 1:
            found = next(iter(by_name.values()))  # the only group of the dump, under another name
            problems.append("%s: pg_config names the group %r, the entries %r: read as the same group"
                            % (name, next(iter(by_name)), info["name"]))
        if found is not None:
            info["ranks"] = found[0]
            info["desc"] = info["desc"] or found[1]


def read_dump(data, rank, name, **limits):
    """load_dump + reduce_dump of bytes (or of their base64 text). Returns (reduced dict, None) or (None, error
    message); never raises.

    The cyclic garbage collector is paused meanwhile (as torch's fr_trace loader does): a dump is tens of thousands
    of fresh containers and no cycles, and the collector would walk them again and again (a third of the time)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        if isinstance(data, str):  # base64 as job_evidence sends it: decoded here, in the reading process
            try:
                data = base64.b64decode(data, validate=True)
            except ValueError as exc:
                raise DumpError("%s: the dump sent by the node is not valid base64 (%s)" % (name, exc)) from None
        dump = load_dump(data, name, **limits)
        return reduce_dump(dump, rank, name), None
    except DumpError as exc:
        return None, str(exc)
    except Exception as exc:  # a shape the reduction did not foresee: that dump is lost, the analysis goes on
        return None, "%s: not usable (%s: %s)" % (name, type(exc).__name__, str(exc)[:200])
    finally:
        if paused:
            gc.enable()
