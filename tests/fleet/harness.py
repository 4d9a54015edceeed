"""The real test fleet: systemd-nspawn nodes with systemd as PID 1 and sshd, each in its own network namespace.

Controller-side test code (root only). One Debian base is built with debootstrap once per package list and cached;
each node boots from an overlayfs on that base, so a node costs a few MiB and a second or two. Everything `up` creates is
written to `<fleet dir>/state.json` BEFORE it is created, so `down` (here, in the pytest finalizer, at exit, or from
`hack/testfleet down`) can remove it from the state file alone, after a crash mid-up too, and any number of times.

Traffic stays inside what this module creates: one bridge with a /24, one veth per node, no default route, no NAT.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aptrepo import DEFAULT_MIRROR, index_repo  # noqa: E402 (test-only sibling module)

BASE_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-apt", "sudo", "iproute2", "apt-utils",
    "ca-certificates", "procps", "less", "gnupg",
    # Open MPI for the fabric search's pair tests (test_fabric_mpirun.py): in the one base, because a second base is a
    # second debootstrap on every fresh machine (minutes of CI), where these add seconds to the first.
    "openmpi-bin", "python3-mpi4py",
)
# Bump when the base customisation below changes: it is part of the cache key.
BASE_RECIPE = "4"
DEFAULT_CACHE = Path(os.environ.get("GPUFLEET_TESTFLEET_CACHE", "/var/cache/gpufleet/testfleet"))
DEFAULT_SUITE = "bookworm"
APT_MOUNT = "/srv/gpufleet-apt"
# The simulator's module code cache (sim/gpufleet_sim/module_code_cache.py), shared by every node of every fleet on
# this machine: Python compiles an AnsiballZ payload at every module run, and the nodes' runs share the controller's
# cores (about a third of a module run's CPU). GPUFLEET_TESTFLEET_MODULE_CACHE=0 leaves the nodes' Python as Debian
# ships it, to measure a real node's cost.
MODULE_CODE_CACHE = DEFAULT_CACHE / "module-code"
MODULE_CODE_MOUNT = "/var/cache/gpufleet-module-code"
MODULE_CODE_SOURCE = Path(__file__).resolve().parents[2] / "sim/gpufleet_sim/module_code_cache.py"
NODE_SITE_DIR = "usr/lib/python3/dist-packages"
REGISTRY = Path("/run/gpufleet-testfleet")
# Unix socket paths are limited to 107 bytes; ssh's %C is 40 hex characters.
MAX_CONTROL_DIR = 60
STATE_VERSION = 1


def _module_code_cache_on():
    return os.environ.get("GPUFLEET_TESTFLEET_MODULE_CACHE", "1") != "0"


class FleetError(RuntimeError):
    """Something the harness could not do; the message names the node/object, what failed and what to try."""


def _run(argv, check=True, timeout=120, **kw):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise FleetError("command failed (rc=%s): %s\n%s" % (proc.returncode, shlex.join(argv),
                                                             (proc.stderr or proc.stdout)[-2000:]))
    return proc


def _log(msg):
    if os.environ.get("GPUFLEET_TESTFLEET_QUIET") != "1":
        print("[testfleet] " + msg, flush=True)


# ---------------------------------------------------------------------------------------------------------------- base

def base_key(packages=BASE_PACKAGES, suite=DEFAULT_SUITE, mirror=DEFAULT_MIRROR):
    blob = json.dumps({"packages": sorted(packages), "suite": suite, "mirror": mirror, "recipe": BASE_RECIPE})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _customise_base(root: Path):
    """Make the debootstrap tree a neutral template: per-node identity is written at `up`, apt points at the local repo."""
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/machine-id").write_text("")
    with contextlib.suppress(FileNotFoundError):
        (root / "var/lib/dbus/machine-id").unlink()
    # Nodes have no internet: the only apt source is the fleet's file:// repository, bind-mounted read-only.
    with contextlib.suppress(FileNotFoundError):
        (root / "etc/apt/sources.list").unlink()
    (root / "etc/apt/sources.list.d/gpufleet.list").write_text(
        "# kentino.gpufleet test fleet: stand-in vendor packages and real Debian packages, no network needed\n"
        "deb [trusted=yes] file:%s ./\n" % APT_MOUNT)
    (root / "etc/apt/apt.conf.d/90gpufleet").write_text(
        'APT::Install-Recommends "false";\nAcquire::Languages "none";\n')
    # A throwaway node, as Debian's container images have it: dpkg without an fsync per file, and without the
    # documentation no test reads (the fleet's packages are unpacked dozens of times per suite, beside other work).
    (root / "etc/dpkg/dpkg.cfg.d/90gpufleet-testfleet").write_text(
        "force-unsafe-io\npath-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\n"
        "path-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\npath-exclude /usr/share/locale/*\n")
    (root / "etc/ssh/sshd_config.d/gpufleet.conf").write_text(
        "# Per-node ed25519 host key written by the harness; Ansible opens many sessions at once.\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "UseDNS no\nMaxStartups 100:30:200\nMaxSessions 100\n")
    # The container's journal goes to its console too, which is the node's log file on the host.
    jd = root / "etc/systemd/journald.conf.d"
    jd.mkdir(parents=True, exist_ok=True)
    (jd / "gpufleet.conf").write_text("[Journal]\nForwardToConsole=yes\nMaxLevelConsole=info\nStorage=volatile\n")
    # Timers that would take the dpkg lock in the middle of a test.
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer"):
        link = root / "etc/systemd/system" / unit
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to("/dev/null")
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    (root / "etc/resolv.conf").write_text("# kentino.gpufleet test fleet: no DNS, see /etc/hosts\n")
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    (root / "etc/gpufleet-testfleet-base").write_text("recipe=%s\n" % BASE_RECIPE)


def ensure_base(cache=DEFAULT_CACHE, packages=BASE_PACKAGES, suite=DEFAULT_SUITE, mirror=DEFAULT_MIRROR,
                rebuild=False) -> Path:
    """Return the cached base for this package list, building it first when absent (a few tens of seconds).

    Built into a temporary directory and renamed into place, under a lock, so a half-built base is never used and two
    concurrent runs do not both build it.
    """
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / ("base-" + base_key(packages, suite, mirror))
    with open(cache / (".lock-" + final.name), "w") as lock:  # per base: building one does not block another
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir() and (final / "etc/gpufleet-testfleet-base").exists() and not rebuild:
            return final
        if not shutil.which("debootstrap"):
            raise FleetError("debootstrap is not installed: apt-get install debootstrap systemd-container")
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))
        started = time.monotonic()
        _log("building base %s with debootstrap (%s, %s)" % (final.name, suite, mirror))
        try:
            proc = subprocess.run(
                ["debootstrap", "--variant=minbase", "--include=" + ",".join(sorted(packages)), suite,
                 str(tmp / "root"), mirror], capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                raise FleetError("debootstrap of the test fleet base failed (rc=%s); is %s reachable?\n%s"
                                 % (proc.returncode, mirror, (proc.stdout + proc.stderr)[-3000:]))
            _customise_base(tmp / "root")
            old = None
            if final.exists():
                old = cache / (".old-%s-%d" % (final.name, os.getpid()))
                final.rename(old)
            (tmp / "root").rename(final)
            if old:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _log("base built in %.1f s: %s" % (time.monotonic() - started, final))
        return final


# ------------------------------------------------------------------------------------------------------------- helpers

def netns_inode(name):
    try:
        return os.stat("/run/netns/" + name).st_ino
    except FileNotFoundError:
        return None


def netns_pids(name):
    """PIDs whose network namespace is /run/netns/<name> (what `ip netns pids` prints), read from /proc."""
    ino = netns_inode(name)
    if ino is None:
        return []
    want = "net:[%d]" % ino
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink("/proc/%s/ns/net" % entry) == want:
                pids.append(int(entry))
        except OSError:
            continue
    return sorted(pids)


def _status_field(pid, key):
    try:
        with open("/proc/%d/status" % pid) as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return line.split(":", 1)[1].split()
    except OSError:
        return None
    return None


def _is_zombie(pid):
    state = _status_field(pid, "State")
    return state is None or state[0] in ("Z", "X")


def container_pid1(netns):
    """The host PID of the container's init: the process in that netns whose innermost PID is 1."""
    for pid in netns_pids(netns):
        nspid = _status_field(pid, "NSpid")
        if nspid and len(nspid) > 1 and nspid[-1] == "1" and not _is_zombie(pid):
            return pid
    return None


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes_with(marker):
    """{pid: command line} of the live processes (not this one) whose command line holds marker, one pass of /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            cmd = _cmdline(int(entry))
            if marker in cmd and not _is_zombie(int(entry)):
                out[int(entry)] = cmd
    return out


def _alive(pid):
    return pid is not None and os.path.exists("/proc/%d" % pid) and not _is_zombie(pid)


def _kill(pid, sig=signal.SIGKILL):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _wait_gone(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def overlay_mounts():
    """Mount points from /proc/mounts (unescaped), for checks that teardown left nothing mounted."""
    out = []
    with open("/proc/mounts") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) > 2:
                out.append(parts[1].encode().decode("unicode_escape"))
    return out


def tail(path, n=40):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError as exc:
        return "(no log: %s)" % exc
    return "\n".join(lines[-n:])


# --------------------------------------------------------------------------------------------------------------- fleet

@dataclass
class Node:
    name: str
    index: int
    ip: str
    netns: str
    veth_host: str
    dir: str
    nspawn_pid: int | None = None
    pid1: int | None = None
    mounted: bool = False

    @property
    def merged(self):
        return Path(self.dir) / "merged"

    @property
    def log(self):
        return Path(self.dir) / "console.log"


@dataclass
class Fleet:
    """A test fleet rooted at `dir`. Use `up()`/`down()`, or `Fleet.from_state(dir).down()` from another process."""

    dir: Path
    nodes_wanted: int = 4
    prefix: str = "gpf"
    subnet: str = "10.213.0"  # a /24: .1 is the bridge (the controller), nodes are .10+
    bridge: str = ""
    base: Path | None = None
    binds: list = field(default_factory=list)  # extra (host_path, node_path) read-only binds
    boot_timeout_s: float = 90.0
    nodes: list = field(default_factory=list)
    _procs: dict = field(default_factory=dict, repr=False)
    _state: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.dir = Path(self.dir).resolve()
        self.bridge = self.bridge or (self.prefix + "-br0")
        for name in (self.bridge, self.prefix + "-v99"):
            if len(name) > 15:
                raise FleetError("interface name %r is longer than 15 characters: use a shorter prefix" % name)

    # paths --------------------------------------------------------------------------------------------------------
    @property
    def state_path(self):
        return self.dir / "state.json"

    @property
    def apt_dir(self):
        return self.dir / "apt"

    @property
    def key_path(self):
        return self.dir / "ssh" / "id_ed25519"

    @property
    def control_dir(self):
        return self.dir / "cp"

    @property
    def inventory_path(self):
        return self.dir / "inventory.yml"

    # state --------------------------------------------------------------------------------------------------------
    def _save(self):
        self._state.update({
            "version": STATE_VERSION, "dir": str(self.dir), "prefix": self.prefix, "subnet": self.subnet,
            "bridge": self.bridge, "nodes": [n.__dict__ for n in self.nodes],
            "control_dir": str(self.control_dir), "apt_dir": str(self.apt_dir), "base": str(self.base or ""),
        })
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=1))
        os.replace(tmp, self.state_path)

    @classmethod
    def from_state(cls, dir):
        state_path = Path(dir) / "state.json"
        data = json.loads(state_path.read_text())
        fleet = cls(dir=Path(data["dir"]), prefix=data["prefix"], subnet=data["subnet"], bridge=data["bridge"],
                    base=Path(data["base"]) if data.get("base") else None)
        fleet.nodes = [Node(**n) for n in data.get("nodes", [])]
        fleet.nodes_wanted = len(fleet.nodes)
        fleet._state = data
        return fleet

    def node(self, name):
        for n in self.nodes:
            if n.name == name:
                return n
        raise FleetError("no node %r in fleet %s (nodes: %s)" % (name, self.dir, ", ".join(n.name for n in self.nodes)))

    # up -----------------------------------------------------------------------------------------------------------
    def up(self, base=None, down_at_exit=True):
        """Create the bridge, N netns+veth+overlay nodes, boot them and wait for ssh. Cleans a stale fleet first.

        down_at_exit: tear down when this Python process exits (tests); the CLI leaves the fleet running.
        """
        if os.geteuid() != 0:
            raise FleetError("the test fleet needs root (network namespaces, overlayfs, systemd-nspawn)")
        for tool in ("systemd-nspawn", "ip", "ssh", "ssh-keygen"):
            if not shutil.which(tool):
                raise FleetError("%s not found: apt-get install systemd-container iproute2 openssh-client" % tool)
        if self.state_path.exists():
            _log("cleaning a previous fleet recorded in %s" % self.state_path)
            Fleet.from_state(self.dir).down()
        if len(str(self.control_dir)) > MAX_CONTROL_DIR:
            raise FleetError("fleet dir %s is too long for ssh control sockets (max %d chars for %s): use a shorter --dir"
                             % (self.dir, MAX_CONTROL_DIR - 3, self.control_dir))
        started = time.monotonic()
        self.base = Path(base) if base else ensure_base()
        self.dir.mkdir(parents=True, exist_ok=True)
        for sub in ("ssh", "cp", "nodes"):
            (self.dir / sub).mkdir(exist_ok=True)
        if not (self.apt_dir / "Packages").exists():
            index_repo(self.apt_dir)  # an empty but valid repo keeps `apt-get update` on the nodes happy
        self.nodes = [Node(name="%s-node%d" % (self.prefix, i), index=i, ip="%s.%d" % (self.subnet, 10 + i),
                           netns="%s-n%d" % (self.prefix, i), veth_host="%s-v%d" % (self.prefix, i),
                           dir=str(self.dir / "nodes" / ("node%d" % i)))
                      for i in range(self.nodes_wanted)]
        self._state["created_at"] = time.time()
        self._save()  # everything below is recorded before it exists
        self._register()
        if down_at_exit:
            atexit.register(self._atexit_down)
        try:
            if not self.key_path.exists():
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpufleet-testfleet-controller",
                      "-f", str(self.key_path)])
            self._make_bridge()
            for node in self.nodes:
                self._make_node(node)
            for node in self.nodes:
                self._boot(node)
            self._wait_all_ready()
            self.write_inventory()
        except BaseException:
            self.down()
            raise
        _log("fleet of %d nodes up in %.1f s (%s)" % (len(self.nodes), time.monotonic() - started, self.inventory_path))
        return self

    def _register(self):
        REGISTRY.mkdir(parents=True, exist_ok=True)
        (REGISTRY / (self.prefix + ".dir")).write_text(str(self.dir) + "\n")

    def _make_bridge(self):
        if Path("/sys/class/net", self.bridge).exists():
            raise FleetError("bridge %s already exists: another fleet with prefix %r is up (hack/testfleet status) "
                             "or a stale one is left: hack/testfleet down, or `ip link del %s`"
                             % (self.bridge, self.prefix, self.bridge))
        self._state["bridge_created"] = True
        self._save()
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", self.subnet + ".1/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])

    def _make_node(self, node):
        d = Path(node.dir)
        for sub in ("upper", "work", "merged"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        if netns_inode(node.netns) is not None:
            raise FleetError("network namespace %s already exists (a stale fleet?): hack/testfleet down, or "
                             "`ip netns del %s`" % (node.netns, node.netns))
        _run(["ip", "netns", "add", node.netns])
        _run(["ip", "link", "add", node.veth_host, "type", "veth", "peer", "name", "eth0", "netns", node.netns])
        _run(["ip", "link", "set", node.veth_host, "master", self.bridge, "up"])
        _run(["ip", "-n", node.netns, "link", "set", "lo", "up"])
        _run(["ip", "-n", node.netns, "addr", "add", node.ip + "/24", "dev", "eth0"])
        _run(["ip", "-n", node.netns, "link", "set", "eth0", "up"])
        node.mounted = True
        self._save()
        _run(["mount", "-t", "overlay", "overlay", "-o", "lowerdir=%s,upperdir=%s,workdir=%s"
              % (self.base, d / "upper", d / "work"), str(node.merged)])
        self._write_identity(node)

    def _write_identity(self, node):
        root = node.merged
        (root / "etc/hostname").write_text(node.name + "\n")
        hosts = ["127.0.0.1 localhost", "127.0.1.1 %s" % node.name, "%s.1 gpufleet-controller" % self.subnet]
        hosts += ["%s %s" % (n.ip, n.name) for n in self.nodes if n is not node]
        (root / "etc/hosts").write_text("\n".join(hosts) + "\n")
        (root / "etc/machine-id").write_text(hashlib.md5(("%s/%s" % (self.dir, node.name)).encode()).hexdigest()
                                             + "\n")
        ssh_dir = root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        auth = ssh_dir / "authorized_keys"
        auth.write_text(Path(str(self.key_path) + ".pub").read_text())
        auth.chmod(0o600)
        host_key = root / "etc/ssh/ssh_host_ed25519_key"
        if not host_key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "root@" + node.name, "-f", str(host_key)])
        if _module_code_cache_on():
            site = root / NODE_SITE_DIR
            shutil.copyfile(MODULE_CODE_SOURCE, site / "gpufleet_module_code_cache.py")
            # site runs an "import" line of a .pth file at every start of the node's Python.
            (site / "gpufleet-module-code-cache.pth").write_text(
                "import gpufleet_module_code_cache as c; c.install(%r)\n" % MODULE_CODE_MOUNT)

    def _boot(self, node):
        argv = ["systemd-nspawn", "--quiet", "--boot", "--register=no", "--keep-unit",
                "--directory=%s" % node.merged, "--machine=%s" % node.name,
                "--network-namespace-path=/run/netns/%s" % node.netns, "--private-users=no",
                "--resolv-conf=off", "--timezone=off", "--link-journal=no",
                # read-only: /dev/console is a pty whose output (boot status, the forwarded journal) is the log
                "--console=%s" % os.environ.get("GPUFLEET_TESTFLEET_CONSOLE", "read-only"),
                "--setenv=SYSTEMD_COLORS=0",
                "--bind-ro=%s:%s" % (self.apt_dir, APT_MOUNT)]
        argv += ["--bind-ro=%s:%s" % (host, inside) for host, inside in self.binds]
        if _module_code_cache_on():
            MODULE_CODE_CACHE.mkdir(parents=True, exist_ok=True)
            argv += ["--bind=%s:%s" % (MODULE_CODE_CACHE, MODULE_CODE_MOUNT)]
        if os.environ.get("GPUFLEET_TESTFLEET_HOLD_BOOT") == "1":  # tests: the boot stops itself before systemd-nspawn
            argv = ["sh", "-c", 'kill -STOP $$; exec "$@"', "gpufleet-held-boot"] + argv
        # A reboot inside the node (ansible.builtin.reboot: the repair ladder's rung) ends systemd-nspawn --keep-unit
        # with 133, the status systemd-nspawn@.service restarts on (RestartForceExitStatus=133): this loop boots the
        # node again the same way; any other end (power off, kill_node, down) ends the loop.
        argv = ["sh", "-c", 'while :; do "$@"; rc=$?; [ "$rc" -eq 133 ] || exit "$rc"; '
                'echo "=== $(date "+%F %T") rebooted from inside: booting again"; done', "gpufleet-node-boot"] + argv
        log = open(node.log, "ab")
        log.write(("\n=== %s boot: %s\n" % (time.strftime("%F %T"), shlex.join(argv))).encode())
        log.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self._procs[node.name] = proc
        node.nspawn_pid = proc.pid
        node.pid1 = None
        self._save()

    def _wait_ready(self, node, deadline):
        """Bounded wait: PID 1 appears, TCP 22 answers, then `ssh true` succeeds."""
        stage = "container init (PID 1)"
        while time.monotonic() < deadline:
            proc = self._procs.get(node.name)
            if proc is not None and proc.poll() is not None:
                raise FleetError("node %s: systemd-nspawn exited with rc=%s before sshd was ready. Console log %s:\n%s"
                                 % (node.name, proc.returncode, node.log, tail(node.log)))
            if node.pid1 is None:
                node.pid1 = container_pid1(node.netns)
                if node.pid1 is not None:
                    self._save()
                    stage = "sshd on %s:22" % node.ip
            elif stage.startswith("sshd"):
                with contextlib.suppress(OSError), socket.create_connection((node.ip, 22), timeout=1):
                    stage = "ssh login as root"
            else:
                if self.ssh(node.name, "true", timeout=10, check=False).returncode == 0:
                    return
            time.sleep(0.2)
        raise FleetError("node %s: not ready within %.0f s, stuck at: %s. Console log %s (tail):\n%s"
                         % (node.name, self.boot_timeout_s, stage, node.log, tail(node.log)))

    def _wait_all_ready(self, nodes=None):
        deadline = time.monotonic() + self.boot_timeout_s
        for node in nodes or self.nodes:
            self._wait_ready(node, deadline)

    # operations for tests -----------------------------------------------------------------------------------------
    def ssh_argv(self, name, *, batch=True):
        node = self.node(name)
        return ["ssh", "-i", str(self.key_path), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR", "-o", "BatchMode=%s" % ("yes" if batch else "no"), "-o", "ConnectTimeout=5",
                "-o", "ControlMaster=no", "-o", "ControlPath=none", "root@" + node.ip]

    def ssh(self, name, cmd, timeout=60, check=True, input=None):
        """Run a shell command on a node as root over ssh; returns CompletedProcess (text)."""
        proc = subprocess.run(self.ssh_argv(name) + [cmd], capture_output=True, text=True, timeout=timeout,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise FleetError("node %s: `%s` failed (rc=%s): %s" % (name, cmd, proc.returncode,
                                                                  (proc.stderr or proc.stdout)[-1500:]))
        return proc

    def kill_node(self, name):
        """Power loss: SIGKILL the container's PID 1; every process of the node dies, its TCP connections reset."""
        node = self.node(name)
        pid1 = node.pid1 if self._is_pid1_of(node, node.pid1) else container_pid1(node.netns)
        if pid1 is None:
            raise FleetError("node %s: no running PID 1 found in netns %s" % (name, node.netns))
        _kill(pid1)
        _wait_gone(lambda: not [p for p in netns_pids(node.netns) if not _is_zombie(p)], 10)
        self._reap(node)
        node.pid1 = None
        self._save()

    def cut_link(self, name):
        """Pull the cable: the node keeps running but its packets go nowhere (no RST, so ssh must time out)."""
        _run(["ip", "link", "set", self.node(name).veth_host, "down"])

    def restore_link(self, name, wait_s=30):
        """Plug the cable back and wait until the node answers on port 22 again (up to wait_s)."""
        node = self.node(name)
        _run(["ip", "link", "set", node.veth_host, "up"])
        # While the link was down the neighbour entry went FAILED: connecting now gives "No route to host" until the
        # kernel probes again. Forget it so the next packet resolves the address afresh.
        subprocess.run(["ip", "neigh", "flush", "to", node.ip], capture_output=True)
        deadline = time.monotonic() + wait_s
        while wait_s and time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((node.ip, 22), timeout=1):
                return
            time.sleep(0.5)

    def restart_node(self, name):
        """Boot a node again on its existing overlay (after kill_node, or to recover a wedged one)."""
        node = self.node(name)
        if self._is_pid1_of(node, node.pid1) or container_pid1(node.netns):
            self.kill_node(name)
        self.restore_link(name, wait_s=0)  # not booted yet: _wait_all_ready below waits for sshd
        self._boot(node)
        self._wait_all_ready([node])

    def write_inventory(self, groups=("gpufleet_testfleet",)):
        """YAML inventory (JSON is valid YAML) with connection vars per host, so any group layout can include them."""
        common = " ".join(["-o StrictHostKeyChecking=no", "-o UserKnownHostsFile=/dev/null", "-o LogLevel=ERROR",
                           "-o ControlPath=%s/%%C" % self.control_dir])
        hosts = {n.name: {"ansible_host": n.ip, "ansible_user": "root",
                          "ansible_ssh_private_key_file": str(self.key_path),
                          "ansible_python_interpreter": "/usr/bin/python3",
                          "ansible_ssh_common_args": common} for n in self.nodes}
        inv = {"all": {"children": {g: {"hosts": {h: {} for h in hosts}} for g in groups}, "hosts": hosts}}
        self.inventory_path.write_text("# kentino.gpufleet test fleet %s (written by tests/fleet/harness.py)\n%s\n"
                                       % (self.dir, json.dumps(inv, indent=2)))
        return self.inventory_path

    # down ---------------------------------------------------------------------------------------------------------
    def _is_pid1_of(self, node, pid):
        """Guard against PID reuse when `down` runs from an old state file: the PID must live in the node's netns."""
        ino = netns_inode(node.netns)
        if pid is None or ino is None or not _alive(pid):
            return False
        try:
            return os.readlink("/proc/%d/ns/net" % pid) == "net:[%d]" % ino
        except OSError:
            return False

    def _boot_processes(self, node):
        """The node's boot loop and its systemd-nspawn, found by the node's directory in their command line.

        Not by the recorded PID alone: an `up` killed between starting a node and saving its PID leaves a boot that
        the state file does not name."""
        marker = "--directory=%s" % node.merged
        return {pid: cmd for pid, cmd in processes_with(marker).items() if marker + " " in cmd + " "}

    def _reap(self, node):
        # The loop first (it would boot the node again), then systemd-nspawn, which ends its container on SIGTERM.
        boots = self._boot_processes(node)
        for pid, cmd in boots.items():
            if cmd.startswith("sh "):
                _kill(pid)
        for pid in boots:
            _kill(pid, signal.SIGTERM)
        if not _wait_gone(lambda: not self._boot_processes(node), 5):
            for pid in self._boot_processes(node):
                _kill(pid)
        proc = self._procs.pop(node.name, None)
        if proc is not None:  # started by this process: collect its exit
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        # A container that systemd-nspawn started after `down` looked for it outlives a killed systemd-nspawn.
        pid1 = container_pid1(node.netns)
        if pid1:
            _kill(pid1)
            _wait_gone(lambda: not [p for p in netns_pids(node.netns) if not _is_zombie(p)], 15)

    def _close_control_masters(self):
        cp = self.control_dir
        if cp.is_dir():
            for sock in cp.iterdir():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    subprocess.run(["ssh", "-o", "ControlPath=%s" % sock, "-O", "exit", "gpufleet-testfleet"],
                                   capture_output=True, timeout=5)
        # Masters whose link was cut may ignore -O exit while blocked: end every ssh process using our control dir.
        for pid, cmd in processes_with(str(cp) + "/").items():
            if cmd.startswith("ssh"):
                _kill(pid)
        if cp.is_dir():
            for sock in cp.iterdir():
                with contextlib.suppress(OSError):
                    sock.unlink()

    def _atexit_down(self):
        if self.state_path.exists() and not self._state.get("down"):
            with contextlib.suppress(Exception):
                self.down()

    def down(self, purge=False):
        """Remove everything the state file records. Idempotent; returns the list of problems (empty when clean)."""
        problems = []
        self._close_control_masters()
        for node in self.nodes:
            pid1 = node.pid1 if self._is_pid1_of(node, node.pid1) else container_pid1(node.netns)
            if pid1:
                _kill(pid1)
        for node in self.nodes:
            if not _wait_gone(lambda n=node: not [p for p in netns_pids(n.netns) if not _is_zombie(p)], 15):
                left = netns_pids(node.netns)
                for pid in left:  # e.g. an `ip netns exec` helper a test left behind
                    _kill(pid)
                if not _wait_gone(lambda n=node: not [p for p in netns_pids(n.netns) if not _is_zombie(p)], 5):
                    problems.append("node %s: processes %s still in netns %s" % (node.name, left, node.netns))
            self._reap(node)
            node.pid1 = None
            if str(node.merged) in overlay_mounts():
                if _run(["umount", str(node.merged)], check=False).returncode != 0:
                    _run(["umount", "-l", str(node.merged)], check=False)
            if str(node.merged) in overlay_mounts():
                problems.append("node %s: overlay still mounted at %s" % (node.name, node.merged))
            node.mounted = False
            if Path("/sys/class/net", node.veth_host).exists():
                _run(["ip", "link", "del", node.veth_host], check=False)
            if netns_inode(node.netns) is not None:
                res = _run(["ip", "netns", "del", node.netns], check=False)
                if res.returncode != 0:
                    problems.append("node %s: ip netns del %s: %s" % (node.name, node.netns, res.stderr.strip()))
            if purge:
                shutil.rmtree(node.dir, ignore_errors=True)
            else:  # keep the console log for post-mortems, drop the (large) overlay dirs
                for sub in ("upper", "work", "merged"):
                    shutil.rmtree(Path(node.dir) / sub, ignore_errors=True)
        if self._state.get("bridge_created") and Path("/sys/class/net", self.bridge).exists():
            res = _run(["ip", "link", "del", self.bridge], check=False)
            if res.returncode != 0:
                problems.append("bridge %s: %s" % (self.bridge, res.stderr.strip()))
        reg = REGISTRY / (self.prefix + ".dir")
        with contextlib.suppress(OSError):
            if reg.read_text().strip() == str(self.dir):
                reg.unlink()
        self._state["down"] = True
        self._state["down_problems"] = problems
        if self.dir.is_dir():
            self._save()
            if purge:
                shutil.rmtree(self.dir, ignore_errors=True)
        return problems

    def leftovers(self):
        """What of this fleet still exists on the host (for tests asserting a clean teardown)."""
        out = []
        netns = _run(["ip", "netns", "list"], check=False).stdout
        for node in self.nodes:
            if node.netns in netns.split():
                out.append("netns " + node.netns)
            if Path("/sys/class/net", node.veth_host).exists():
                out.append("veth " + node.veth_host)
            if str(node.merged) in overlay_mounts():
                out.append("mount " + str(node.merged))
        if Path("/sys/class/net", self.bridge).exists():
            out.append("bridge " + self.bridge)
        marker = str(self.dir) + "/"
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid() or _is_zombie(int(entry)):
                continue
            cmd = _cmdline(int(entry))
            try:  # a container process has its root inside a node's merged dir
                root = os.readlink("/proc/%s/root" % entry)
            except OSError:
                root = ""
            if marker in cmd or (root + "/").startswith(marker):
                out.append("process %s (root %s): %s" % (entry, root, cmd[:200]))
        return out


def registered_fleets():
    """{prefix: dir} of fleets that are up (or were left by a crash) on this host."""
    out = {}
    if REGISTRY.is_dir():
        for reg in REGISTRY.glob("*.dir"):
            out[reg.stem] = reg.read_text().strip()
    return out
