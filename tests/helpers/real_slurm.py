"""A real Slurm (Debian's slurmctld, slurmd and munge, Slurm 22.05) on this machine, for the lifecycle's tests: one
munged with a key made for it, one slurmctld and one slurmd per Slurm node, all in a private directory under /tmp (its
own slurm.conf, gres.conf, key, state, spool, logs), on free loopback ports, as root, without systemd.

- Several slurmd on one host: each runs as `slurmd -D -N <node>` and listens on its node's own `Port=` (every node
  has NodeHostname=<this host> NodeAddr=127.0.0.1); Debian's build allows it, no network namespace is needed.
- GPUs without GPUs: Slurm 22.05's gres/gpu drops a GPU without a File= ("Removing file-less GPU ... from final GRES
  list", then the node is INVAL: "gres/gpu count reported lower than configured"), and a File= that is not a
  character or block device is an error. So each node's GPUs are character devices made here with /dev/null's
  numbers (mknod c 1 3) and gres.conf says `AutoDetect=off` and `NodeName=<node> Name=gpu File=<dir>/dev/<node>-gpu[0-1]`.
- Daemons run in the foreground as this process's children, each in its own session; `close()` cancels every job,
  stops them by their process ids and removes the directory.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("scontrol", "sinfo", "squeue", "scancel", "sbatch", "salloc")


def missing_tools():
    return [t for t in DAEMONS + CLIENTS if not shutil.which(t) and not os.path.exists("/usr/sbin/" + t)]


def unavailable():
    """Why a real Slurm cannot start here (None when it can). Root without the packages is a failure, not a skip:
    `make test` (hack/system-deps) installs them as root."""
    missing = missing_tools()
    if os.geteuid() != 0:
        return "a real Slurm needs root (its daemons run as SlurmUser=root, the GPUs are mknod'ed)" + (
            "; and the packages slurmctld slurmd munge slurm-client (missing: %s)" % " ".join(missing)
            if missing else "")
    if missing:
        raise RuntimeError("Slurm is not installed (missing: %s): run hack/system-deps as root (it installs "
                           "slurmctld slurmd munge slurm-client)" % " ".join(missing))
    return None


def _sbin(tool):
    return shutil.which(tool) or "/usr/sbin/" + tool


def free_ports(count):
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(condition, timeout_s, what):
    """Poll condition() until it returns something true; its last value or TimeoutError naming `what`."""
    deadline, pause = time.monotonic() + timeout_s, 0.1
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("real Slurm: %s did not happen within %s s" % (what, timeout_s))
        time.sleep(pause)
        pause = min(pause * 1.5, 0.3)  # each look is a Slurm RPC: look often at first, then less


class RealSlurm:
    def __init__(self, nodes=("gf1", "gf2", "gf3", "gf4", "gf5", "gf6"), cpus=2, gpus=2):
        self.nodes, self.cpus, self.gpus = tuple(nodes), cpus, gpus
        self.root = Path(tempfile.mkdtemp(prefix="gfslurm-", dir="/tmp"))  # short: unix socket paths
        self.root.chmod(0o711)  # munged wants its socket's directories searchable by all
        self.conf = self.root / "slurm.conf"
        self.procs = {}
        self.host = socket.gethostname().split(".")[0]

    # ---- start ---------------------------------------------------------------------------------------------------
    def start(self):
        try:
            self.munge_socket = self._munged("munge")
            self.ctld_port, *node_ports = free_ports(1 + len(self.nodes))
            self.node_ports = dict(zip(self.nodes, node_ports, strict=True))
            self._write_conf()
            self.start_controller(registered=False)  # no slurmd yet
            for node in self.nodes:
                (self.root / "spool" / node).mkdir(parents=True)
                self._spawn("slurmd-" + node, [_sbin("slurmd"), "-D", "-N", node])
            wait_for(lambda: (lambda s: s and all(v == "idle" for v in s.values()))(self.sinfo_states()), 60,
                     "every node IDLE")
        except BaseException:
            self.close()
            raise
        return self

    def _munged(self, name):
        """A munged with a key of its own, in <root>/<name>; its socket's path."""
        d = self.root / name
        d.mkdir(mode=0o711)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = d / "socket"
        self._spawn(name, [_sbin("munged"), "-F", "--socket=%s" % sock, "--key-file=%s" % key,
                           "--pid-file=%s" % (d / "pid"), "--log-file=%s" % (d / "log"),
                           "--seed-file=%s" % (d / "seed")])
        wait_for(sock.exists, 20, "munged %s's socket" % name)
        return sock

    def _write_conf(self, path=None, **overrides):
        r = self.root
        (r / "dev").mkdir(exist_ok=True)
        settings = dict(
            ClusterName="gpufleettest", SlurmctldHost="%s(127.0.0.1)" % self.host, SlurmctldPort=self.ctld_port,
            SlurmUser="root", SlurmdUser="root", AuthType="auth/munge", CredType="cred/munge",
            AuthInfo="socket=%s" % self.munge_socket, StateSaveLocation=r / "state",
            SlurmdSpoolDir=r / "spool" / "%n", SlurmctldPidFile=r / "slurmctld.pid", SlurmdPidFile=r / "slurmd-%n.pid",
            SlurmctldLogFile=r / "slurmctld.log", SlurmdLogFile=r / "slurmd-%n.log",
            # no cgroups, no accounting, no MPI: the nodes share this one machine and its kernel
            ProctrackType="proctrack/linuxproc", TaskPlugin="task/none", JobAcctGatherType="jobacct_gather/none",
            AccountingStorageType="accounting_storage/none", JobCompType="jobcomp/none", MpiDefault="none",
            SelectType="select/cons_tres", SelectTypeParameters="CR_Core", SchedulerType="sched/builtin",
            GresTypes="gpu", ReturnToService=2)
        settings.update(overrides)
        lines = ["%s=%s" % kv for kv in settings.items()]
        gres = ["AutoDetect=off"]
        for node in self.nodes:
            for i in range(self.gpus):
                dev = r / "dev" / ("%s-gpu%d" % (node, i))
                if not dev.exists():
                    os.mknod(dev, 0o600 | 0o020000, os.makedev(1, 3))  # a character device: /dev/null's numbers
            lines.append("NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%d CPUs=%d RealMemory=100 Gres=gpu:%d "
                         "State=UNKNOWN" % (node, self.host, self.node_ports[node], self.cpus, self.gpus))
            gres.append("NodeName=%s Name=gpu File=%s/dev/%s-gpu[0-%d]" % (node, r, node, self.gpus - 1))
        lines.append("PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        path = path or self.conf
        path.write_text("\n".join(lines) + "\n")
        if path == self.conf:
            (path.parent / "gres.conf").write_text("\n".join(gres) + "\n")
        return path

    def client_conf(self, name, munged=None, **overrides):
        """A slurm.conf for a client in a directory of its own (with the same gres.conf): another munged (another
        key) or other settings, as another host's client would have."""
        d = self.root / ("client-%s" % name)
        d.mkdir(exist_ok=True)
        if munged:
            overrides["AuthInfo"] = "socket=%s" % self._munged(munged)
        shutil.copy(self.root / "gres.conf", d / "gres.conf")
        return self._write_conf(d / "slurm.conf", **overrides)

    def _spawn(self, name, argv):
        log = open(self.root / ("%s.out" % name), "ab")
        try:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                                start_new_session=True, cwd=self.root)
        finally:
            log.close()

    def start_controller(self, registered=True):
        self._spawn("slurmctld", [_sbin("slurmctld"), "-D"])
        wait_for(lambda: self.run(["scontrol", "ping"], 10)[0] == 0, 30, "slurmctld answering")
        if not registered:
            return
        # and every slurmd registered with it again (a restarted slurmctld knows them as UNKNOWN first)
        wait_for(lambda: (lambda s: s and not any(v.startswith("unknown") or v.endswith("*") for v in s.values()))(
            self.sinfo_states()), 60, "slurmctld answering and every slurmd registered")

    def stop_controller(self):
        self._stop("slurmctld")

    def _stop(self, name):
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    # ---- ask -------------------------------------------------------------------------------------------------------
    def env(self, conf=None):
        return dict(os.environ, SLURM_CONF=str(conf or self.conf), LC_ALL="C")

    def run(self, argv, timeout_s=30, conf=None):
        """SlurmClient's runner: (rc, stdout, stderr, timed_out, error)."""
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=self.env(conf))
        except subprocess.TimeoutExpired as exc:
            return None, exc.stdout or "", exc.stderr or "", True, None
        except OSError as exc:
            return None, "", "", False, str(exc)
        return p.returncode, p.stdout, p.stderr, False, None

    def check(self, *argv):
        rc, out, err, _t, _e = self.run(list(argv))
        if rc != 0:
            raise RuntimeError("`%s` exited %s: %s" % (" ".join(argv), rc, (err or out).strip()))
        return out

    def sinfo_states(self):
        rc, out, _err, _t, _e = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], 10)
        return dict(line.split() for line in out.splitlines()) if rc == 0 else {}

    def show(self, node):
        return self.check("scontrol", "show", "node", "-o", node)

    def node_state(self, node, shown=None):
        return next(w for w in (shown or self.show(node)).split() if w.startswith("State="))[len("State="):]

    def jobs(self, node=None):
        """Job ids (oldest first) on the node or waiting for it (a pending job's reason names it), all with None.
        The tests' jobs are on one node each (-N1), so %N is one name."""
        out = self.check("squeue", "-h", "-o", "%i %N %r")
        return sorted(int(line.split()[0]) for line in out.splitlines()
                      if node is None or node in re.split(r"[\s,:]+", line)[1:])

    def allocate(self, node, cpus):
        """A job that holds `cpus` CPUs and one GPU of the node, if Slurm starts it at once (salloc --immediate
        --no-shell: it runs no process); its id, or None when Slurm refused (the node drained, down or full)."""
        rc, _out, err, _t, _e = self.run(["salloc", "--no-shell", "--immediate", "-N1", "-w", node, "-n", str(cpus),
                                          "--gres=gpu:1", "-J", "gpufleet-test"], 30)
        if rc != 0:
            return None
        return int(err.split("Granted job allocation", 1)[1].split()[0])

    def sbatch_sleep(self, node, seconds=300):
        """A batch job running `sleep` on the node; its id once it runs."""
        job = int(self.check("sbatch", "--parsable", "-N1", "-w", node, "-n1", "--gres=gpu:1", "-o", "/dev/null",
                             "-J", "gpufleet-test", "--wrap", "sleep %d" % seconds).split(";")[0])
        wait_for(lambda: self.check("squeue", "-h", "-j", str(job), "-o", "%T").strip() == "RUNNING", 30,
                 "job %d running" % job)
        return job

    def end(self, job):
        """Cancel the job and wait until it is gone and no node is COMPLETING for it."""
        self.run(["scancel", str(job)])
        wait_for(lambda: job not in self.jobs(), 30, "job %d gone" % job)

    def settled(self, node):
        """Wait until the node is neither COMPLETING (a job ending) nor NOT_RESPONDING (slurmctld pings a node it
        resumed); scontrol's line for it then."""
        def look():
            shown = self.show(node)
            return shown if not {"COMPLETING", "NOT_RESPONDING"} & set(self.node_state(node, shown).split("+")) \
                else None
        return wait_for(look, 30, "node %s settled" % node)

    def reset(self, node, jobs=None):
        """Back to IDLE with no job and no drain, as an administrator would (between property sequences): jobs are
        the node's (squeue's view unless given)."""
        for job in self.jobs(node) if jobs is None else jobs:
            self.end(job)
        if "DRAIN" in self.node_state(node, self.settled(node)).split("+"):
            self.check("scontrol", "update", "nodename=%s" % node, "state=resume")
            self.settled(node)

    # ---- stop ------------------------------------------------------------------------------------------------------
    def close(self):
        if "slurmctld" in self.procs:
            try:
                for job in self.jobs():
                    self.end(job)
            except (RuntimeError, TimeoutError):
                pass  # stopping anyway; the sweep below ends what the jobs left
        for name in [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld"] + \
                [n for n in self.procs if "munge" in n]:
            self._stop(name)
        self._sweep()
        shutil.rmtree(self.root, ignore_errors=True)

    def _sweep(self):
        """End any process this Slurm left (a slurmstepd or a job's process): those whose environment names this
        Slurm's configuration, by id."""
        mark = ("SLURM_CONF=%s" % self.conf).encode()
        for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
            try:
                environ = Path("/proc/%s/environ" % pid).read_bytes()
            except OSError:
                continue
            if mark in environ.split(b"\0"):
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
