"""What the command writes: `history --export` writes a file whole or not at all, and a reader that has gone away
(`| head`) ends any command quietly, as a C tool killed by SIGPIPE does (exit 141): never a traceback, never rich's
exit 1 (WARN in this command's codes), never "no readable report"."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# This checkout's CLI package, not the one the shared venv's editable install points at.
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
for _name in [m for m in sys.modules if m == "gpufleet_cli" or m.startswith("gpufleet_cli.")]:
    del sys.modules[_name]
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import store  # noqa: E402
from helpers.history_files import healthy_history  # noqa: E402

from gpufleet_cli.main import main  # noqa: E402


def _history(tmp_path):
    (tmp_path / "history").mkdir()
    healthy_history(store.default_path(tmp_path / "history"), days=3, hosts=2, gpus=2)
    return ["--history-dir", str(tmp_path / "history")]


def test_an_export_is_written_whole_and_replaces_the_previous_one(tmp_path, capsys):
    out = tmp_path / "gpus.csv"
    out.write_text("the previous export\n")
    assert main(["history", "--export", "csv", "--out", str(out)] + _history(tmp_path)) == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("run_id,") and len(lines) == 1 + 3 * 2 * 2
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert "12 row(s) exported to %s" % out in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpus.csv", "history"]


def test_a_full_disk_keeps_the_previous_export_and_says_so(tmp_path, capsys, monkeypatch):
    out = tmp_path / "gpus.json"
    out.write_text("the previous export\n")
    real_export = store.History.export

    def export_until_full(self, fmt, stream, since=None, host=None):
        real_export(self, fmt, stream, since, host)
        stream.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store.History, "export", export_until_full)
    assert main(["history", "--export", "json", "--out", str(out)] + _history(tmp_path)) == 3
    err = capsys.readouterr().err
    assert "cannot write %s: No space left on device; nothing was written" % out in err, err
    assert "Traceback" not in err
    assert out.read_text() == "the previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpus.json", "history"], "no temp file left"


def test_a_device_is_written_in_place_and_its_error_named(tmp_path, capsys):
    assert main(["history", "--export", "json", "--out", "/dev/full"] + _history(tmp_path)) == 3
    err = capsys.readouterr().err
    assert "cannot write /dev/full: No space left on device; it may be cut short" in err, err
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")


def _to_a_closed_pipe(argv):
    """Run the command with its standard output a pipe whose reader has already gone: its first write fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "gpufleet_cli.main"] + argv, cwd=REPO, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
                              timeout=120)
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    return proc


def test_an_export_to_a_reader_that_went_away_ends_quietly(tmp_path):
    proc = _to_a_closed_pipe(["history", "--export", "csv"] + _history(tmp_path))
    assert proc.returncode == 141, proc.stderr


def test_a_report_to_a_reader_that_went_away_ends_quietly(tmp_path):
    run = tmp_path / "reports" / "r1"
    run.mkdir(parents=True)
    (run / "report.json").write_text(json.dumps({
        "run_id": "r1", "playbook": "audit", "nodes": [
            {"host": "n1", "verdict": "pass", "stage": "done", "worst": None, "action": "none"}],
        "summary": {"gate": {"fail_on": "fail", "failed": False, "nodes": []}}}))
    (run.parent / "latest").symlink_to("r1")
    proc = _to_a_closed_pipe(["report", "--report-dir", str(tmp_path / "reports")])
    assert proc.returncode == 141, proc.stderr
    assert "no readable report" not in proc.stderr


def test_history_tables_to_a_reader_that_went_away_end_quietly(tmp_path):
    args = _history(tmp_path)
    for argv in (["history"], ["history", "n0"], ["history", "n0", "--gpu", "0"]):
        proc = _to_a_closed_pipe(argv + args)
        assert proc.returncode == 141, (argv, proc.stderr)


def test_a_handover_sheet_that_cannot_be_written_is_named_not_a_traceback(tmp_path, capsys, monkeypatch):
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import handover

    def full_disk(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "sheets" / "handover.html"))

    monkeypatch.setattr(handover, "write", full_disk)
    assert main(["handover", "n0", "--out", str(tmp_path / "sheets")] + _history(tmp_path)) == 3
    err = capsys.readouterr().err
    assert "cannot write the sheet into %s: No space left on device" % (tmp_path / "sheets" / "handover.html") in err


def test_an_export_through_a_link_replaces_the_file_and_keeps_the_link(tmp_path):
    (tmp_path / "exports").mkdir()
    real = tmp_path / "exports" / "fleet.csv"
    real.write_text("the previous export\n")
    link = tmp_path / "fleet.csv"
    link.symlink_to(real)
    assert main(["history", "--export", "csv", "--out", str(link)] + _history(tmp_path)) == 0
    assert link.is_symlink() and real.read_text().startswith("run_id,")
