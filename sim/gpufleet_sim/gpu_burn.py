"""Stand-in for wilicc/gpu-burn: the same argument quirks, output shapes and traps (docs/signals.md section 5).

Time is compressed: `gpu_burn 600` burns for 600 * GPUFLEET_SIM_TIME_SCALE real seconds but reports 600. While it
runs, the node is "under load" for nvidia-smi; scenario events scheduled at a burn fraction fire (a GPU falls off the
bus: XID 79 in the kernel log, DIED! here, lost in nvidia-smi). Like the real tool it exits 0 even with FAULTY GPUs.
"""

import os
import signal
import sys
import time

from . import events, fabric, nvidia_smi
from .gpu import View

OPS_PER_MUL = 1100048498688
EINVAL, ENODEV, ENOMEDIUM = 22, 19, 123


def cuda_devices(node, lost):
    """GPUs the CUDA runtime enumerates: lost ones vanish; CUDA_VISIBLE_DEVICES filters and renumbers from 0."""
    alive = [g for g in node.gpus if g["index"] not in lost]
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return alive
    out = []
    for token in spec.split(","):
        token = token.strip()
        match = None
        if token.isdigit():
            i = int(token)
            match = alive[i] if i < len(alive) else None
        elif token.startswith("GPU-"):
            match = next((g for g in alive if g["uuid"].startswith(token)), None)
        if match is None:
            break  # CUDA stops at the first invalid entry
        if match not in out:
            out.append(match)
    return out


def parse_args(argv):
    opts = {"doubles": False, "tensor": False, "mem": 0, "device": -1, "compare": None, "stts": 30, "time": None,
            "help": False, "list": False, "error": None}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-h"):
            opts["help"] = True
        elif a == "-l":
            opts["list"] = True
        elif a == "-d":
            opts["doubles"] = True
        elif a == "-tc":
            opts["tensor"] = True
        elif a.startswith("-m"):
            raw = a[2:] or (argv[i + 1] if i + 1 < len(argv) else "")
            if not a[2:]:
                i += 1
            opts["mem"] = _decode_mem(raw)
            if opts["mem"] == 0:
                opts["error"] = "Syntax error near -m"
        elif a.startswith("-i"):
            raw = a[2:] or (argv[i + 1] if i + 1 < len(argv) else None)
            if not a[2:]:
                i += 1
            if raw is None:
                opts["error"] = "Syntax error near -i"
            else:
                opts["device"] = _atoi(raw)
        elif a.startswith("-stts"):
            i += 1
            opts["stts"] = _atoi(argv[i]) if i < len(argv) else 30
        elif a.startswith("-c"):
            i += 1
            opts["compare"] = argv[i] if i < len(argv) else None
        else:
            opts["time"] = _atoi(a)
        i += 1
    return opts


def _atoi(text):
    digits = ""
    for ch in text.strip():
        if ch.isdigit() or (ch == "-" and not digits):
            digits += ch
        else:
            break
    try:
        return int(digits)
    except ValueError:
        return 0


def _decode_mem(text):
    """'-m 50%' -> -50 (percent), '-m 4096' -> MiB as bytes; 0 on a syntax error (as decodeUSEMEM)."""
    if text.endswith("%") and text[:-1].isdigit():
        return -int(text[:-1])
    if text.isdigit():
        return int(text) * 1024 * 1024
    return 0


HELP = """GPU Burn
Usage: gpu-burn [OPTIONS] [TIME]

-m X\tUse X MB of memory.
-m N%\tUse N% of the available GPU memory.  Default is 90%
-d\tUse doubles
-tc\tTry to use Tensor cores
-l\tLists all GPUs in the system
-i N\tExecute only on GPU N
-c FILE\tUse FILE as compare kernel.  Default is compare.ptx
-stts T\tSet timeout threshold to T seconds for using SIGTERM to abort child processes before using SIGKILL.  Default is 30
-h\tShow this help message

Examples:
  gpu-burn -d 3600 # burns all GPUs with doubles for an hour
  gpu-burn -m 50% # burns using 50% of the available GPU memory
  gpu-burn -l # list GPUs
  gpu-burn -i 2 # burns only GPU of index 2
"""


class _Terminated(Exception):
    pass


def _on_term(signum, frame):
    raise _Terminated()


