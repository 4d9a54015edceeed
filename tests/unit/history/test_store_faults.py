"""The history never loses a run silently: garbage in the middle of the file is found when it is opened (quick_check)
or when a write fails (integrity_check), and nothing is written into it; a healthy history that cannot be written
(read-only mount, no permission) is named as such, never as damaged; a directory with `%` or `#` in its name is
the directory used."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import store
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.step import HistoryStep
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, HistoryError

sys.path.insert(0, str(Path(__file__).parent))
from helpers.history_files import PAGE, garbage_in_the_middle, healthy_history  # noqa: E402
from test_store import DAY, T0, node, run  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
DOC = {"run_id": "r-new", "playbook": "audit", "finished": "2027-01-15T02:30:00Z", "summary": {"verdict": "pass"}}


def test_garbage_in_the_middle_is_refused_at_open_and_never_written(tmp_path):
    path = healthy_history(tmp_path / store.FILE_NAME)
    damaged = garbage_in_the_middle(path)
    for readonly in (False, True):
        with pytest.raises(HistoryError, match=r"is damaged \(PRAGMA quick_check: ") as caught:
            History(path, readonly=readonly)
        assert caught.value.kind == "damaged"
        assert "restore it from a backup" in str(caught.value)
    assert path.read_bytes() == damaged


def test_a_write_that_meets_a_damaged_page_says_damaged_and_the_run_is_not_recorded(tmp_path):
    path = healthy_history(tmp_path / store.FILE_NAME)
    h = History(path)
    h.db.execute("PRAGMA cache_size = 1")  # read pages from the file again, where they are damaged below
    with open(path, "r+b") as fh:  # the file is damaged while it is open (a failing disk under a long run)
        for page in range(2, os.path.getsize(path) // PAGE):
            fh.seek(page * PAGE)
            fh.write(b"\xde\xad\xbe\xef" * (PAGE // 4))
    try:
        with pytest.raises(HistoryError, match=r"is damaged.*this run is not recorded") as caught:
            h.record(run("after", T0 + 40 * DAY), [node("n1", T0 + 40 * DAY)])
        assert caught.value.kind == "damaged"
    finally:
        h.close()


def test_the_history_step_writes_nothing_into_a_damaged_file(tmp_path):
    path = healthy_history(tmp_path / store.FILE_NAME)
    damaged = garbage_in_the_middle(path)
    step = HistoryStep(tmp_path)
    step.judge([], {}, "audit", now=T0 + 40 * DAY)
    assert "is damaged" in step.info["error"]
    info = step.record(DOC)
    assert info["recorded"] is False and "is damaged" in info["error"]
    assert path.read_bytes() == damaged


# ---- a healthy history that cannot be written --------------------------------------------------------------------
OPEN_AND_RECORD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, %(collections)r)
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.step import HistoryStep
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, HistoryError
    if len(sys.argv) > 2:
        os.setgid(65534)
        os.setuid(65534)  # nobody: root would write through the permissions
    step = HistoryStep(sys.argv[1])
    step.judge([], {}, "audit", now=2e9)
    print("judged: previous_runs=%%d" %% step.info["previous_runs"])
    print("error: %%s" %% step.info["error"])
    with History(step.path, readonly=True) as h:  # gpufleet history still reads it
        print("read: %%d run(s)" %% len(h.runs(100)))
""")


def _world_readable_dir():
    """A directory user nobody can reach (pytest's tmp_path is private to its user)."""
    work = Path(tempfile.mkdtemp(prefix="gpufleet-history-access."))
    work.chmod(0o755)
    return work


