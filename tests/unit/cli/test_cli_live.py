"""The gpufleet command's live view and exit codes: rendered with rich's recorder from ansible-runner events, and in a
real terminal (a pty) around a real burn-in of one simulated node; history and the report by run id."""

import json
import os
import sys
import time
from pathlib import Path

import pexpect
import pytest
from rich.console import Console

REPO = Path(__file__).resolve().parents[3]
# This checkout's CLI package, not the one the shared venv's editable install points at.
sys.path.insert(0, str(REPO))
for _name in [m for m in sys.modules if m == "gpufleet_cli" or m.startswith("gpufleet_cli.")]:
    del sys.modules[_name]
from gpufleet_cli import commands  # noqa: E402
from gpufleet_cli.live import RunView  # noqa: E402


def ev(kind, host=None, task="", res=None, **data):
    """An ansible-runner event of the shape its event_handler receives."""
    event_data = dict(data, task=task)
    if host is not None:
        event_data["host"] = host
    if res is not None:
        event_data["res"] = res
    return {"event": kind, "uuid": "x", "counter": 1, "stdout": "", "event_data": event_data}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_live_view_shows_each_node_its_stage_verdict_so_far_and_the_burn(tmp_path):
    clock = Clock()
    view = RunView("burn_in", burn_planned_s=600, clock=clock)
    view.handle(ev("runner_on_ok", "localhost", "Refuse typos", {"run_id": "20261201T000000Z-abcdef"}))
    # A stage's first task runs once for the play (on its first node) and gives every node its stage.
    nodes = ("node01", "node02", "node03")
    view.handle(ev("runner_on_start", "node01", "Stage | Enter facts"))
    view.handle(ev("runner_on_ok", "node01", "Stage | Enter facts",
                   {"ansible_facts": {"gpufleet_stages": dict.fromkeys(nodes, "facts")}}))
    view.handle(ev("runner_on_ok", "node01", "Stage | Enter burn",
                   {"ansible_facts": {"gpufleet_stages": dict(dict.fromkeys(nodes, "facts"), node01="burn")}}))
    view.handle(ev("runner_on_ok", "node02", "Facts", {"verdict": "warn"}))
    view.handle(ev("runner_on_unreachable", "node03", "Facts", {"unreachable": True, "msg": "Connection refused"}))
    clock.now += 150  # a quarter of the planned burn
    console = Console(record=True, width=120, force_terminal=False, color_system=None)
    console.print(view)
    text = console.export_text()
    assert "gpufleet burn_in · run 20261201T000000Z-abcdef · 3 node(s)" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("node0")}
    assert "running" in lines["node01"] and " burn " in lines["node01"] and "2:30 / 10:00" in lines["node01"]
    assert "━" in lines["node01"], "a progress bar while the node burns"
    assert "WARN" in lines["node02"] and "facts" in lines["node02"]
    assert "unreachable" in lines["node03"] and "UNREACHABLE" in lines["node03"]
    assert "fleet: 2 running · 1 unreachable" in text and "so far: 1 warn · 1 unreachable" in text
    view.handle(ev("playbook_on_stats"))
    console = Console(record=True, width=120, color_system=None)
    console.print(view)
    assert "fleet: 2 done · 1 unreachable" in console.export_text()


@pytest.mark.parametrize("width,names", [
    (80, ["sim-node%02d" % i for i in range(1, 10)]),
    (60, ["sim-node%02d" % i for i in range(1, 10)]),
    (80, ["gpu-node-rack12-u07.dc1", "gpu-node-rack12-u09.dc1"]),
])
def test_node_names_are_never_cut_other_columns_give_way(width, names):
    clock = Clock()
    view = RunView("burn_in", clock=clock)  # no planned burn given: the default's 10 minutes
    view.handle(ev("runner_on_start", names[0], "Stage | Enter burn"))
    view.handle(ev("runner_on_ok", names[0], "Stage | Enter burn",
                   {"ansible_facts": {"gpufleet_stages": dict.fromkeys(names, "burn")}}))
    for host in names:
        view.handle(ev("runner_on_ok", host, "Facts", {"verdict": "warn"}))
    clock.now += 150
    console = Console(record=True, width=width, force_terminal=False, color_system=None)
    console.print(view)
    lines = console.export_text().splitlines()
    for host in names:
        row = [line for line in lines if line.startswith(host + " ")]
        assert len(row) == 1, "%s cut or missing at %d columns:\n%s" % (host, width, "\n".join(lines))
        assert "WARN" in row[0], row[0]
        if width >= 80:
            assert "2:30 / 10:00" in row[0] and "running" in row[0], row[0]
    assert max(len(line.rstrip()) for line in lines) <= width
    body = [line for line in lines if "│" in line]  # the rows' column separator
    assert len(body) == len(names), "one line per node, nothing wrapped:\n" + "\n".join(lines)


