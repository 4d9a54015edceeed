# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Read PyTorch flight-recorder dumps safely and reduce them to what the analysis needs.

A dump is a pickle written by a training process on a node (TORCH_NCCL_DEBUG_INFO_TEMP_FILE / TORCH_FR_DUMP_TEMP_FILE
prefix + rank) into a directory every user can write. Unpickling runs code chosen by whoever wrote the file, so:
- find_class refuses every global and persistent_load every persistent id: no callable can reach the pickle machine,
  so REDUCE/BUILD/NEWOBJ have nothing to call. Only dict, list, tuple, str, int, float, bool, None (and bytes) result;
  sets and byte arrays (opcodes without a global) are refused by a type check;
- the input is size-limited, and its worst-case memory (containers per opcode byte) is estimated before loading;
- every read of the unpickler goes through a reader that stops at a deadline.
Format (torch/csrc/distributed/c10d/FlightRecorder.hpp, fr_trace's loader): {version "2.x", pg_config {pg name:
{name, desc, ranks "[0, 1]"}}, pg_status {pg id: {last_enqueued_collective, last_started_collective,
last_completed_collective}} (2.4+), entries [{record_id, pg_id, process_group (name, desc), collective_seq_id,
p2p_seq_id, is_p2p, profiling_name "nccl:all_reduce", input_sizes, output_sizes, input_dtypes, output_dtypes, state
scheduled|started|completed, time_created_ns, timeout_ms, frames [{name, filename, line}]}]}. Unknown keys are ignored.
"""

from __future__ import annotations

import json
import pickle
import time

MAX_DUMP_BYTES = 64 * 1024 * 1024
MAX_DUMP_SECONDS = 20.0
MAX_MEMORY_BYTES = 1024 * 1024 * 1024
TAIL_ENTRIES = 64  # per process group: the entries kept for the stuck region (the rest only feeds the mismatch scan)
_ALLOWED = (dict, list, tuple, str, int, float, bool, bytes, type(None))
# Opcode bytes that create a container or string object (each at most ~72 bytes of memory); every other byte adds
# at most a pointer slot or a small int. An upper bound, because the same bytes also occur inside strings.
_CREATORS = b"}]\x8f\x85\x86\x87tld\x8cXUTBC\x8e\x8d\x96\x95\x94"
# Opcodes that make sets or byte arrays: without any of these bytes none can exist, and the type walk is skipped.
_UNUSUAL = (b"\x8f", b"\x90", b"\x91", b"\x96", b"\x97", b"\x98")
# Collectives whose per-rank sizes differ legitimately (uneven splits, root-only buffers, point-to-point).
_SIZE_FREE = ("all_to_all", "scatter", "gather", "_v", "send", "recv", "coalesced", "barrier")


class DumpError(Exception):
    """A dump that cannot be used; the message names the file, what is wrong and what to do."""


class _Deadline:
    """A read-only file over bytes whose every call checks the deadline (the C unpickler reads through it)."""

    def __init__(self, data, name, seconds):
        self._view = memoryview(data)
        self._pos = 0
        self._name = name
        self._seconds = seconds
        self._deadline = time.monotonic() + seconds

    def _check(self):
        if time.monotonic() > self._deadline:
            raise DumpError("%s: reading took longer than %.0f s (time limit): not used" % (self._name, self._seconds))

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


def memory_estimate(data):
    """Worst-case bytes of Python objects the pickle can create (an upper bound, computed at C speed)."""
    creators = sum(data.count(bytes((b,))) for b in _CREATORS)
    return 12 * len(data) + 72 * creators


def _check_types(obj, name, limit=5000000):
    """Refuse anything but the plain types (iterative: shared and self-referencing containers are visited once)."""
    seen = set()
    stack = [obj]
    count = 0
    while stack:
        item = stack.pop()
        if not isinstance(item, _ALLOWED):
            raise DumpError("%s: refused, it contains a %s; a flight-recorder dump holds only dicts, lists, tuples, "
                            "strings and numbers" % (name, type(item).__name__))
        if isinstance(item, (dict, list, tuple)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            count += 1
            if count > limit:
                raise DumpError("%s: more than %d containers: not used" % (name, limit))
            stack.extend(item.keys() if isinstance(item, dict) else ())
            stack.extend(item.values() if isinstance(item, dict) else item)


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
    estimate = memory_estimate(data)
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
    if any(op in data for op in _UNUSUAL):
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


def signature(entry):
    """What every rank of a collective must agree on: the op, and for plain collectives sizes and dtypes."""
    op = op_name(entry.get("profiling_name"))
    if any(tag in op for tag in _SIZE_FREE):
        return op
    dtypes = "%s>%s" % (",".join(d for d in (entry.get("input_dtypes") or [])[:8] if isinstance(d, str)),
                        ",".join(d for d in (entry.get("output_dtypes") or [])[:8] if isinstance(d, str)))
    return "%s(%s -> %s; %s)" % (op, _sizes(entry.get("input_sizes")), _sizes(entry.get("output_sizes")), dtypes)


def reduce_dump(dump, rank, name):
    """Dump dict -> {rank, file, version, pgs {pg name: {...}}, signatures [(pg name, seq, sig)], problems}.

    Per process group: desc, pg_id, ranks (from pg_config, None when unknown), last enqueued/started/completed
    (pg_status first: gloo leaves entry states at 'scheduled'; else from the entries), the last TAIL_ENTRIES
    entries {seq, op, sig, state, time_created_ns, frames}. signatures feed the cross-rank mismatch scan.
    """
    problems = []
    version = _str(dump.get("version"), 20)
    config = dump.get("pg_config") if isinstance(dump.get("pg_config"), dict) else {}
    status = dump.get("pg_status") if isinstance(dump.get("pg_status"), dict) else {}
    entries = dump.get("entries") if isinstance(dump.get("entries"), list) else []
    pgs = {}
    signatures = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        pg = entry.get("process_group")
        pg_name = _str(pg[0], 100) if isinstance(pg, (list, tuple)) and pg else _str(entry.get("pg_name"), 100)
        pg_desc = _str(pg[1], 100) if isinstance(pg, (list, tuple)) and len(pg) > 1 else None
        if pg_name is None:
            pg_name = str(_int(entry.get("pg_id")))
        is_p2p = entry.get("is_p2p") is True or op_name(entry.get("profiling_name")) in ("send", "recv")
        seq = _int(entry.get("p2p_seq_id") if is_p2p else entry.get("collective_seq_id"))
        if seq is None:
            continue
        info = pgs.get(pg_name)
        if info is None:
            info = pgs[pg_name] = {"name": pg_name, "desc": pg_desc, "pg_id": _int(entry.get("pg_id")), "ranks": None,
                                   "entries": [], "max_seq": -1, "max_started": -1, "max_completed": -1,
                                   "status_source": "entries", "last_enqueued": None, "last_started": None,
                                   "last_completed": None, "entries_read": 0}
        info["entries_read"] += 1
        if is_p2p:
            continue  # point-to-point ops have their own sequence; the status below is about collectives
        state = _str(entry.get("state"), 20)
        info["max_seq"] = max(info["max_seq"], seq)
        if state in ("started", "completed"):
            info["max_started"] = max(info["max_started"], seq)
        if state == "completed":
            info["max_completed"] = max(info["max_completed"], seq)
        sig = signature(entry)
        signatures.append((pg_name, seq, sig))
        info["entries"].append({"seq": seq, "op": op_name(entry.get("profiling_name")), "sig": sig, "state": state,
                                "time_created_ns": _int(entry.get("time_created_ns")),
                                "timeout_ms": _int(entry.get("timeout_ms")), "frames": entry.get("frames")})
        if len(info["entries"]) > 2 * TAIL_ENTRIES:
            del info["entries"][:TAIL_ENTRIES]
    _apply_config(pgs, config, problems, name)
    for info in pgs.values():
        info["entries"] = info["entries"][-TAIL_ENTRIES:]
        for entry in info["entries"]:
            entry["frames"] = user_frames(entry["frames"])
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
    """load_dump + reduce_dump. Returns (reduced dict, None) or (None, error message); never raises."""
    try:
        dump = load_dump(data, name, **limits)
        return reduce_dump(dump, rank, name), None
    except DumpError as exc:
        return None, str(exc)
    except Exception as exc:  # a shape the reduction did not foresee: that dump is lost, the analysis goes on
        return None, "%s: not usable (%s: %s)" % (name, type(exc).__name__, str(exc)[:200])
