# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The worker wrapper torchrun starts for every local rank of an elastic job (stdlib only, Python >= 3.8: it runs
under the training environment's Python, before the training script).

torchrun restarts a failed worker group at once, as often as --max-restarts allows: a fault that needs a moment to
clear (a flapping link, a storage hiccup, a peer node rebooting) would burn the whole budget in seconds. So on a
restart (TORCHELASTIC_RESTART_COUNT > 0) this wrapper first waits an exponential backoff with jitter, then names
the newest COMPLETE checkpoint in GPUFLEET_RESUME_FROM (gpufleet_ckpt's contract: a half-written one is never
offered), records the start for the launcher, and execs the training entrypoint in its own place (same PID, so
torchrun's signals and exit codes reach the script unchanged).

TORCHELASTIC_RESTART_COUNT counts only the restarts that followed a failure of THIS node's workers. When a peer's
worker dies, this node's agent often restarts its own workers for the membership change instead (its workers were
still alive at its monitor tick: hung in a collective, or still unwinding the peer's error), and that restart keeps
the count at 0. Which of the two happens is a race between the nodes' monitor ticks and a worker's exit. So the
wrapper counts every start of its local rank under the same agent and hands the entrypoint GPUFLEET_RESTART_COUNT:
the restarts of this node's worker group, whatever their reason, the same on every node that restarted.

Environment (set by the launcher): GPUFLEET_BACKOFF_BASE_S, GPUFLEET_BACKOFF_MAX_S, GPUFLEET_BACKOFF_JITTER,
GPUFLEET_ELASTIC_STATE_DIR, GPUFLEET_CHECKPOINT_DIR, GPUFLEET_ENTRYPOINT_PYTHON ("0": exec the entrypoint as a
program, not with this Python). Set for the entrypoint: GPUFLEET_RESUME_FROM, GPUFLEET_RESTART_COUNT.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import random
import socket
import sys
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils import gpufleet_ckpt


def backoff_delay(attempt, base_s, max_s, jitter, rng=random):
    """Seconds to wait before restart number `attempt` (1 = the first restart): base_s x 2^(attempt - 1), capped at
    max_s, then shortened by a random share of up to `jitter` (0..1), so that nodes restarting together do not all
    come back at the same instant."""
    if attempt < 1 or base_s <= 0:
        return 0.0
    delay = min(float(max_s), float(base_s) * 2 ** min(attempt - 1, 30))
    return delay * (1.0 - min(max(float(jitter), 0.0), 1.0) * rng.random())


def _float_env(name, default):
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return default


def _log(message):
    sys.stderr.write("gpufleet-elastic-worker[rank %s]: %s\n" % (os.environ.get("RANK", "?"), message))
    sys.stderr.flush()


ENV_RESTARTS = "GPUFLEET_RESTART_COUNT"


def _record_path(state_dir, local_rank):
    return os.path.join(state_dir, "workers", "local%s.json" % local_rank)


def previous_restarts(state_dir, local_rank, agent_pid):
    """The restart count of this local rank's previous start under the same torchrun agent (the launcher clears the
    records before each torchrun), or None when this is the agent's first start of it."""
    if not state_dir:
        return None
    try:
        with open(_record_path(state_dir, local_rank)) as fh:
            prev = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(prev, dict) or prev.get("agent_pid") != agent_pid or not isinstance(prev.get("restarts"), int):
        return None
    return prev["restarts"]


def record(state_dir, entry):
    """workers/local<N>.json: what the launcher reads to tell 'out of restarts' from an agent failure."""
    if not state_dir:
        return
    path = _record_path(state_dir, entry["local_rank"])
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        tmp = "%s.tmp-%d" % (path, os.getpid())
        with open(tmp, "w") as fh:
            json.dump(entry, fh, sort_keys=True)
        os.rename(tmp, path)
    except OSError as exc:  # the job matters more than the record
        _log("could not record the worker start in %s: %s" % (directory, exc))


def prepare(environ=None, sleep=time.sleep, rng=None):
    """Back off when restarting, pick the checkpoint to resume from; returns the entry recorded (also set in the
    environment the entrypoint gets)."""
    env = os.environ if environ is None else environ
    restart = int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)
    local_rank = env.get("LOCAL_RANK", "0")
    agent_pid = os.getppid()  # torchrun's agent starts its workers itself: the same parent for one torchrun run
    prev = previous_restarts(env.get("GPUFLEET_ELASTIC_STATE_DIR"), local_rank, agent_pid)
    restarts = max(restart, prev + 1 if prev is not None else 0)
    entry = {"local_rank": local_rank, "rank": env.get("RANK"), "pid": os.getpid(), "agent_pid": agent_pid,
             "restart_count": restart, "restarts": restarts,
             "max_restarts": int(env.get("TORCHELASTIC_MAX_RESTARTS") or 0), "backoff_s": 0.0, "resume_from": None}
    env[ENV_RESTARTS] = str(restarts)
    if restarts > restart and local_rank == "0":
        _log("restart %d of the worker group: the group changed (a peer's worker failed, or a node joined or left); "
             "no backoff here, %d of %s restarts used by failures on this node" % (
                 restarts, restart, env.get("TORCHELASTIC_MAX_RESTARTS", "?")))
    if restart > 0:
        # Every local rank of a node draws the same delay (seeded by run, restart and host): they start together.
        seed = "%s/%d/%s" % (env.get("TORCHELASTIC_RUN_ID", ""), restart, socket.gethostname())
        delay = backoff_delay(restart, _float_env("GPUFLEET_BACKOFF_BASE_S", 0.0),
                              _float_env("GPUFLEET_BACKOFF_MAX_S", 300.0), _float_env("GPUFLEET_BACKOFF_JITTER", 0.5),
                              rng or random.Random(seed))
        entry["backoff_s"] = round(delay, 3)
        if delay > 0:
            _log("restart %d of %s: waiting %.1f s before starting the entrypoint" % (
                restart, env.get("TORCHELASTIC_MAX_RESTARTS", "?"), delay))
            sleep(delay)
    skipped = []
    ckpt = gpufleet_ckpt.latest(env.get(gpufleet_ckpt.ENV_DIR), skipped) if env.get(gpufleet_ckpt.ENV_DIR) else None
    env[gpufleet_ckpt.ENV_RESUME] = ckpt.path if ckpt else ""
    entry["resume_from"] = ckpt.path if ckpt else None
    if local_rank == "0":
        for name, why in skipped:
            _log("not resuming from %s: %s" % (name, why))
        _log("resuming from %s" % ckpt.path if ckpt else "no complete checkpoint: starting from scratch")
    entry["started"] = time.time()
    record(env.get("GPUFLEET_ELASTIC_STATE_DIR"), entry)
    return entry


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        _log("usage: gpufleet-elastic-worker ENTRYPOINT [ARGS...] (started by torchrun)")
        return 2
    prepare()
    if os.environ.get("GPUFLEET_ENTRYPOINT_PYTHON", "1") == "0":
        os.execv(argv[0], argv)
    os.execv(sys.executable, [sys.executable, "-u"] + argv)
    return 0  # not reached
