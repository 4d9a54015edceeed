"""The elastic launcher from the tree the role installs, with a torchrun stand-in that starts the real worker
wrapper the way torchrun does: restarts in place with backoff, the checkpoint offered to a restarted worker, the
exit codes (finished, out of restarts, refused, stopped/drained), rejoining after an agent failure, signals."""

import json
import os
import signal
import subprocess
import time

import elasticlib
import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import elastic_launcher as el
from ansible_collections.kentino.gpufleet.plugins.module_utils import elastic_worker, gpufleet_ckpt
from ansible_collections.kentino.gpufleet.plugins.module_utils.elastic_worker import backoff_delay


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return elasticlib.install_tree(tmp_path_factory.mktemp("installed"))


@pytest.fixture
def node(tmp_path, tree):
    """node(**config overrides) -> (config path, run(command, env) -> CompletedProcess)."""
    torchrun = elasticlib.fake_torchrun(tmp_path)
    (tmp_path / "train.py").write_text(elasticlib.FLAKY_ENTRY)

    def make(**over):
        over.setdefault("torchrun", str(torchrun))
        path = elasticlib.config(tree, tmp_path, **over)

        def run(command="run", timeout=60, **env):
            full = dict(os.environ, FAKE_DIR=str(tmp_path), **env)
            return subprocess.run(elasticlib.launcher_argv(tree, path, command), capture_output=True, text=True,
                                  env=full, timeout=timeout)
        return path, run
    return make


def state(tmp_path):
    return json.loads((tmp_path / "state" / "launcher.json").read_text())


def torchrun_calls(tmp_path):
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("torchrun-*.json"), key=os.path.getmtime)]


def test_backoff_doubles_caps_and_jitters_down():
    class Fixed:
        def __init__(self, value):
            self.value = value

        def random(self):
            return self.value

    assert [backoff_delay(n, 10, 300, 0, Fixed(0.9)) for n in (0, 1, 2, 3, 6, 40)] == [0, 10, 20, 40, 300, 300]
    assert backoff_delay(2, 10, 300, 0.5, Fixed(1.0)) == 10.0  # at most `jitter` of the delay is taken off
    assert backoff_delay(2, 10, 300, 0.5, Fixed(0.0)) == 20.0
    assert backoff_delay(3, 0, 300, 0.5, Fixed(0.5)) == 0.0  # base 0: no backoff


def test_torchrun_command_line(tmp_path, tree):
    cfg = el.load_config(elasticlib.config(tree, tmp_path, min_nodes=1, max_nodes=4, nproc_per_node=8,
                                           rdzv_conf={"last_call_timeout": 5, "join_timeout": 900},
                                           local_addr="10.0.0.3", args=["--lr", "3e-4"]))
    assert el.torchrun_argv(cfg) == [
        str(elasticlib.TORCHRUN), "--nnodes=1:4", "--nproc-per-node=8", "--max-restarts=2", "--monitor-interval=0.2",
        "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", "--rdzv-id=testjob",
        "--rdzv-conf=join_timeout=900,last_call_timeout=5", "--local-addr=10.0.0.3",
        str(tree / "bin" / "gpufleet-elastic-worker"), str(tmp_path / "train.py"), "--lr", "3e-4"]


@pytest.mark.parametrize("over, words", [
    ({"min_nodes": 3, "max_nodes": 2}, "1 <= min <= max"),
    ({"rdzv_endpoint": "node01"}, "HOST:PORT"),
    ({"nproc_per_node": 0}, "nproc_per_node"),
    ({"job": "my job"}, "job 'my job'"),
    ({"backoff": {"jitter": 2}}, "jitter in [0, 1]"),
    ({"gate": {"checks": ["gpus", "smart"]}}, "unknown ['smart']"),
    ({"entrypoint": "train.py"}, "absolute path"),
])
def test_unusable_configuration_exits_2_naming_the_key(node, over, words):
    _path, run = node(**over)
    r = run()
    assert r.returncode == el.EXIT_CONFIG and words in r.stderr, r.stderr


def test_unreadable_configuration_exits_2(tmp_path, tree):
    r = subprocess.run(elasticlib.launcher_argv(tree, tmp_path / "nope.json"), capture_output=True, text=True)
    assert r.returncode == el.EXIT_CONFIG and "cannot read" in r.stderr