def main(node, argv, out=sys.stdout, err=sys.stderr):
    opts = parse_args(argv)
    if opts["help"]:
        out.write(HELP)
        return 0
    if opts["error"]:
        err.write(opts["error"] + "\n")
        return EINVAL
    lost = node.lost()
    devices = cuda_devices(node, lost)
    if opts["list"]:
        if not devices:
            err.write("terminate called after throwing an instance of 'std::runtime_error'\n"
                      "  what():  No CUDA capable GPUs found.\n\n")
            return 134
        for i, g in enumerate(devices):
            out.write("ID %i: %s, %dMB\n" % (i, g["name"], g["memory_total_mib"] * 1024 * 1024 // 1000 // 1000))
        return 0
    run_s = opts["time"]
    if run_s is None:
        out.write("Run length not specified in the command line. ")
        run_s = 10
    out.write("Using compare file: %s\n" % (opts["compare"] or "compare.ptx"))
    out.write("Burning for %d seconds.\n" % run_s)
    out.flush()
    # The real tool runs system("nvidia-smi -L") here: its output (or its lost-GPU errors) lands in our stdout.
    nvidia_smi.list_gpus(node, nvidia_smi.Args(), out)
    out.flush()
    if not devices:
        err.write("Couldn't init CUDA: no CUDA-capable device is detected\nNo CUDA devices\n")
        return ENODEV
    if not fabric.ready(node):
        err.write("Couldn't init CUDA: Error (gpu_burn-drv.cpp:304): %s\n" % fabric.NOT_READY)
        return ENODEV
    if opts["device"] > -1:
        if opts["device"] >= len(devices):
            err.write("Couldn't init a GPU test: Error (gpu_burn-drv.cpp:121): invalid device ordinal\n")
            err.write("\n\nNo clients are alive!  Aborting\n")
            return ENOMEDIUM
        workers = [(opts["device"], devices[opts["device"]])]
    else:
        workers = list(enumerate(devices))
    return Burn(node, opts, run_s, workers, out, err).run()


class Burn:
    def __init__(self, node, opts, run_s, workers, out, err):
        self.node, self.opts, self.run_s, self.workers, self.out, self.err = node, opts, run_s, workers, out, err
        self.cfg = node.scen["gpu_burn"]
        n = len(workers)
        self.calcs = [0] * n
        self.errors = [0] * n
        self.faulty = [False] * n
        self.gflops = [0.0] * n
        self.dead = [False] * n
        self.inited = [True] * n
        self.carry = [0.0] * n

    def _init_workers(self):
        view = View(self.node)
        compare_missing = self.opts["compare"] is not None and not os.path.exists(self.opts["compare"])
        init_fail = set(int(x) for x in self.cfg.get("init_fail_gpus", []))
        for w, (cuda_idx, g) in enumerate(self.workers):
            if compare_missing or g["index"] in init_fail:
                reason = ("couldn't find compare kernel: %s" % self.opts["compare"] if compare_missing
                          else "init")
                self.err.write("Couldn't init a GPU test: Error in %s (gpu_burn-drv.cpp:226): %s\n"
                               % (reason, "file not found" if compare_missing else "out of memory"))
                self.inited[w] = False
                continue
            others = sum(p[2] for p in view.processes(g))
            avail = g["memory_total_mib"] - g["memory_reserved_mib"] - others
            mem = self.opts["mem"]
            use = int(avail * 0.9) if mem == 0 else (int(avail * -mem / 100.0) if mem < 0 else mem // (1024 * 1024))
            result = (8 if self.opts["doubles"] else 4) * 8192 * 8192
            iters = max(0, (use * 1024 * 1024 - 2 * result) // result)
            self.out.write("Initialized device %d with %d MB of memory (%d MB available, using %d MB of it), %s%s\n"
                           % (cuda_idx, g["memory_total_mib"], avail, use,
                              "using DOUBLES" if self.opts["doubles"] else "using FLOATS",
                              ", using Tensor Cores" if self.opts["tensor"] else ""))
            self.out.write("Results are %d bytes each, thus performing %d iterations\n" % (result, iters))
        self.out.flush()
        return compare_missing

    def _rate(self, w, g, view):
        base = g["gflops_tensor"] if self.opts["tensor"] else g["gflops"]
        if self.opts["doubles"]:
            base *= 0.5
        if view.foreign_apps(g):
            base *= 0.55  # a neighbour process shares the SMs
        base *= float(self.node.scen["gpus"].get(str(g["index"]), {}).get("burn_speed", 1.0))
        wobble = ((int(view.now * 10) * 7 + w * 13) % 21 - 10) / 1000.0
        return base * (1 + wobble)

    def run(self):
        signal.signal(signal.SIGTERM, _on_term)
        compare_missing = self._init_workers()
        scale = self.node.scale
        start = time.time()
        real_len = self.run_s * scale
        gpu_idx = [g["index"] for w, (_c, g) in enumerate(self.workers) if self.inited[w]]
        self.node.add_load(gpu_idx, start, start + real_len + 0.5, "gpu_burn",
                           process_name=os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "gpu_burn")
        try:
            if compare_missing:
                return self._all_died_at_start()
            return self._loop(start, real_len, gpu_idx)
        except _Terminated:
            return 143
        finally:
            self.node.remove_load()

    def _all_died_at_start(self):
        self.calcs = [-1] * len(self.workers)
        self.errors = [-1] * len(self.workers)
        self._frame(0.0, View(self.node), temps_known=False)
        self.err.write("\n\nNo clients are alive!  Aborting\n")
        return ENOMEDIUM

    def _loop(self, start, real_len, gpu_idx):
        """One frame per fixed step of the burn's clock. A stand-in the machine starved for a while catches up by
        printing the frames it missed at once: the frames, their percentages and the frame a fault fires in are the
        same on a busy machine as on a quiet one (a verdict must not depend on the controller's load)."""
        scale = self.node.scale
        frame_dt = max(0.02, min(0.25, real_len / 150.0))
        next_report = 10.0
        pending = events.pending(self.node, gpu_idx)
        last = start
        frame_no = 0
        while True:
            frame_no += 1
            now = start + frame_no * frame_dt
            if now > time.time():
                time.sleep(max(0.0, now - time.time()))
            sim_elapsed = (now - start) / scale
            elapsed_pct = min(100.0, float(int(sim_elapsed)) / self.run_s * 100.0) if self.run_s > 0 else 100.0
            for ev_id, ev, targets in list(pending):
                if elapsed_pct >= float(ev.get("at", {}).get("burn_fraction", 0.5)) * 100.0:
                    pending.remove((ev_id, ev, targets))
                    gone = events.fire(self.node, ev_id, ev, targets, when=now)
                    self._apply(ev, targets, gone)
            view = View(self.node, now)
            dt_sim = (now - last) / scale
            last = now
            for w, (_c, g) in enumerate(self.workers):
                if not self.inited[w] or self.dead[w]:
                    continue
                gf = self._rate(w, g, view)
                self.carry[w] += gf * 1e9 * dt_sim / OPS_PER_MUL
                done = int(self.carry[w])
                self.carry[w] -= done
                self.calcs[w] += done
                self.gflops[w] = gf
            # The first frames come before the first nvidia-smi temperature poll answers: "-- " like the real tool.
            self._frame(elapsed_pct, view, temps_known=frame_no > 2)
            for w in range(len(self.workers)):
                if self.errors[w]:
                    self.faulty[w] = True
            if next_report < elapsed_pct:
                next_report = elapsed_pct + 10.0
                self.out.write("\n\tSummary at:   ")
                self.out.write(time.strftime("%a %b %e %H:%M:%S %Z %Y", time.localtime(now)) + "\n")
                self.out.write("\n")
                self.out.flush()
                self.errors = [-1 if self.dead[w] else 0 for w in range(len(self.workers))]
            if self.workers and all(self.dead[w] for w in range(len(self.workers))):
                self.err.write("\n\nNo clients are alive!  Aborting\n")
                return ENOMEDIUM
            if sim_elapsed > self.run_s:
                break
        return self._finish()

    def _apply(self, ev, targets, gone):
        by_index = {g["index"]: w for w, (_c, g) in enumerate(self.workers)}
        for idx in gone:
            w = by_index.get(idx)
            if w is not None and self.inited[w] and not self.dead[w]:
                self.err.write("Failure during compute: Error in Record event (gpu_burn-drv.cpp:297): unknown error\n")
                self.dead[w] = True
                self.calcs[w] = -1
                self.errors[w] += -1
        if ev.get("kind") == "errors":
            for idx in targets:
                w = by_index.get(idx)
                if w is not None and not self.dead[w]:
                    self.errors[w] += int(ev.get("count", 1))

    def _frame(self, pct, view, temps_known):
        n = len(self.workers)
        parts = ["\r%.1f%%  " % pct, "proc'd: "]
        for w in range(n):
            parts.append("%d (%.0f Gflop/s) " % (self.calcs[w], self.gflops[w] if not self.dead[w] else 0.0))
            if w != n - 1:
                parts.append("- ")
        parts.append("  errors: ")
        for w in range(n):
            note = "%d " % self.errors[w]
            if self.calcs[w] == -1:
                note += " (DIED!)"
            elif self.errors[w]:
                note += " (WARNING!)"
            parts.append(note)
            if w != n - 1:
                parts.append("- ")
        parts.append("  temps: ")
        for w, (_c, g) in enumerate(self.workers):
            t = view.temperature_c(g) if temps_known and g["index"] not in view.lost else 0
            parts.append("%d C " % t if t else "-- ")
            if w != n - 1:
                parts.append("- ")
        if self.cfg.get("power_column"):
            parts.append("  power: ")
            for w, (_c, g) in enumerate(self.workers):
                p = int(view.power_w(g)) if temps_known and g["index"] not in view.lost else 0
                parts.append("%d W " % p if p else "-- ")
                if w != n - 1:
                    parts.append("- ")
        self.out.write("".join(parts))
        self.out.flush()

    def _finish(self):
        self.out.write("\nKilling processes with SIGTERM (soft kill)\n")
        for w, (cuda_idx, _g) in enumerate(self.workers):
            if self.inited[w] and not self.dead[w]:
                self.out.write("Freed memory for dev %d\nUninitted cublas\n" % cuda_idx)
        self.out.flush()
        time.sleep(min(2.0, self.opts["stts"] * self.node.scale))
        self.out.write("done\n")
        self.out.write("\nTested %d GPUs:\n" % len(self.workers))
        for w in range(len(self.workers)):
            self.out.write("\tGPU %d: %s\n" % (w, "FAULTY" if self.faulty[w] else "OK"))
        self.out.flush()
        return 0
