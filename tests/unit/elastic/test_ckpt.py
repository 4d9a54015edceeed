"""gpufleet_ckpt: a checkpoint is offered only once it is complete; a writer killed mid-write (a real process,
SIGKILL) leaves nothing that latest() or resume() would return; pruning and replacing never expose a partial one."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import gpufleet_ckpt as ck

REPO = Path(__file__).resolve().parents[3]


def write_state(content):
    def write(d):
        Path(d, "state.bin").write_bytes(content)
        Path(d, "shard").mkdir()
        Path(d, "shard", "opt.bin").write_bytes(content[::-1])
    return write


def test_save_then_latest_and_find(tmp_path):
    assert ck.latest(str(tmp_path)) is None
    ck.save(str(tmp_path), 10, write_state(b"a" * 100), extra={"loss": 2.5})
    ck.save(str(tmp_path), 20, write_state(b"b" * 50))
    got = ck.latest(str(tmp_path))
    assert got.step == 20 and got.path == str(tmp_path / "step-000000000020")
    assert got.manifest["files"] == {"state.bin": 50, "shard/opt.bin": 50}
    assert ck.find(str(tmp_path), 10).manifest["extra"] == {"loss": 2.5}
    assert ck.find(str(tmp_path), 15) is None
    assert [c.step for c in ck.complete(str(tmp_path))] == [10, 20]
    assert sorted(os.listdir(tmp_path)) == ["step-000000000010", "step-000000000020"]  # no staging left


def test_keep_prunes_oldest(tmp_path):
    for step in (1, 2, 3, 4):
        ck.save(str(tmp_path), step, write_state(b"x"), keep=2)
    assert [c.step for c in ck.complete(str(tmp_path))] == [3, 4]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    with pytest.raises(ValueError):
        ck.prune(str(tmp_path), 0)


def test_incomplete_and_damaged_checkpoints_are_skipped_with_the_reason(tmp_path):
    ck.save(str(tmp_path), 5, write_state(b"good"))
    # a writer that died before the rename
    (tmp_path / ".partial-step-000000000009-123-abc").mkdir()
    (tmp_path / ".partial-step-000000000009-123-abc" / "state.bin").write_bytes(b"half")
    # a directory with the final name but no manifest (copied by hand, or a foreign tool)
    (tmp_path / "step-000000000007").mkdir()
    # a complete one damaged afterwards (truncated file)
    ck.save(str(tmp_path), 8, write_state(b"0123456789"))
    (tmp_path / "step-000000000008" / "state.bin").write_bytes(b"01234")
    skipped = []
    got = ck.latest(str(tmp_path), skipped)
    assert got.step == 5
    reasons = dict(skipped)
    assert "not renamed yet" in reasons[".partial-step-000000000009-123-abc"]
    assert "gpufleet-manifest.json" in reasons["step-000000000007"]
    assert "5 bytes" in reasons["step-000000000008"]


def test_saving_a_step_again_replaces_it(tmp_path):
    ck.save(str(tmp_path), 3, write_state(b"old"))
    ck.save(str(tmp_path), 3, write_state(b"newer"))
    assert ck.latest(str(tmp_path)).manifest["files"]["state.bin"] == 5


def test_a_failing_writer_leaves_nothing(tmp_path):
    def boom(d):
        Path(d, "state.bin").write_bytes(b"partial")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError):
        ck.save(str(tmp_path), 1, boom)
    assert ck.latest(str(tmp_path)) is None
    assert os.listdir(tmp_path) == []


def test_commit_without_staging_and_unserialisable_extra_raise_checkpoint_error(tmp_path):
    with pytest.raises(ck.CheckpointError, match="no staging directory"):
        ck.commit(str(tmp_path), 4)
    ck.begin(str(tmp_path), 4)
    with pytest.raises(ck.CheckpointError, match="step 4"):
        ck.commit(str(tmp_path), 4, extra={"bad": object()})
    assert ck.latest(str(tmp_path)) is None


def test_sharded_begin_commit_and_leftover_cleanup(tmp_path):
    d = str(tmp_path)
    stale = ck.begin(d, 2)
    Path(stale, "rank1.bin").write_bytes(b"abandoned")
    staging = ck.begin(d, 3, clear=True)
    for rank in range(3):
        Path(staging, "rank%d.bin" % rank).write_bytes(b"r" * (rank + 1))
    got = ck.commit(d, 3)
    assert got.manifest["files"] == {"rank0.bin": 1, "rank1.bin": 2, "rank2.bin": 3}
    assert sorted(os.listdir(d)) == ["step-000000000003"]  # the abandoned step 2 staging is gone
    # clear=True empties a staging directory an earlier (dead) writer of the same step left
    Path(ck.begin(d, 4), "junk").write_bytes(b"j")
    assert os.listdir(ck.begin(d, 4, clear=True)) == []


def test_resume_prefers_the_offered_checkpoint_while_it_is_complete(tmp_path, monkeypatch):
    d = str(tmp_path)
    monkeypatch.delenv(ck.ENV_RESUME, raising=False)
    monkeypatch.setenv(ck.ENV_DIR, d)
    assert ck.resume() is None
    ck.save(d, 1, write_state(b"1"))
    ck.save(d, 2, write_state(b"2"))
    assert ck.resume().step == 2
    monkeypatch.setenv(ck.ENV_RESUME, str(tmp_path / "step-000000000001"))
    assert ck.resume().step == 1
    (tmp_path / "step-000000000001" / "gpufleet-manifest.json").unlink()
    assert ck.resume().step == 2  # the offered one is no longer complete: the newest complete one
    monkeypatch.setenv(ck.ENV_RESUME, "/nonexistent/step-000000000009")
    assert ck.resume().step == 2


WRITER = r"""
import os, sys, time
sys.path.insert(0, %(collections)r)
from ansible_collections.kentino.gpufleet.plugins.module_utils import gpufleet_ckpt as ck
d = sys.argv[1]
ck.save(d, 1, lambda s: open(os.path.join(s, "state.bin"), "wb").write(b"ok" * 1000))
def slow(s):
    with open(os.path.join(s, "state.bin"), "wb") as fh:
        for i in range(1000):
            fh.write(b"z" * 4096)
            fh.flush()
            if i == 10:
                print("writing", flush=True)
            time.sleep(0.01)
ck.save(d, 2, slow)
print("done", flush=True)
"""


def test_writer_killed_mid_write_is_never_resumed_from(tmp_path, monkeypatch):
    script = tmp_path / "writer.py"
    script.write_text(WRITER % {"collections": str(REPO / "collections")})
    d = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, str(script), str(d)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    names = os.listdir(d)
    assert any(n.startswith(".partial-step-000000000002") for n in names), names
    monkeypatch.setenv(ck.ENV_DIR, str(d))
    monkeypatch.delenv(ck.ENV_RESUME, raising=False)
    got = ck.resume()
    assert got.step == 1 and json.loads((d / "step-000000000001" / "gpufleet-manifest.json").read_text())["step"] == 1
    # the next successful save of a later step clears the abandoned staging
    ck.save(str(d), 3, write_state(b"3"))
    assert not [n for n in os.listdir(d) if n.startswith(".partial")]