def test_restarts_back_off_resume_from_the_checkpoint_and_the_job_finishes(node, tmp_path):
    path, run = node(max_restarts=2)
    ckpt = gpufleet_ckpt.save(str(tmp_path / "ckpt"), 40, lambda d: open(d + "/s", "w").write("x"))
    (tmp_path / "ckpt" / ".partial-step-000000000050-1-aa").mkdir()  # a writer died mid-write: never offered
    started = time.monotonic()
    r = run(FAIL_TIMES="2")
    assert r.returncode == el.EXIT_FINISHED, r.stderr
    assert time.monotonic() - started >= 0.1 + 0.2  # restarts 1 and 2: >= half of 0.2 s and of 0.4 s
    resume = (tmp_path / "resume.log").read_text().split("\n")[:-1]
    assert resume == ["0 0 %s" % ckpt.path, "1 1 %s" % ckpt.path, "2 2 %s" % ckpt.path]
    assert "restart 1 of 2: waiting" in r.stderr and "restart 2 of 2: waiting" in r.stderr
    assert "not resuming from .partial-step-000000000050-1-aa" in r.stderr
    assert "the job finished" in r.stderr
    s = state(tmp_path)
    assert s["state"] == "finished" and s["exit_code"] == 0 and s["attempt"] == 1
    worker = json.loads((tmp_path / "state" / "workers" / "local0.json").read_text())
    assert worker["restart_count"] == 2 and 0.2 <= worker["backoff_s"] <= 0.4
    prom = (tmp_path / "metrics" / "gpufleet_elastic_testjob.prom").read_text()
    assert 'gpufleet_elastic_state{state="finished",training_job="testjob"} 1' in prom
    env = torchrun_calls(tmp_path)[0]["env"]
    assert env["GPUFLEET_CHECKPOINT_DIR"] == str(tmp_path / "ckpt") and env["GPUFLEET_JOB"] == "testjob"
    assert env["GPUFLEET_TRAINING_METRICS_DIR"] == str(tmp_path / "metrics")
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_restarts_for_a_membership_change_are_counted_too(node, tmp_path):
    """A peer's worker died: this node's agent restarts its (healthy) workers for the membership change and
    torchelastic's count stays 0. The wrapper counts the starts under the same agent: the entrypoint and the
    metrics see restart 1, 2 as on the node whose worker failed; no backoff here, the failure was elsewhere."""
    _path, run = node(max_restarts=2)
    r = run(FAIL_TIMES="2", FAKE_MODE="membership")
    assert r.returncode == el.EXIT_FINISHED, r.stderr
    resume = (tmp_path / "resume.log").read_text().split("\n")[:-1]
    assert resume == ["0 0 ", "0 1 ", "0 2 "]
    assert "restart 2 of the worker group: the group changed" in r.stderr and "waiting" not in r.stderr
    worker = json.loads((tmp_path / "state" / "workers" / "local0.json").read_text())
    assert worker["restart_count"] == 0 and worker["restarts"] == 2 and worker["backoff_s"] == 0
    # a new torchrun (the launcher's next attempt, a service restart) starts counting again
    r = run()
    assert (tmp_path / "resume.log").read_text().split("\n")[-2] == "0 0 "


def test_a_record_left_by_another_agent_is_not_counted(tmp_path):
    """The count continues only a record of the same torchrun agent (a crashed launcher may leave old ones)."""
    (tmp_path / "workers").mkdir()
    record = tmp_path / "workers" / "local0.json"
    env = {"LOCAL_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0", "GPUFLEET_ELASTIC_STATE_DIR": str(tmp_path)}
    record.write_text(json.dumps({"agent_pid": -1, "restarts": 5}))
    assert elastic_worker.prepare(dict(env))["restarts"] == 0
    record.write_text(json.dumps({"agent_pid": os.getppid(), "restarts": 5}))
    env_seen = dict(env)
    assert elastic_worker.prepare(env_seen)["restarts"] == 6 and env_seen["GPUFLEET_RESTART_COUNT"] == "6"
    record.write_text("{not json")
    assert elastic_worker.prepare(dict(env))["restarts"] == 0


def test_workers_out_of_restarts_exit_10(node, tmp_path):
    _path, run = node(max_restarts=1, max_attempts=3)
    r = run(FAIL_TIMES="99")
    assert r.returncode == el.EXIT_OUT_OF_RESTARTS, r.stderr
    assert "out of restarts: the workers failed after 1 of 1 restarts" in r.stderr
    assert len(torchrun_calls(tmp_path)) == 1  # no rejoin: more attempts would fail the same way
    assert state(tmp_path)["state"] == "out_of_restarts"


def test_agent_failure_rejoins_after_a_backoff_then_gives_up(node, tmp_path):
    _path, run = node(max_attempts=3, backoff={"base_s": 0.3, "jitter": 0})
    started = time.monotonic()
    r = run(FAKE_MODE="agent_fail")
    assert r.returncode == el.EXIT_OUT_OF_RESTARTS, r.stderr
    assert len(torchrun_calls(tmp_path)) == 3
    assert "rejoining in 0.3 s (attempt 2 of 3)" in r.stderr and "rejoining in 0.6 s (attempt 3 of 3)" in r.stderr
    assert time.monotonic() - started >= 0.9
    assert "out of attempts: torchrun failed 3 time(s)" in r.stderr