def _open_and_record(history_dir, as_nobody=False, wrap=()):
    script = history_dir.parent / "open_and_record.py"
    script.write_text(OPEN_AND_RECORD % {"collections": str(REPO / "collections")})
    script.chmod(0o644)
    argv = list(wrap) + [sys.executable, str(script), str(history_dir)] + (["nobody"] if as_nobody else [])
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_a_history_without_write_permission_is_named_a_permission_problem(tmp_path):
    work = _world_readable_dir()
    try:
        history_dir = work / "history"
        path = healthy_history(history_dir / store.FILE_NAME, days=3, hosts=1)
        before = path.read_bytes()
        for p in (path, history_dir):
            p.chmod(0o555 if p.is_dir() else 0o444)
        proc = _open_and_record(history_dir, as_nobody=os.getuid() == 0)
        assert proc.returncode == 0, proc.stderr
        assert "judged: previous_runs=3" in proc.stdout  # the trends are still judged from it
        error = proc.stdout.split("error: ", 1)[1]
        assert "no write permission" in error and "gpufleet_history_dir" in error, error
        assert "damaged" not in error and "backup" not in error and "move it away" not in error, error
        assert "read: 3 run(s)" in proc.stdout
        assert path.read_bytes() == before
    finally:
        for p in work.rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        shutil.rmtree(work)


def _can_mount_read_only():
    if not shutil.which("unshare") or not shutil.which("mount"):
        return False
    with tempfile.TemporaryDirectory() as probe_dir:
        probe = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0" && ! touch "$0/x"',
                                probe_dir], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs unshare and user namespaces to mount a directory read-only")
def test_a_history_on_a_read_only_mount_is_named_read_only(tmp_path):
    history_dir = tmp_path / "history"
    path = healthy_history(history_dir / store.FILE_NAME, days=3, hosts=1)
    before = path.read_bytes()
    proc = _open_and_record(history_dir, wrap=["unshare", "-rm", "sh", "-c",
                                               'mount --bind -o ro "$0" "$0" && exec "$@"', str(history_dir)])
    assert proc.returncode == 0, proc.stderr
    error = proc.stdout.split("error: ", 1)[1]
    assert "read-only file system" in error and "remount" in error and "gpufleet_history_dir" in error, error
    assert "damaged" not in error and "backup" not in error, error
    assert "judged: previous_runs=3" in proc.stdout and "read: 3 run(s)" in proc.stdout
    assert path.read_bytes() == before


def test_a_directory_that_cannot_be_created_is_named_with_the_fix(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    step = HistoryStep(blocker / "history")
    step.judge([], {}, "audit", now=T0)
    info = step.record(DOC)
    assert info["recorded"] is False and "cannot create" in info["error"] and "gpufleet_history_dir" in info["error"]


# ---- the file's name --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["pct%41dir", "frag#ment", "q?mode=ro", "sp ace"])
def test_a_history_directory_with_uri_characters_is_the_directory_used(tmp_path, name):
    path = tmp_path / name / store.FILE_NAME
    with History(path) as h:
        h.record(run("r0", T0), [node("n1", T0)])
    assert path.is_file() and path.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing written anywhere else
    with History(path, readonly=True) as h:
        assert [r["run_id"] for r in h.runs()] == ["r0"]


# ---- a whole history that cannot be read just now ------------------------------------------------------------------
OPEN_WITH_A_FILE_SIZE_LIMIT = textwrap.dedent("""
    import resource, sys
    sys.path.insert(0, %(collections)r)
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, HistoryError
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))  # ulimit -f 8: Python ignores SIGXFSZ, writes fail
    try:
        History(sys.argv[1], readonly=True).close()
        print("opened")
    except HistoryError as exc:
        print(exc.kind)
        print(exc)
""")


def test_an_io_error_is_not_called_damage(tmp_path):
    """SQLite's write of its shared-memory file fails under a file size limit ("disk I/O error"), and the integrity
    check it then runs fails the same way: the file is whole, so the operator is told to look at the disk, the mount
    and the limits, never to restore a backup or move the history away."""
    path = healthy_history(tmp_path / store.FILE_NAME, days=3, hosts=2, gpus=2)
    before = path.read_bytes()
    script = OPEN_WITH_A_FILE_SIZE_LIMIT % {"collections": str(REPO / "collections")}
    proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60)
    kind, _, message = proc.stdout.partition("\n")
    assert kind == "failed", proc.stdout + proc.stderr
    assert "disk I/O error" in message and "ulimit -f" in message, message
    assert "damaged" not in message and "restore it from a backup" not in message, message
    assert path.read_bytes() == before
    with History(path, readonly=True) as h:  # without the limit it reads
        assert len(h.runs(100)) == 3