def test_exit_codes():
    nodes = lambda *v: {"nodes": [{"verdict": x} for x in v]}  # noqa: E731
    assert commands.exit_code(nodes("pass", "pass")) == 0
    assert commands.exit_code(nodes("pass", "warn")) == 0
    assert commands.exit_code(nodes("pass", "warn"), fail_on_warn=True) == 1
    assert commands.exit_code(nodes("warn", "error")) == 2 and commands.exit_code(nodes("unreachable")) == 2
    assert commands.exit_code({"nodes": []}) == 3
    # A run the history did not record is not a plain pass; a failing node still says 2 first.
    not_recorded = {"error": "this run is NOT recorded: history h: is damaged"}
    assert commands.exit_code(dict(nodes("pass", "warn"), history=not_recorded), fail_on_warn=True) == 4
    assert commands.exit_code(dict(nodes("pass"), history=not_recorded)) == 4
    assert commands.exit_code(dict(nodes("pass", "fail"), history=not_recorded)) == 2
    assert commands.exit_code(dict(nodes("pass"), history={"error": None})) == 0
    assert commands.with_localhost("n1,n2") == "n1,n2,localhost" and commands.with_localhost("n1,localhost") == \
        "n1,localhost" and commands.with_localhost(None) is None
    assert commands.sparkline([0, 5, 10, None, 10]) == "▁▄█ █"


def _gpufleet(*args):
    # The checkout's own CLI (the console script of the shared venv may point at another checkout).
    return [sys.executable, "-m", "gpufleet_cli.main"] + list(args)


@pytest.mark.slow
def test_the_live_view_in_a_real_terminal_during_a_burn_in(tmp_path):
    env = dict(os.environ, GPUFLEET_SIM_STATE_ROOT=str(tmp_path / "state"), GPUFLEET_SIM_TIME_SCALE="1",
               TERM="xterm-256color", COLUMNS="140", LINES="40", PYTHONPATH=str(REPO))
    argv = _gpufleet("burn-in", "-i", "inventories/sim", "-l", "sim-node01", "--report-dir", str(tmp_path / "reports"),
                     "-e", "gpufleet_burn_duration_s=12", "-e", "gpufleet_dcgm_enabled=false",
                     "-e", "gpufleet_nccl_enabled=false", "-e", "gpufleet_checkpoint_path=")
    child = pexpect.spawn(argv[0], argv[1:], cwd=str(REPO), env=env, encoding="utf-8", timeout=600,
                          dimensions=(40, 140))
    child.expect("gpufleet burn_in")
    child.expect("sim-node01")
    # The node's line while it burns: its stage, and a bar with the time burnt of the 12 s planned.
    child.expect(r"sim-node01 \S* \S*running\S* \S* burn ")
    child.expect(r"[╸╺]")  # the bar's moving edge: only a progress bar draws it
    child.expect(r"\d:\d\d / 0:12")
    child.expect("Fleet report")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before[-3000:]
    report = json.loads((tmp_path / "reports" / "latest" / "report.json").read_text())
    assert [n["verdict"] for n in report["nodes"]] == ["pass"]


