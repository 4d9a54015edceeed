"""The simulated node's checkpoint drive: how fast it writes and reads comes from the scenario, not from this machine.

A checkpoint write test is real file I/O: on a simulated node the bytes land on this machine's disk, shared with every
other simulated node, the controller and whatever else runs here, so the rate a module measures would be this
machine's at that moment (the same node measured 453 MB/s on a quiet machine and 70 MB/s on a busy one). The drive
the scenario describes is what the simulated node has instead:

    "storage": {"checkpoint": {"write_mb_per_s": 2000, "read_mb_per_s": 3000}}   (the defaults below)

How: sim/site/sitecustomize.py, which only the simulated nodes' environment puts on PYTHONPATH, calls install() when
a process starts on a simulated node. install() wraps os.open, os.close, os.write, os.read and time.monotonic. While
a file descriptor opened on the node's checkpoint directory (or in it) is open, the process's monotonic clock
advances by the time the scenario's drive takes for the bytes written and read through such descriptors (bytes /
speed), and not at all otherwise: neither this machine's disk nor the CPU time other processes take from this one
shows. After the last of them is closed, the first look at the clock still sees the drive's time (a write test
closes its file, then syncs the directory, then reads the clock); from then on the clock runs at the real rate
again, continuing from where it was (never backwards). The bytes are still written, synced, read back and compared
for real.

A module cannot tell this from a drive of that speed: it times its own os.write/os.fsync/os.read calls with
time.monotonic, as on a real node. The collection never imports this file; files opened with the built-in open()
(not os.open) and other clocks (time.time, perf_counter) are not simulated.
"""

import _thread
import os
import sys
import time

ENV_STATE = "GPUFLEET_SIM_STATE"
ENV_SCENARIO = "GPUFLEET_SIM_SCENARIO"
# A single stream with fsync to the default nvme1 (a PCIe 4 data-centre NVMe) through ext4.
DEFAULT_WRITE_MB_PER_S = 2000.0
DEFAULT_READ_MB_PER_S = 3000.0
MB = 1000 * 1000


def speeds(scenario):
    """(write, read) MB/s of the scenario's checkpoint drive; a value that is not a positive number is an error."""
    ckpt = ((scenario or {}).get("storage") or {}).get("checkpoint") or {}
    out = []
    for key, default in (("write_mb_per_s", DEFAULT_WRITE_MB_PER_S), ("read_mb_per_s", DEFAULT_READ_MB_PER_S)):
        value = ckpt.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError("storage.checkpoint.%s must be a number > 0 (MB/s), got %r" % (key, value))
        out.append(float(value))
    return tuple(out)


def on_drive(directory, path):
    """Whether path is the drive's directory (a realpath) or inside it."""
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return real == directory or real.startswith(directory + os.sep)


class Drive:
    """The clock and the descriptors of one process (the wrapped functions call into it)."""

    def __init__(self, directory, write_mb_per_s, read_mb_per_s, real_clock=time.monotonic):
        self.directory = os.path.realpath(directory)
        self.write_s_per_byte = 1.0 / (write_mb_per_s * MB)
        self.read_s_per_byte = 1.0 / (read_mb_per_s * MB)
        self.real = real_clock
        self.fds = set()
        self.offset = 0.0  # outside a session: clock = real - offset
        self.session = None  # [clock at the session's start, drive seconds since]
        self.lock = _thread.allocate_lock()

    def clock(self):
        with self.lock:
            if self.session is None:
                return self.real() - self.offset
            value = self.session[0] + self.session[1]
            if not self.fds:  # the session's last look: the real rate resumes from here
                self.offset = self.real() - value
                self.session = None
            return value

    def on_drive(self, path):
        return on_drive(self.directory, path)

    def opened(self, fd):
        with self.lock:
            if self.session is None:
                self.session = [self.real() - self.offset, 0.0]
            self.fds.add(fd)

    def closed(self, fd):
        with self.lock:
            self.fds.discard(fd)

    def moved(self, fd, count, per_byte):
        with self.lock:
            if fd in self.fds and self.session is not None and count > 0:
                self.session[1] += count * per_byte


def install(environ=None):
    """Wrap os and time for the simulated node of this environment; returns the Installed wrapper state, or None when
    this process is not on a simulated node (no state directory or scenario in the environment).

    Every Python process of a node starts here, and most (the stand-ins, most module runs) never touch the drive: the
    scenario is read, and the Drive made, at the first descriptor opened on the drive. Until then the wrappers pass
    through and the clock is the real one (the Drive's clock starts as the real one too). A bad speed in the scenario
    is then said by the process that would use it, which measures this machine's disk instead."""
    env = os.environ if environ is None else environ
    state, spec = env.get(ENV_STATE), env.get(ENV_SCENARIO)
    if not state or not spec:
        return None
    inst = Installed(os.path.join(state, "checkpoint"), spec)
    real_open, real_close, real_write, real_read = os.open, os.close, os.write, os.read

    def sim_open(path, flags, mode=0o777, *, dir_fd=None):
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if dir_fd is None and on_drive(inst.directory, path):
            drive = inst.drive()
            if drive is not None:
                drive.opened(fd)
        return fd

    def sim_close(fd):
        try:
            real_close(fd)
        finally:
            if inst.made:
                inst.made.closed(fd)

    def sim_write(fd, data):
        count = real_write(fd, data)
        if inst.made:
            inst.made.moved(fd, count, inst.made.write_s_per_byte)
        return count

    def sim_read(fd, n):
        data = real_read(fd, n)
        if inst.made:
            inst.made.moved(fd, len(data), inst.made.read_s_per_byte)
        return data

    def sim_monotonic():
        return inst.made.clock() if inst.made else inst.real_clock()

    os.open, os.close, os.write, os.read = sim_open, sim_close, sim_write, sim_read
    time.monotonic = sim_monotonic
    return inst


class Installed:
    """What install() wrapped: the drive's directory and scenario, and the Drive once a descriptor opened on it."""

    def __init__(self, directory, spec):
        self.directory = os.path.realpath(directory)
        self.spec = spec
        self.made = None  # the Drive; False when the scenario's speeds could not be read
        self.real_clock = time.monotonic  # taken before install() replaces it

    def drive(self):
        if self.made is None:
            try:
                import json

                from .scenario import resolve_path

                with open(resolve_path(self.spec)) as fh:
                    write, read = speeds(json.load(fh))
                self.made = Drive(self.directory, write, read, real_clock=self.real_clock)
            except Exception as exc:  # never stop the process that opened the file
                sys.stderr.write("gpufleet-sim: the simulated checkpoint drive is off: %s\n" % exc)
                self.made = False
        return self.made or None
