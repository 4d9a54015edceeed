"""gpufleet postmortem: the job_postmortem playbook through ansible-runner on the sim fleet, then the verdict."""

import os
import subprocess
import sys
import time

from helpers.playbook_runner import REPO


def test_postmortem_command_runs_the_playbook_and_shows_the_verdict(tmp_path):
    inv = tmp_path / "inv"
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(inv), "--nodes", "4",
                    "--scenario", "healthy_rtx5090", "--prefix", "node"], check=True)
    at = time.time() - 30
    for n in range(1, 5):
        env = dict(os.environ, GPUFLEET_SIM_SCENARIO="healthy_rtx5090", GPUFLEET_SIM_NODE="node%02d" % n,
                   GPUFLEET_SIM_STATE=str(tmp_path / "state" / ("node%02d" % n)))
        subprocess.run([str(REPO / "sim" / "bin" / "gpufleet-sim"), "job", "mismatch_rank3", "--at", str(at)],
                       env=env, check=True, capture_output=True)
    env = dict(os.environ, GPUFLEET_SIM_STATE_ROOT=str(tmp_path / "state"), COLUMNS="240")
    env["PATH"] = os.pathsep.join([str(REPO / ".venv" / "bin"), env.get("PATH", "")])
    cli = [sys.executable, "-m", "gpufleet_cli.main", "postmortem"]
    proc = subprocess.run(cli + ["-i", str(inv), "-l", "node01,node02,node03,node04",
                                 "--logs", "{{ gpufleet_sim_state_dir }}/job/*.log",
                                 "--dump-prefix", "{{ gpufleet_sim_state_dir }}/job/dumps/nccl_trace_rank_",
                                 "--job-user", str(os.getuid()), "--report-dir", str(tmp_path / "reports"), "-q"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SOFTWARE (confidence high)" in proc.stdout
    assert "mismatched collective in your code at evaluate at /srv/train/trainer.py:212" in proc.stdout
    assert (tmp_path / "reports" / "postmortem" / "latest" / "postmortem.html").exists()
    assert (tmp_path / "reports" / ".runner").is_dir()  # ansible-runner's record of the run
    shown = subprocess.run(cli + ["--report-dir", str(tmp_path / "reports"), "--show"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "JOB_HANG_SOFTWARE" in shown.stdout


def test_show_of_a_missing_postmortem_fails_clearly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gpufleet_cli.main", "postmortem", "--show", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no readable post-mortem at %s/postmortem.json" % tmp_path in proc.stderr
    assert "Traceback" not in proc.stderr