def test_gate_refusal_exits_11_and_never_starts_torchrun(node, tmp_path):
    sim = tmp_path / "sim-node"
    env = elasticlib.sim_env("riser_xid79", sim)
    subprocess.run(["gpu_burn", "100"], env=env, capture_output=True, timeout=120, check=True)
    _path, run = node(gate={"enabled": True, "checks": ["gpus", "xid"]})
    r = run(PATH=env["PATH"], **{k: v for k, v in env.items() if k.startswith("GPUFLEET_SIM")})
    assert r.returncode == el.EXIT_REFUSED, r.stderr
    assert "gate: FAIL GPU_LOST: node-a GPU 3 (0000:61:00) fell off the bus" in r.stderr
    assert "refused by the health gate (GPU_LOST): node-a stays out of the rendezvous" in r.stderr
    assert torchrun_calls(tmp_path) == []
    gate = json.loads((tmp_path / "state" / "gate.json").read_text())
    assert gate["verdict"] == "refuse" and state(tmp_path)["state"] == "refused"


def test_journal_priorities_when_stderr_is_the_journal(node, tmp_path):
    _path, run = node(gate={"enabled": True, "checks": ["storage"]}, checkpoint_dir=str(tmp_path / "absent"))
    r = run(JOURNAL_STREAM="8:1234")
    assert r.returncode == el.EXIT_REFUSED
    assert "<3>gpufleet-elastic[testjob]: gate: FAIL STORAGE_FAIL" in r.stderr


def start(tree, path, tmp_path, **env):
    return subprocess.Popen(elasticlib.launcher_argv(tree, path), stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, FAKE_DIR=str(tmp_path), **env))


def test_sigterm_stops_torchrun_once_and_exits_12(node, tmp_path, tree):
    path, _run = node()
    proc = start(tree, path, tmp_path, FAKE_MODE="hang")
    elasticlib.wait_for(lambda: (tmp_path / "hanging").exists(), 20, "the stand-in torchrun")
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == el.EXIT_STOPPED, err
    assert (tmp_path / "got-sigterm").exists()
    assert "stopped on request (signal 15)" in err and state(tmp_path)["state"] == "stopped"


def test_drain_waits_for_a_fresh_checkpoint_then_stops_and_keeps_the_node_out(node, tmp_path, tree):
    path, run = node(gate={"enabled": True, "checks": []})
    proc = start(tree, path, tmp_path, FAKE_MODE="hang")
    elasticlib.wait_for(lambda: (tmp_path / "hanging").exists(), 20, "the stand-in torchrun")
    r = subprocess.run(elasticlib.launcher_argv(tree, path, "drain") + ["--wait-checkpoint-s", "30", "--reason",
                                                                        "riser swap"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "drain requested" in r.stdout
    elasticlib.wait_for(lambda: state(tmp_path).get("draining"), 20, "the launcher seeing the drain")
    assert proc.poll() is None  # it saw the request and waits for the job's next checkpoint
    gpufleet_ckpt.save(str(tmp_path / "ckpt"), 7, lambda d: open(d + "/s", "w").write("x"))
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == el.EXIT_STOPPED and "stopping torchrun (drained)" in err, err
    assert "drain requested (riser swap): stopping torchrun after the job's next checkpoint (at most 30.0 s)" in err
    status = json.loads(run("status").stdout)
    assert status["drain"]["reason"] == "riser swap" and status["checkpoint"]["step"] == 7
    # a restart of the service does not rejoin while drained
    r = run()
    assert r.returncode == el.EXIT_STOPPED and "drained: not joining the job" in r.stderr
    assert len(torchrun_calls(tmp_path)) == 1
    assert "undrained" in run("undrain").stdout and "not drained" in run("undrain").stdout
    assert run(FAIL_TIMES="0").returncode == el.EXIT_FINISHED


def test_finished_job_empties_the_rank_metric_files(node, tmp_path):
    _path, run = node()
    rank_file = tmp_path / "metrics" / "gpufleet_training_testjob_local0.prom"
    rank_file.write_text("gpufleet_training_step 5\n")
    assert run().returncode == el.EXIT_FINISHED
    assert rank_file.read_text() == ""


def test_missing_torchrun_is_an_agent_failure_said_plainly(node, tmp_path):
    _path, run = node(torchrun=str(tmp_path / "no-torchrun"), max_attempts=1)
    r = run()
    assert r.returncode == el.EXIT_OUT_OF_RESTARTS and "cannot start %s" % (tmp_path / "no-torchrun") in r.stderr


def test_gate_command(node, tmp_path):
    _path, run = node(gate={"checks": ["storage"]})
    r = run("gate")
    assert r.returncode == 0 and json.loads(r.stdout)["verdict"] == "pass"