def test_report_by_run_id_and_its_exit_code(tmp_path):
    import subprocess

    run_dir = tmp_path / "reports" / "20261201T000000Z-abcdef"
    run_dir.mkdir(parents=True)
    doc = {"run_id": "20261201T000000Z-abcdef", "playbook": "audit", "nodes": [
        {"host": "n1", "verdict": "fail", "stage": "done", "worst": {"code": "XID92_ACCELERATING", "message": "m"},
         "action": "a"}], "summary": {"gate": {"fail_on": "fail", "failed": True, "nodes": ["n1"]}}}
    (run_dir / "report.json").write_text(json.dumps(doc))
    shown = subprocess.run(_gpufleet("report", "20261201T000000Z-abcdef", "--report-dir", str(tmp_path / "reports")),
                           cwd=REPO, capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="200"))
    assert shown.returncode == 2 and "XID92_ACCELERATING" in shown.stdout, shown.stdout + shown.stderr
    missing = subprocess.run(_gpufleet("report", "no-such-run", "--report-dir", str(tmp_path / "reports")), cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 3 and "no readable report" in missing.stderr


def test_history_of_a_missing_store_could_not_run(tmp_path):
    import subprocess

    started = time.time()
    proc = subprocess.run(_gpufleet("history", "n1", "--report-dir", str(tmp_path)), cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3 and "does not exist yet" in proc.stderr
    assert time.time() - started < 60


def test_history_of_a_damaged_file_says_damaged_instead_of_reading_it(tmp_path):
    import subprocess

    sys.path.insert(0, str(REPO / "collections"))
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import FILE_NAME
    from helpers.history_files import garbage_in_the_middle, healthy_history

    path = healthy_history(tmp_path / "history" / FILE_NAME)
    damaged = garbage_in_the_middle(path)
    for argv in (["history"], ["history", "n1"], ["history", "--export", "csv"]):
        proc = subprocess.run(_gpufleet(*argv, "--report-dir", str(tmp_path)), cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 3 and "is damaged (PRAGMA quick_check" in proc.stderr, (argv, proc.stderr)
        assert "restore it from a backup" in proc.stderr and proc.stdout == ""
    assert path.read_bytes() == damaged


def test_the_report_shows_a_run_the_history_did_not_record(tmp_path):
    from gpufleet_cli.main import show_report

    doc = {"run_id": "20261201T000000Z-abcdef", "playbook": "audit", "nodes": [
        {"host": "n1", "verdict": "pass", "stage": "done", "worst": None, "action": None}],
        "summary": {"gate": {"fail_on": "fail", "failed": False, "nodes": []}},
        "history": {"enabled": True, "path": "h", "error": "this run is NOT recorded: history h: is damaged"}}
    (tmp_path / "report.json").write_text(json.dumps(doc))
    console = Console(record=True, width=200, color_system=None)
    show_report(tmp_path, console)
    assert "History: this run is NOT recorded: history h: is damaged" in console.export_text()
    assert commands.exit_code(doc) == 4


def test_history_of_a_gpu_the_fleet_and_an_export(tmp_path):
    import subprocess

    sys.path.insert(0, str(REPO / "collections"))
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import FILE_NAME, History

    with History(tmp_path / "history" / FILE_NAME) as history:
        for day in range(6):
            ts = 1.8e9 + day * 86400.0
            history.record({"run_id": "r%d" % day, "playbook": "audit", "ts": ts, "verdict": "pass"}, [{
                "host": "n1", "ts": ts, "verdict": "warn" if day > 3 else "pass", "reachable": 1, "driver": "570.1",
                "gpus": [{"pci": "0000:18:00", "idx": 0, "uuid": "GPU-a", "ts": ts, "verdict": "pass",
                          "ecc_corr_agg": 10 * day * day, "temperature_c": 40 + day, "pcie_replays": 0}],
                "xids": [], "baselines": [], "doc": None}])
    base = ["--report-dir", str(tmp_path)]
    env = dict(os.environ, COLUMNS="200")
    gpu = subprocess.run(_gpufleet("history", "n1", "--gpu", "0", *base), cwd=REPO, capture_output=True, text=True,
                         timeout=120, env=env)
    assert gpu.returncode == 0, gpu.stderr
    assert "n1 GPU 0  0000:18:00  GPU-a  (6 readings)" in gpu.stdout
    assert "corrected ECC/day  ▁▂▄▆█" in gpu.stdout  # a gap, then 10, 30, 50, 70, 90 per day
    node = subprocess.run(_gpufleet("history", "n1", *base), cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=env)
    assert node.returncode == 0 and "r5" in node.stdout and "verdicts ▁▁▁▁██" in node.stdout, node.stdout
    fleet = subprocess.run(_gpufleet("history", *base), cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert fleet.returncode == 0 and "n1" in fleet.stdout
    out = tmp_path / "n1.json"
    export = subprocess.run(_gpufleet("history", "n1", "--export", "json", "--out", str(out), *base), cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert export.returncode == 0 and "6 row(s) exported" in export.stderr
    assert [json.loads(line)["ecc_corr_agg"] for line in out.read_text().splitlines()] == [0, 10, 40, 90, 160, 250]
