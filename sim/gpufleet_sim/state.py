"""Per-node state directory: simulated boot, kernel log, lost GPUs, load markers, checkpoint directory.

Several stand-ins run at once on a node (nvidia-smi sampling while gpu_burn burns), so every write is atomic
(rename) or made under an flock on <state>/.lock. Durations the tools report (a 600 s burn, diag levels) are
compressed by GPUFLEET_SIM_TIME_SCALE; times are the real wall clock plus the node's clock (simulated days advanced
between runs, `gpufleet-sim clock`), so `journalctl --since` with the controller's clock finds what a run produced.
"""

import contextlib
import fcntl
import json
import os
import shlex
import stat
import time

from . import fabric, klog
from . import scenario as scenario_mod

MARKER = "node.json"
CLOCK = "clock.json"
# What the kentino.gpufleet.training_env role sets on a real node.
DEFAULT_TRAINING_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}


def default_state_dir(scen_spec):
    base = os.environ.get("TMPDIR", "/tmp")
    name = os.path.basename(scen_spec or "default")
    if name.endswith(".json"):
        name = name[:-5]
    return os.path.join(base, "gpufleet-sim-%d" % os.getuid(), name)


class Node:
    """One simulated node: its scenario and its state directory (created on first use)."""

    def __init__(self, env=None):
        env = os.environ if env is None else env
        spec = env.get("GPUFLEET_SIM_SCENARIO", "")
        self.state_dir = os.path.abspath(env.get("GPUFLEET_SIM_STATE") or default_state_dir(spec))
        node_name = env.get("GPUFLEET_SIM_NODE") or os.path.basename(self.state_dir.rstrip("/"))
        self.scen = scenario_mod.load(spec, node_name)
        self.scale = scenario_mod.time_scale(env)
        self.gpus = self.scen["gpu_list"]
        self.model = self.gpus[0] if self.gpus else {}
        self.hostname = node_name
        self.fabric_path = env.get("GPUFLEET_SIM_FABRIC") or None
        self.info = self._ensure()
        if self.scen.get("timeline"):
            # What the scenario says changes on the node from a simulated day on (a driver update, a slower GPU).
            self.scen = scenario_mod.at_day(self.scen, self.clock_days())
            self.gpus = self.scen["gpu_list"]
            self.model = self.gpus[0] if self.gpus else {}

    # ---- files -----------------------------------------------------------------------------------------------
    def path(self, *parts):
        return os.path.join(self.state_dir, *parts)

    @contextlib.contextmanager
    def lock(self):
        os.makedirs(self.state_dir, exist_ok=True)
        with open(self.path(".lock"), "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def read_json(self, name, default=None):
        try:
            with open(self.path(name)) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return default

    def write_json(self, name, data):
        tmp = self.path("%s.%d.tmp" % (name, os.getpid()))
        with open(tmp, "w") as fh:
            json.dump(data, fh, sort_keys=True)
        os.replace(tmp, self.path(name))

    # ---- initialisation --------------------------------------------------------------------------------------
    def _ensure(self):
        info = self.read_json(MARKER)
        if info and info.get("scenario_path") == self.scen["path"] and info.get("node") == self.hostname:
            return info
        with self.lock():
            info = self.read_json(MARKER)
            if info and info.get("scenario_path") == self.scen["path"] and info.get("node") == self.hostname:
                return info
            # A different scenario or node: start from a clean state so nothing of the old one leaks in.
            _clear_contents(self.state_dir, keep=(".lock",))
            return self._initialise()

    def _initialise(self):
        now = time.time()
        kl = self.scen["kernel_log"]
        uptime = float(kl.get("uptime_s", 4 * 86400 + 3187.25))
        prev = int(kl.get("previous_boots", 1))
        import uuid  # here, not at the top: every stand-in call imports this module (uuid brings platform)

        seed = self.scen["node"] + "/" + self.scen["name"]
        boots = []
        start = now - uptime
        for back in range(prev, 0, -1):
            # Earlier boots: each ran ~3 days and ended ~2 minutes before the next started.
            b_start = start - back * (3 * 86400 + 120)
            boots.append({"id": uuid.UUID(klog.hex_seed(seed, "boot", back)[:32]).hex, "start": b_start,
                          "end": b_start + 3 * 86400})
        boots.append({"id": uuid.UUID(klog.hex_seed(seed, "boot", 0)[:32]).hex, "start": start, "end": None})
        info = {
            "scenario_path": self.scen["path"], "scenario": self.scen["name"], "node": self.hostname,
            "created": now, "boots": boots, "seqnum_id": klog.hex_seed(seed, "seqnum")[:32],
            "machine_id": klog.hex_seed(seed, "machine")[:32],
        }
        records = klog.initial_records(self, boots, now)
        with open(self.path("kernel.jsonl"), "w") as fh:
            for seq, rec in enumerate(records, 1):
                rec["seq"] = seq
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
        info["next_seq"] = len(records) + 1
        os.makedirs(self.path("load"), exist_ok=True)
        clock = self.scen.get("clock") or {}
        if clock.get("days"):
            self.write_json(CLOCK, {"days": float(clock["days"])})
        self._make_dmi()
        self._make_checkpoint_dir()
        self._make_home()
        self.write_mounts()
        fabric.write_platform(self)
        self.write_ib_ports(0.0)
        self.write_json(MARKER, info)
        return info

    def _make_dmi(self):
        """<state>/dmi: the node's /sys/class/dmi/id files (vendor, product, board, BIOS, serials) from the scenario's
        DMI boot line, serials derived from the node name; the audit's snapshot reads them with dmi_dir."""
        path = self.path("dmi")
        os.makedirs(path, exist_ok=True)
        for name, value in scenario_mod.dmi_files(self.scen).items():
            with open(os.path.join(path, name), "w") as fh:
                fh.write(value + "\n")

    def _make_checkpoint_dir(self):
        ckpt = self.scen["storage"].get("checkpoint", {})
        path = self.checkpoint_dir()
        os.makedirs(path, exist_ok=True)
        if ckpt.get("read_only"):
            # Honest only for non-root users: root bypasses the mode bits (see sim/README.md, checkpoint_readonly).
            os.chmod(path, 0o555)

    def _make_home(self):
        """<state>/home: the training user's home, whose login profile exports the scenario's training environment
        (default: what kentino.gpufleet.training_env sets), so a login shell on the simulated node sees the node's
        environment and not this machine's."""
        home = self.path("home")
        os.makedirs(home, exist_ok=True)
        env = self.scen.get("training_env", DEFAULT_TRAINING_ENV)
        with open(os.path.join(home, ".bash_profile"), "w") as fh:
            fh.write("# written by gpufleet-sim from the scenario's training_env\n")
            for name in sorted(env):
                fh.write("export %s=%s\n" % (name, shlex.quote(str(env[name]))))

    def checkpoint_dir(self):
        return self.path("checkpoint")

    def write_mounts(self):
        """<state>/mounts: this machine's mount table plus the simulated checkpoint filesystem, /proc/mounts format.

        The collection's checkpoint_storage module reads a mount table file (default /proc/mounts); pointing it at
        this file shows the checkpoint directory as a mount of the scenario's NVMe namespace, rw or ro.
        """
        ckpt = self.scen["storage"].get("checkpoint", {})
        try:
            with open("/proc/mounts") as fh:
                real = fh.read()
        except OSError:
            real = "/dev/root / ext4 rw,relatime 0 0\n"
        escaped = self.checkpoint_dir()
        for ch, code in (("\\", "\\134"), (" ", "\\040"), ("\t", "\\011"), ("\n", "\\012")):
            escaped = escaped.replace(ch, code)
        opts = "ro,relatime" if ckpt.get("read_only") else "rw,relatime,errors=remount-ro"
        line = "%s %s %s %s 0 0\n" % (ckpt.get("device", "/dev/nvme1n1p1"), escaped, ckpt.get("fstype", "ext4"), opts)
        with open(self.path("mounts"), "w") as fh:
            fh.write(real.rstrip("\n") + "\n" + line)

    # ---- time ------------------------------------------------------------------------------------------------
    @property
    def boot(self):
        return self.info["boots"][-1]

    def uptime_s(self, now=None):
        return (time.time() if now is None else now) - self.boot["start"]

    def sim_elapsed_s(self, now=None):
        """Simulated seconds since this state was created: compressed time plus the clock's days."""
        return max(0.0, ((time.time() if now is None else now) - self.info["created"]) / self.scale) + \
            self.clock_offset_s()

    # The clock: simulated days since the state was created, advanced between runs (`gpufleet-sim clock`). What the
    # node reports as the time (nvidia-smi's timestamp, new kernel log lines) and what follows the days (ECC
    # counters, the scenario's XID 92 schedule and timeline) is shifted by it; durations and load markers are not.
    def clock_days(self):
        return float((self.read_json(CLOCK, {}) or {}).get("days", 0.0))

    def clock_offset_s(self):
        return self.clock_days() * 86400.0

    def now(self):
        """The node's wall clock: the real time plus the simulated days."""
        return time.time() + self.clock_offset_s()

    def set_clock(self, days):
        with self.lock():
            self.write_json(CLOCK, {"days": float(days)})

    # ---- kernel log ------------------------------------------------------------------------------------------
    def append_kernel(self, messages, when=None, prio=4):
        """Append kernel lines (str, or (offset_s, str[, prio]) tuples) to the current boot's log."""
        when = self.now() if when is None else when
        with self.lock():
            info = self.read_json(MARKER)
            seq = info["next_seq"]
            with open(self.path("kernel.jsonl"), "a") as fh:
                for item in messages:
                    if isinstance(item, str):
                        item = (0.0, item)
                    offset, msg = item[0], item[1]
                    p = item[2] if len(item) > 2 else prio
                    rec = klog.record(self, info["boots"][-1], when + offset, msg, p)
                    rec["seq"] = seq
                    seq += 1
                    fh.write(json.dumps(rec, sort_keys=True) + "\n")
            info["next_seq"] = seq
            self.write_json(MARKER, info)
            self.info = info

    def kernel_records(self):
        out = []
        try:
            with open(self.path("kernel.jsonl")) as fh:
                for line in fh:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        continue
        except OSError:
            pass
        return out

    # ---- lost GPUs -------------------------------------------------------------------------------------------
    def lost(self):
        return {int(k): v for k, v in (self.read_json("lost.json", {}) or {}).items()}

    def mark_lost(self, indices, reason, when=None):
        with self.lock():
            lost = self.read_json("lost.json", {}) or {}
            for i in indices:
                lost.setdefault(str(i), {"at": time.time() if when is None else when, "reason": reason})
            self.write_json("lost.json", lost)

    # ---- GPU resets (nvidia-smi --gpu-reset): a reset applies pending row remaps and page retirements ---------
    def resets(self):
        return {int(k): v for k, v in (self.read_json("resets.json", {}) or {}).items()}

    def mark_reset(self, index, when=None):
        with self.lock():
            resets = self.read_json("resets.json", {}) or {}
            resets[str(index)] = time.time() if when is None else when
            self.write_json("resets.json", resets)

    # ---- load markers ----------------------------------------------------------------------------------------
    def add_load(self, gpus, start, end, kind, pid=None, process_name=None):
        pid = os.getpid() if pid is None else pid
        os.makedirs(self.path("load"), exist_ok=True)
        self.write_json(os.path.join("load", "%d.json" % pid),
                        {"pid": pid, "gpus": list(gpus), "start": start, "end": end, "kind": kind,
                         "process_name": process_name or kind})

    def remove_load(self, pid=None):
        pid = os.getpid() if pid is None else pid
        rec = self.read_json(os.path.join("load", "%d.json" % pid))
        with contextlib.suppress(OSError):
            os.unlink(self.path("load", "%d.json" % pid))
        if rec:
            self._account_load(rec, time.time())

    def _account_load(self, rec, end):
        """Remember finished load per GPU: total simulated load seconds (ECC growth) and when it ended (cooling)."""
        with self.lock():
            hist = self.read_json("load_history.json", {}) or {}
            for g in rec["gpus"]:
                h = hist.setdefault(str(g), {"load_sim_s": 0.0, "last_start": None, "last_end": None})
                h["load_sim_s"] += max(0.0, min(end, rec["end"]) - rec["start"]) / self.scale
                h["last_start"], h["last_end"] = rec["start"], end
            self.write_json("load_history.json", hist)
            self.write_ib_ports(max([h["load_sim_s"] for h in hist.values()] or [0.0]))

    def write_ib_ports(self, load_s):
        """The node's InfiniBand ports in <state>/sysfs/class/infiniband, from the fabric (GPUFLEET_SIM_FABRIC) after
        load_s simulated load seconds; nothing for a node without one (no InfiniBand)."""
        if self.fabric_path:
            from . import ib_fabric  # here: only nodes on a simulated fabric have ports, and it brings random

            ib_fabric.write_ports(self.path("sysfs", "class", "infiniband"), ib_fabric.Fabric.load(self.fabric_path),
                                  self.hostname, load_s)

    def active_loads(self, now=None):
        now = time.time() if now is None else now
        out = []
        try:
            names = os.listdir(self.path("load"))
        except OSError:
            return out
        for name in names:
            rec = self.read_json(os.path.join("load", name))
            if not rec:
                continue
            if not _pid_alive(rec["pid"]) or now > rec["end"] + 2.0:
                # The burner died or was killed without cleaning up: account for it and forget the marker.
                with contextlib.suppress(OSError):
                    os.unlink(self.path("load", name))
                self._account_load(rec, min(now, rec["end"]))
                continue
            out.append(rec)
        return out

    def load_history(self):
        return {int(k): v for k, v in (self.read_json("load_history.json", {}) or {}).items()}


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clear_contents(path, keep=()):
    if not os.path.isdir(path):
        return
    for name in os.listdir(path):
        if name in keep:
            continue
        full = os.path.join(path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            import shutil  # here: only a reset removes trees, and every stand-in call imports this module

            _make_writable(full)
            shutil.rmtree(full, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(full)


def _make_writable(path):
    for root, dirs, _files in os.walk(path):
        for d in [root] + [os.path.join(root, x) for x in dirs]:
            with contextlib.suppress(OSError):
                os.chmod(d, os.stat(d).st_mode | stat.S_IWUSR | stat.S_IXUSR | stat.S_IRUSR)


def reset(state_dir):
    """Clear a node's state so the next stand-in call starts from the scenario again. Refuses unknown dirs."""
    state_dir = os.path.abspath(state_dir)
    if not os.path.isdir(state_dir):
        return False
    if not os.path.exists(os.path.join(state_dir, MARKER)) and os.listdir(state_dir) not in ([], [".lock"]):
        raise RuntimeError("%s does not look like a gpufleet-sim state directory (no %s): not clearing it"
                           % (state_dir, MARKER))
    _clear_contents(state_dir)
    return True
