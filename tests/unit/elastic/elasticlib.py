"""Helpers of the elastic training tests: the node layout the elastic_training role installs, launcher configs,
a stand-in torchrun for the fast tests, and process-tree helpers for the real torchrun tests."""

import json
import os
import shutil
import signal
import stat
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "elastic_training"
SIM_BIN = REPO / "sim" / "bin"
TORCH_PY = REPO / ".venv-torch" / "bin" / "python"
TORCHRUN = REPO / ".venv-torch" / "bin" / "torchrun"


def role_vars():
    return yaml.safe_load((ROLE / "vars" / "main.yml").read_text())


def install_tree(dest):
    """What the role installs: bin/ (launcher, worker wrapper), lib/ (only the listed module_utils, package
    __init__.py files) and python/ (the gpufleet_ckpt and gpufleet_metrics shims). Returns dest."""
    dest = Path(dest)
    v = role_vars()
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    for pkg in v["_elastic_training_packages"]:
        (dest / "lib" / pkg).mkdir(parents=True, exist_ok=True)
        (dest / "lib" / pkg / "__init__.py").write_text("")
    mu = dest / "lib" / v["_elastic_training_packages"][-1]
    for name in v["_elastic_training_module_utils"]:
        shutil.copy(REPO / "plugins" / "module_utils" / name, mu / name)
    for name in v["_elastic_training_scripts"]:
        shutil.copy(ROLE / "files" / name, dest / "bin" / name)
        (dest / "bin" / name).chmod(0o755)
    (dest / "python").mkdir(exist_ok=True)
    for name in v["_elastic_training_helpers"]:
        shutil.copy(ROLE / "files" / "python" / name, dest / "python" / name)
    return dest


def write_script(path, text):
    path = Path(path)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def config(tree, root, **over):
    """A launcher configuration for a node rooted at `root` (state, checkpoints and metrics below it)."""
    root = Path(root)
    cfg = {
        "job": "testjob", "host": "node-a", "torchrun": str(TORCHRUN), "entrypoint": str(root / "train.py"),
        "args": [], "worker": str(Path(tree) / "bin" / "gpufleet-elastic-worker"), "nproc_per_node": 1,
        "min_nodes": 1, "max_nodes": 1, "rdzv_endpoint": "127.0.0.1:29400", "max_restarts": 2,
        "monitor_interval_s": 0.2, "max_attempts": 2, "checkpoint_dir": str(root / "ckpt"),
        "metrics_dir": str(root / "metrics"), "state_dir": str(root / "state"), "stop_timeout_s": 20,
        "backoff": {"base_s": 0.2, "max_s": 1.0, "jitter": 0.5},
        "environment": {"PYTHONPATH": str(Path(tree) / "python") + os.pathsep + str(Path(tree) / "lib")},
        "gate": {"enabled": False},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = dict(cfg[key], **value)
        else:
            cfg[key] = value
    for d in ("ckpt", "metrics", "state"):
        (root / d).mkdir(parents=True, exist_ok=True)
    path = root / "elastic.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


# A torchrun stand-in for the launcher's own logic: runs the worker wrapper like torchrun does (same environment
# variables), restarts the group in place up to --max-restarts, or fails as an agent would.
FAKE_TORCHRUN = r'''#!%(python)s
import json, os, signal, subprocess, sys, time
args = sys.argv[1:]
opts = {}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
with open(os.environ["FAKE_DIR"] + "/torchrun-%%d.json" %% os.getpid(), "w") as fh:
    json.dump({"opts": opts, "rest": args, "env": {k: v for k, v in os.environ.items()
                                                   if k.startswith(("GPUFLEET", "TORCH_"))}}, fh)
mode = os.environ.get("FAKE_MODE", "workers")
if mode == "agent_fail":
    sys.stderr.write("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n")
    sys.exit(1)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
if mode == "hang":
    open(os.environ["FAKE_DIR"] + "/hanging", "w").close()
    while not stop:
        time.sleep(0.05)
    open(os.environ["FAKE_DIR"] + "/got-sigterm", "w").close()
    sys.exit(1)
max_restarts = int(opts["max-restarts"])
for restart in range(max_restarts + 1):
    # "membership": every restart is one for a membership change, which torchelastic does not count
    count = 0 if mode == "membership" else restart
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", TORCHELASTIC_RESTART_COUNT=str(count),
               TORCHELASTIC_MAX_RESTARTS=str(max_restarts), TORCHELASTIC_RUN_ID=opts["rdzv-id"])
    rc = subprocess.call([sys.executable, "-u"] + args, env=env)
    if rc == 0:
        sys.exit(0)
sys.exit(1)
'''

# An entrypoint that fails its first FAIL_TIMES starts (counted in a file), then succeeds; it prints torchelastic's
# restart count, the wrapper's, and what it was offered to resume from.
FLAKY_ENTRY = r'''import os, sys
count_file = os.environ["FAKE_DIR"] + "/starts"
n = int(open(count_file).read()) if os.path.exists(count_file) else 0
open(count_file, "w").write(str(n + 1))
with open(os.environ["FAKE_DIR"] + "/resume.log", "a") as fh:
    fh.write("%s %s %s\n" % (os.environ.get("TORCHELASTIC_RESTART_COUNT"), os.environ.get("GPUFLEET_RESTART_COUNT"),
                             os.environ.get("GPUFLEET_RESUME_FROM")))
sys.exit(1 if n < int(os.environ.get("FAIL_TIMES", "0")) else 0)
'''


def fake_torchrun(root):
    return write_script(Path(root) / "torchrun", FAKE_TORCHRUN % {"python": sys.executable})


def launcher_argv(tree, cfg_path, command="run"):
    return [sys.executable, str(Path(tree) / "bin" / "gpufleet-elastic"), command, "--config", str(cfg_path)]


def sim_env(scenario, state, scale="0.001"):
    env = dict(os.environ)
    env.update({"PATH": str(SIM_BIN) + os.pathsep + env.get("PATH", ""), "GPUFLEET_SIM_SCENARIO": scenario,
                "GPUFLEET_SIM_STATE": str(state), "GPUFLEET_SIM_TIME_SCALE": scale,
                "GPUFLEET_SIM_NODE": Path(state).name})
    return env


# ---- process trees (a "node" on this machine is a launcher, its torchrun agent and the agent's workers) ---------
def children(pid):
    out = []
    for task in Path("/proc/%d/task" % pid).glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def descendants(pid):
    found, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid):
    try:
        return Path("/proc/%d/cmdline" % pid).read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_tree(pid, sig=signal.SIGKILL):
    """SIGKILL a process and everything under it at once (torchrun starts its workers in their own sessions, so a
    process group kill would miss them): the node died."""
    victims = [pid] + descendants(pid)
    for p in victims:
        try:
            os.kill(p, signal.SIGSTOP)  # freeze first so nobody notices and reacts before all are gone
        except ProcessLookupError:
            pass
    for p in victims:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    return victims


def wait_for(predicate, timeout, what, interval=0.1, diagnose=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("%s not seen within %s s\n%s" % (what, timeout, diagnose()))
