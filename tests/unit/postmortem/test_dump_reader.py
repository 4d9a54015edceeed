"""Flight-recorder dumps are read with a restricted unpickler: limits, refusals, and the reduction to status."""

import os
import pickle
import subprocess
import sys
import time

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import dump_reader
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem.dump_reader import (
    DumpError,
    load_dump,
    read_dump,
    reduce_dump,
)
from helpers.fr_dumps import job_dumps
from hypothesis import given, settings
from hypothesis import strategies as st


class _Touch:
    """A payload: unpickling it with pickle.loads creates a file (os.system would do anything)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class _Shell:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, ("touch %s" % self.path,))


@pytest.mark.parametrize("payload", [_Touch, _Shell])
def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path, payload):
    target = tmp_path / "pwned"
    data = pickle.dumps({"version": "2.10", "entries": [payload(str(target))]}, protocol=2)
    with pytest.raises(DumpError) as info:
        load_dump(data, "nccl_trace_rank_3")
    assert "nccl_trace_rank_3" in str(info.value) and "refused" in str(info.value)
    assert not target.exists()
    reduced, error = read_dump(data, 3, "nccl_trace_rank_3")
    assert reduced is None and "refused" in error and not target.exists()
    # The payload is live: plain pickle.loads (in another process) does create the file.
    subprocess.run([sys.executable, "-c", "import pickle,sys; pickle.loads(sys.stdin.buffer.read())"], input=data,
                   check=False, capture_output=True, timeout=60)
    assert target.exists()


def test_protocol_4_and_5_globals_are_refused_too(tmp_path):
    target = tmp_path / "pwned"
    for proto in (4, 5):
        data = pickle.dumps([_Touch(str(target))], protocol=proto)
        with pytest.raises(DumpError):
            load_dump(data, "x")
    assert not target.exists()


def test_truncated_dump_is_an_error_naming_the_file():
    data = pickle.dumps(job_dumps(world=2)[0], protocol=2)
    reduced, error = read_dump(data[: len(data) // 2], 1, "nccl_trace_rank_1")
    assert reduced is None and error.startswith("nccl_trace_rank_1: unreadable pickle") and "truncated" in error


@pytest.mark.parametrize("data,words", [
    (b"", "empty file"),
    (b"PK\x03\x04 a zip", "not a pickle"),
    (pickle.dumps([1, 2, 3], protocol=2), "not a flight-recorder dict"),
    (pickle.dumps({"a": 1}, protocol=2), "without entries"),
    (pickle.dumps({"entries": [{1, 2}]}, protocol=4), "contains a set"),
    (pickle.dumps({"entries": [bytearray(b"x")]}, protocol=5), "contains a bytearray"),
])
def test_not_a_dump(data, words):
    with pytest.raises(DumpError) as info:
        load_dump(data, "f")
    assert words in str(info.value)


def test_size_and_memory_limits():
    data = pickle.dumps(job_dumps(world=2)[0], protocol=2)
    with pytest.raises(DumpError, match="over the 100-byte limit"):
        load_dump(data, "f", max_bytes=100)
    # 1 MB of empty dicts: ~64 MB of objects from 1 MB of input; the estimate refuses it before unpickling.
    bomb = b"\x80\x02(" + b"}" * 1_000_000 + b"l."
    assert dump_reader.memory_estimate(bomb) > 64_000_000
    with pytest.raises(DumpError, match="could need up to"):
        load_dump(bomb, "f", max_memory=32 * 1024 * 1024)


def test_time_limit_stops_a_slow_read(monkeypatch):
    data = pickle.dumps(job_dumps(world=2, seq=5000, history=4000)[0], protocol=2)
    clock = iter(range(0, 10_000_000, 10))  # every look at the CPU clock is 10 s later
    monkeypatch.setattr(dump_reader.time, "thread_time", lambda: next(clock))
    with pytest.raises(DumpError, match="more than 20 s of CPU time"):
        load_dump(data, "f")


def test_a_busy_controller_does_not_refuse_a_dump(monkeypatch):
    """Wall time stretched by other work (every look at the wall clock 10 s later) is not the reading's cost."""
    data = pickle.dumps(job_dumps(world=2, seq=5000, history=4000)[0], protocol=2)
    clock = iter(range(0, 10_000_000, 10))
    monkeypatch.setattr(dump_reader.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(dump_reader.time, "time", lambda: next(clock))
    assert load_dump(data, "f")["entries"]


def test_shared_and_self_referencing_containers_are_walked_once():
    inner = [1]
    inner.append(inner)
    data = pickle.dumps({"entries": [inner, frozenset()]}, protocol=4)
    with pytest.raises(DumpError, match="frozenset"):
        load_dump(data, "f")


def test_restricted_load_equals_pickle_loads_and_is_fast():
    data = pickle.dumps(job_dumps(world=2, seq=3000, history=2000)[0], protocol=2)
    assert load_dump(data, "f") == pickle.loads(data)
    start = time.perf_counter()
    for _ in range(5):
        load_dump(data, "f")
    assert (time.perf_counter() - start) / 5 < 1.0  # a generous bound: the benchmark measures the real figure


@pytest.mark.parametrize("version", ["2.4", "2.10"])
def test_reduce_reads_status_from_pg_status_or_from_the_entries(version):
    dumps = job_dumps(world=4, culprit=2, seq=50, history=10, mode="stop", version=version)
    waiting = reduce_dump(dumps[0], 0, "r0")["pgs"]["0"]
    stopped = reduce_dump(dumps[2], 2, "r2")["pgs"]["0"]
    assert (waiting["last_enqueued"], waiting["last_completed"]) == (52, 49)
    assert (stopped["last_enqueued"], stopped["last_completed"]) == (49, 49)
    assert waiting["status_source"] == ("pg_status" if version == "2.10" else "entries")
    assert waiting["ranks"] == [0, 1, 2, 3] and waiting["desc"] == "default_pg"
    assert waiting["entries"][-3]["frames"][0] == "reduce_gradients at /srv/train/trainer.py:141"


def test_reduce_tolerates_unknown_keys_and_wrong_types():
    dump = {"version": 3, "entries": ["x", {"process_group": 5, "collective_seq_id": "7"}, {"collective_seq_id": 1,
            "process_group": ["0", "default_pg"], "profiling_name": None, "state": 4, "frames": "no"}],
            "pg_config": {"0": {"ranks": "[0, 1"}}, "pg_status": [], "future_key": object.__name__}
    out = reduce_dump(dump, 0, "f")
    assert out["version"] is None and out["pgs"]["0"]["last_enqueued"] == 1 and out["pgs"]["0"]["ranks"] is None


BOMBS = {
    # 9 bytes: store None at memo index 2**31-1. The C unpickler grows its memo array to that index at once: 38 s and
    # 4 GB for a file that passes the memory estimate (9 bytes of input).
    "LONG_BINPUT": b"\x80\x02Nr\xff\xff\xff\x7f.",
    "PUT (text)": b"\x80\x02Np2147483647\n.",
    "BINPUT past the stores": b"\x80\x02Nq\x00Nq\xc8.",
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_memo_index_the_stream_cannot_fill_is_refused_before_unpickling(name):
    # In a child with 1 GiB of address space, so that a reader without the check fails there, not on this machine.
    probe = ("import resource, sys, time\n"
             "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
             "from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem.dump_reader import read_dump\n"
             "t = time.monotonic()\n"
             "reduced, error = read_dump(%r, 0, 'nccl_trace_rank_0')\n"
             "print('%%.3f' %% (time.monotonic() - t), error)" % BOMBS[name])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    seconds, error = out.stdout.strip().split(" ", 1)
    assert error.startswith("nccl_trace_rank_0: refused, the pickle stores to memo index "), error
    assert "not a flight-recorder dump" in error and float(seconds) < 1.0


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_memo_scan_accepts_every_protocol_pickle_writes(protocol):
    dump = job_dumps(world=2, seq=300, history=200)[0]
    data = pickle.dumps(dump, protocol=protocol)
    assert load_dump(data, "f") == dump


def test_reading_workers_cannot_take_more_memory_than_the_limit():
    # The pool's children start with RLIMIT_AS at their own size plus the dump memory limit: an allocation past it is
    # a MemoryError in the child (that dump is refused), never the controller's memory.
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import flight

    init, args = flight.worker_setup([], 256 * 1024 * 1024)
    probe = ("init, args = %r, %r\n"
             "import resource\n"
             "init(*args)\n"
             "soft, _hard = resource.getrlimit(resource.RLIMIT_AS)\n"
             "try:\n"
             "    block = bytes(1024 * 1024 * 1024)\n"  # calloc: no page touched where it is allowed
             "    print(soft, 'allocated')\n"
             "except MemoryError:\n"
             "    print(soft, 'refused')\n" % (init, args))
    out = subprocess.run([sys.executable, "-c", probe.replace("<built-in function exec>", "exec")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    soft, outcome = out.stdout.split()
    assert outcome == "refused" and int(soft) > 256 * 1024 * 1024


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.sampled_from([b"", b"\x80\x02", b"\x80\x04\x95"]))
def test_any_bytes_are_a_dump_or_a_dump_error(data, head):
    try:
        load_dump(head + data, "f", max_memory=64 * 1024 * 1024)
    except DumpError:
        pass
