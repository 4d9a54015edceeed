"""The elastic launcher with the real torchrun of .venv-torch (CPU torch, gloo): two agents on this machine meet in
a c10d rendezvous as two nodes would, each with its own launcher, checkpoint directory and metrics directory, and
train tests/fixtures/elastic/toy_train.py (deterministic: a resumed run repeats the losses of the run it replaces).

- a worker killed: the group restarts after the backoff, resumes from the last complete checkpoint, and the step and
  loss series in the metrics continue where they were;
- a whole node (launcher, agent, workers) killed with --nnodes 1:2: the other node continues alone to the end;
- a checkpoint writer killed mid-write: the half-written checkpoint is never resumed from;
- a node whose health gate fails (the simulator's nvidia-smi with a lost GPU) does not join, and says why.
"""

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import elasticlib
import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import elastic_launcher as el
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [
    pytest.mark.slow, pytest.mark.timeout(600),
    pytest.mark.skipif(not elasticlib.TORCHRUN.exists(), reason=".venv-torch absent: make torch-venv"),
]
TOY = elasticlib.REPO / "tests" / "fixtures" / "elastic" / "toy_train.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One simulated node: its own launcher (process group), directories and logs."""

    def __init__(self, tree, root, name, port, scenario="healthy_rtx5090", **over):
        self.root = Path(root) / name
        self.root.mkdir(parents=True)
        self.name = name
        over.setdefault("args", [])
        over["args"] = ["--metrics-interval", "0"] + over["args"]
        over.setdefault("rdzv_conf", {"last_call_timeout": 5, "join_timeout": 120})
        self.cfg_path = elasticlib.config(
            tree, self.root, job="toy", host=name, entrypoint=str(TOY), rdzv_endpoint="127.0.0.1:%d" % port,
            monitor_interval_s=0.5, backoff={"base_s": 1.0, "max_s": 4.0, "jitter": 0.5}, **over)
        self.env = elasticlib.sim_env(scenario, self.root / "sim")
        self.env.update({"TOY_LOG": str(self.root / "steps.jsonl"), "OMP_NUM_THREADS": "1"})
        self.samples = []
        self.proc = None

    def start(self, tree):
        self.out = open(self.root / "launcher.log", "w")
        self.proc = subprocess.Popen(elasticlib.launcher_argv(tree, self.cfg_path), stdout=self.out,
                                     stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self._scraping = True
        threading.Thread(target=self._scrape, daemon=True).start()
        return self

    def _scrape(self):
        """What Prometheus would see: the rank file every 20 ms (distinct samples only)."""
        path = self.root / "metrics" / "gpufleet_training_toy_local0.prom"
        last = None
        while self._scraping:
            try:
                text = path.read_text()
            except OSError:
                text = ""
            if text and text != last:
                last = text
                sample = {}
                for fam in text_string_to_metric_families(text):
                    for s in fam.samples:
                        sample[s.name] = s.value
                self.samples.append(sample)
            time.sleep(0.02)

    def log(self):
        return (self.root / "launcher.log").read_text()

    def steps(self):
        try:
            return [json.loads(line) for line in (self.root / "steps.jsonl").read_text().splitlines()]
        except OSError:
            return []

    def workers(self):
        """Worker processes: the wrapper exec'ed `python -u toy_train.py ...` (torchrun's own command line names the
        script too, after the wrapper)."""
        return [p for p in elasticlib.descendants(self.proc.pid) if elasticlib.cmdline(p).split()[1:3] == ["-u", str(TOY)]]

    def wait(self, timeout=300):
        try:
            rc = self.proc.wait(timeout)
        finally:
            self._scraping = False
        return rc

    def stop(self):
        self._scraping = False
        if self.proc and self.proc.poll() is None:
            elasticlib.kill_tree(self.proc.pid)
            self.proc.wait(30)


@pytest.fixture
def cluster(tmp_path_factory):
    tree = elasticlib.install_tree(tmp_path_factory.mktemp("installed"))
    root = tmp_path_factory.mktemp("cluster")
    port = free_port()
    nodes = []

    def make(name, **over):
        node = Node(tree, root, name, port, **over)
        nodes.append(node)
        return node

    make.tree = tree
    yield make
    for node in nodes:
        node.stop()


def diagnose(*nodes):
    return "\n".join("---- %s\n%s" % (n.name, n.log()[-6000:]) for n in nodes)


def test_killed_worker_restarts_after_backoff_and_resumes_from_the_last_checkpoint(cluster):
    """node-a's worker holds when its collective fails (as a rank hung in NCCL would): its agent can only see the
    peer rejoining, and restarts its workers for the membership change, which torchelastic does not count
    (TORCHELASTIC_RESTART_COUNT stays 0 there). Without the hold, which of the two restarts node-a makes is a race
    between the agents' monitor ticks and the worker's exit; the wrapper's count is 1 either way."""
    a = cluster("node-a", min_nodes=2, max_nodes=2, args=["--steps", "45", "--ckpt-every", "8", "--hold-on-error"],
                gate={"enabled": True, "checks": ["gpus", "xid", "busy", "storage"]})
    b = cluster("node-b", min_nodes=2, max_nodes=2, args=["--steps", "45", "--ckpt-every", "8"])
    a.start(cluster.tree), b.start(cluster.tree)
    elasticlib.wait_for(lambda: len([s for s in a.steps() if s["step"] >= 13]), 180, "step 13", diagnose=lambda:
                        diagnose(a, b))
    victim = b.workers()
    assert len(victim) == 1, diagnose(a, b)
    killed_at = time.time()
    os.kill(victim[0], signal.SIGKILL)
    assert a.wait() == el.EXIT_FINISHED and b.wait() == el.EXIT_FINISHED, diagnose(a, b)

    steps = a.steps()
    before = {s["step"]: s["loss"] for s in steps if s["restart"] == 0}
    after = [s for s in steps if s["restart"] == 1]
    last_before = max(before)
    resumed = int(Path(after[0]["resumed_from"]).name.split("-")[1])
    assert resumed % 8 == 0 and resumed <= last_before and after[0]["step"] == resumed + 1
    steps_lost = last_before - resumed
    assert 0 <= steps_lost <= 8, (last_before, resumed)
    assert after[-1]["step"] == 45 and all(s["world"] == 2 for s in steps)
    for s in after:  # the same model state and batch: the same loss
        if s["step"] in before:
            assert s["loss"] == pytest.approx(before[s["step"]], rel=1e-6, abs=1e-9), s
    # the backoff: the first step after the resume comes at least half a base delay (jitter 0.5) after the kill
    assert after[0]["t"] - killed_at >= 0.5
    assert "restart 1 of 2: waiting" in b.log() and "resuming from %s" % after[0]["resumed_from"].replace(
        "node-a", "node-b") in b.log()
    assert "holding until the agent stops this worker" in a.log(), diagnose(a)
    assert "restart 1 of the worker group: the group changed" in a.log(), diagnose(a)

    # the metrics tell the same story: restart_count 0 up to the kill, then 1 from the resumed step on, the loss of
    # a step the same before and after
    m_before = {s["gpufleet_training_step"]: s["gpufleet_training_loss"] for s in a.samples
                if s.get("gpufleet_training_restart_count") == 0}
    m_after = [s for s in a.samples if s.get("gpufleet_training_restart_count") == 1]
    assert m_after and min(s["gpufleet_training_step"] for s in m_after) <= resumed + 2
    assert max(s["gpufleet_training_step"] for s in m_after) == 45
    common = [s for s in m_after if s["gpufleet_training_step"] in m_before]
    assert common, "no step sampled both before and after the restart"
    for s in common:
        assert s["gpufleet_training_loss"] == pytest.approx(m_before[s["gpufleet_training_step"]], rel=1e-6)
    assert a.samples[-1]["gpufleet_training_world_size"] == 2


def listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("store_on_victim", [False, True], ids=["peer-killed", "store-host-killed"])
def test_killed_node_leaves_the_other_to_continue_alone(cluster, store_on_victim):
    """The c10d store lives in one agent. A killed peer: the survivor's torchrun restarts its workers in a smaller
    group. A killed store host: the survivor's torchrun loses the rendezvous and the launcher rejoins (attempt 2),
    hosting the store itself."""
    args = ["--steps", "40", "--ckpt-every", "5"]
    b_conf = {} if store_on_victim else {"is_host": "false"}
    a = cluster("node-a", min_nodes=1, max_nodes=2, args=args)
    b = cluster("node-b", min_nodes=1, max_nodes=2, args=args,
                rdzv_conf=dict({"last_call_timeout": 5, "join_timeout": 120}, **b_conf))
    port = int(json.loads(a.cfg_path.read_text())["rdzv_endpoint"].rsplit(":", 1)[1])
    if store_on_victim:
        b.start(cluster.tree)
        elasticlib.wait_for(lambda: listening(port), 60, "node-b hosting the store", diagnose=lambda: diagnose(b))
        a.start(cluster.tree)
    else:
        a.start(cluster.tree), b.start(cluster.tree)
    elasticlib.wait_for(lambda: [s for s in a.steps() if s["world"] == 2 and s["step"] >= 8], 180,
                        "both nodes training", diagnose=lambda: diagnose(a, b))
    victims = elasticlib.kill_tree(b.proc.pid)
    assert len(victims) >= 3  # launcher, torchrun agent, worker
    assert a.wait() == el.EXIT_FINISHED, diagnose(a, b)
    steps = a.steps()
    alone = [s for s in steps if s["world"] == 1]
    assert alone and alone[-1]["step"] == 40, diagnose(a, b)
    resumed = int(Path(alone[0]["resumed_from"]).name.split("-")[1])
    assert alone[0]["step"] == resumed + 1
    assert max(s["step"] for s in steps if s["world"] == 2) - resumed <= 5
    if store_on_victim:
        assert alone[0]["restart"] == 0 and "rejoining in" in a.log() and "attempt 2:" in a.log()
    else:
        assert alone[0]["restart"] == 1 and "attempt 2:" not in a.log()


def test_checkpoint_writer_killed_mid_write_is_never_resumed_from(cluster):
    a = cluster("node-a", args=["--steps", "26", "--ckpt-every", "6", "--slow-ckpt-s", "2"])
    a.start(cluster.tree)
    ckpt = a.root / "ckpt"
    partial = elasticlib.wait_for(lambda: [p for p in ckpt.glob(".partial-step-000000000012*")], 240,
                                  "the step 12 checkpoint being written", diagnose=lambda: diagnose(a))
    assert (ckpt / "step-000000000006").is_dir()
    os.kill(a.workers()[0], signal.SIGKILL)
    assert a.wait() == el.EXIT_FINISHED, diagnose(a)
    after = [s for s in a.steps() if s["restart"] == 1]
    assert after[0]["resumed_from"].endswith("step-000000000006") and after[0]["step"] == 7
    assert "not resuming from %s: being written or abandoned" % partial[0].name in a.log()
    assert not list(ckpt.glob(".partial-*"))  # the next complete checkpoint cleared it
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-000000000012", "step-000000000018",
                                                           "step-000000000024"]


def test_node_failing_its_gate_stays_out_and_says_why(cluster):
    a = cluster("node-a", min_nodes=1, max_nodes=2, args=["--steps", "12"], gate={"enabled": True})
    b = cluster("node-b", min_nodes=1, max_nodes=2, args=["--steps", "12"], gate={"enabled": True},
                scenario="riser_xid79")
    subprocess.run(["gpu_burn", "100"], env=b.env, capture_output=True, timeout=120, check=True)  # GPU 3 falls off
    a.start(cluster.tree), b.start(cluster.tree)
    assert b.wait(120) == el.EXIT_REFUSED, diagnose(b)
    assert "gate: FAIL GPU_LOST: node-b GPU 3 (0000:61:00) fell off the bus" in b.log()
    assert "refused by the health gate (GPU_LOST): node-b stays out of the rendezvous" in b.log()
    assert a.wait() == el.EXIT_FINISHED, diagnose(a)
    assert {s["world"] for s in a.steps()} == {1} and a.steps()[-1]["step"] == 12
    assert b.steps() == [] and not list((b.root / "state" / "workers").glob("*.json"))
