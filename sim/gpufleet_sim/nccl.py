"""Stand-in for nccl-tests all_reduce_perf (docs/signals.md section 4): header, two title lines, one row per size, footer.

Bus bandwidth comes from the scenario (nccl.busbw_peak_gbps, else the model's single-node figure) and is limited by
the slowest PCIe link of the GPUs taking part *under load* on PCIe platforms: a GPU whose link trains down to Gen1 x4
under load (pcie_degraded) drags the whole ring down. Run under the sim's mpirun (OMPI_COMM_WORLD_SIZE) it reports
one rank per process; scenario nccl.mpi_noise puts Open MPI help messages inside the table (a real trap). Launched
by the sim's mpirun across two hosts (-H a:8,b:8) with a fabric (GPUFLEET_SIM_FABRIC), it is a two-node test: ranks
on both hosts, the bus bandwidth the fabric gives the pair (ib_fabric.py), or NCCL's remote error when a port flaps.
Across more hosts (-H a:8,b:8,c:8,...: the fabric search's bisection) it is one test over all of them
(ib_fabric.Fabric.group: the worst node, a crossed bad leaf, a leaf slow at scale).
Launched by a real Open MPI mpirun (PMIX_RANK set), every rank joins MPI (python3-mpi4py) and rank 0 gathers the
ranks' host names, as nccl-tests does; rank 0 alone prints, the others wait for it at a barrier. The two hosts of a
two-node test are then the ranks' real host names.
"""

import atexit
import os
import socket
import sys
import time

from . import fabric, ib_fabric
from .gpu import View
from .gpu_burn import cuda_devices

LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
TYPE_SIZES = {"int8": 1, "char": 1, "uint8": 1, "int32": 4, "int": 4, "uint32": 4, "int64": 8, "uint64": 8,
              "half": 2, "float16": 2, "float": 4, "float32": 4, "double": 8, "float64": 8, "bfloat16": 2, "bf16": 2}


def parse_size(text):
    text = text.strip()
    mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}
    if text and text[-1].upper() in mult:
        return int(float(text[:-1]) * mult[text[-1].upper()])
    return int(text)


def parse_args(argv):
    o = {"b": 32 * 1024 * 1024, "e": 32 * 1024 * 1024, "f": 1, "i": 1024 * 1024, "g": 1, "t": 1, "n": 20, "w": 5,
         "c": 1, "o": "sum", "d": "float", "m": 1, "G": 0, "error": None}
    longs = {"--minbytes": "b", "--maxbytes": "e", "--stepfactor": "f", "--stepbytes": "i", "--ngpus": "g",
             "--nthreads": "t", "--iters": "n", "--warmup_iters": "w", "--check": "c", "--op": "o",
             "--datatype": "d", "--agg_iters": "m", "--cudagraph": "G"}
    step_given = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, _, val = arg.partition("=")
        k = longs.get(key) or (key[1:] if key.startswith("-") and len(key) == 2 else None)
        if k is None:
            if key.startswith("-") and len(key) > 2 and key[1] in "befignwcodmtG":
                k, val = key[1], key[2:]
            else:
                o["error"] = "invalid option -- '%s'" % arg.lstrip("-")
                break
        if not val:
            i += 1
            val = argv[i] if i < len(argv) else ""
        try:
            if k in ("b", "e", "i"):
                o[k] = parse_size(val)
            elif k in ("o", "d"):
                o[k] = val
            else:
                o[k] = int(val)
        except ValueError:
            o["error"] = "invalid value %r for -%s" % (val, k)
            break
        if k in ("f", "i"):
            step_given = k
        i += 1
    if step_given is None:
        o["f"] = 1 if o["b"] == o["e"] else 2
    if step_given == "i":
        o["f"] = 0
    return o


def _sizes(o):
    sizes, size = [], o["b"]
    while size <= o["e"] and len(sizes) < 64:
        sizes.append(size)
        nxt = size * o["f"] if o["f"] > 1 else size + o["i"]
        if nxt <= size:
            break
        size = nxt
    return sizes


def _peak_busbw(node, view, gpus):
    peak = float(node.scen["nccl"].get("busbw_peak_gbps", node.model.get("busbw_gbps", 20.0)))
    if node.model.get("busbw_gbps", 0) <= 100:
        # PCIe platform: all traffic crosses the links, the slowest one (under load) sets the pace.
        slowest = min(LANE_GBPS.get(view.pcie_gen(g), 1.0) * view.pcie_width(g) for g in gpus)
        peak = min(peak, slowest * 0.78)
    if node.scen["nccl"].get("degraded_busbw_gbps") is not None and any(
            view.pcie_width(g) < g["pcie_width_max"] or view.pcie_gen(g) < g["pcie_gen_max"] for g in gpus):
        peak = min(peak, float(node.scen["nccl"]["degraded_busbw_gbps"]))
    if any(view.foreign_apps(g) for g in gpus):
        peak *= 0.9
    return peak


def _time_str(us):
    if us >= 100000:
        return "%7.0f" % us
    if us >= 10000:
        return "%7.1f" % us
    return "%7.2f" % us


def main(node, argv, out=sys.stdout, err=sys.stderr):
    o = parse_args(argv)
    host = node.hostname
    pid = os.getpid()
    if o["error"]:
        err.write("%s: %s\n" % (os.path.basename(sys.argv[0] if sys.argv else "all_reduce_perf"), o["error"]))
        return 1
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")) or 1)
    nranks = world * o["g"] * o["t"]
    hosts = [h for h in os.environ.get("GPUFLEET_SIM_MPI_HOSTS", "").split(",") if h]
    if world > 1 and "PMIX_RANK" in os.environ:
        gathered = _real_mpi_hosts()
        if gathered is None:
            err.write("gpufleet-sim all_reduce_perf: launched by a real mpirun it needs python3-mpi4py on every "
                      "node\n")
            return 2
        hosts, rank, done = gathered
        if rank != 0:  # nccl-tests prints from rank 0 only; the other ranks take part until it is done
            return done()
    devices = cuda_devices(node, node.lost())
    out.write(header(o))
    if not fabric.ready(node):
        out.flush()
        err.write("%s: Test CUDA failure common.cu:1011 '%s'\n .. %s pid %d: Test failure common.cu:891\n"
                  % (host, fabric.NOT_READY, host, pid))
        return 1
    multi_node = len(hosts) >= 2 and bool(os.environ.get("GPUFLEET_SIM_FABRIC"))
    per_host = max(1, nranks // len(hosts)) if multi_node else nranks
    if per_host > len(devices):
        out.flush()
        err.write("%s: Test CUDA failure common.cu:1011 'invalid device ordinal'\n .. %s pid %d: Test failure "
                  "common.cu:891\n" % (host, host, pid))
        return 1
    pair = None
    if multi_node:
        try:
            ib = ib_fabric.Fabric.load(os.environ["GPUFLEET_SIM_FABRIC"])
            test_id = os.environ.get("GPUFLEET_SIM_FABRIC_TEST") or time.time_ns()
            pair = ib.pair(hosts[0], hosts[1], test_id) if len(hosts) == 2 else ib.group(hosts, test_id)
        except (OSError, ValueError) as exc:
            err.write("%s: gpufleet-sim fabric %s: %s\n" % (host, os.environ["GPUFLEET_SIM_FABRIC"], exc))
            return 2
        gpus = devices[:per_host] * len(hosts)
        for r, g in enumerate(gpus):
            out.write(rank_line(r, pid + r, hosts[r // per_host], r % per_host, g["pci_xid"], g["name"]))
        if ib.hung & set(hosts):
            out.write(TITLES)
            out.flush()
            while True:  # a stuck collective: only the caller's timeout ends it
                time.sleep(60)
    else:
        gpus = devices[:nranks]
        for r, g in enumerate(gpus):
            out.write(rank_line(r, pid + (r // max(1, o["g"] * o["t"])), host, r, g["pci_xid"], g["name"]))
    out.write(TITLES)
    out.flush()
    start = time.time()
    sizes = _sizes(o)
    total_us = 0.0
    node.add_load(sorted(set(g["index"] for g in gpus)), start, start + 3600, "all_reduce_perf",
                  process_name=os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "all_reduce_perf")
    busbws = []
    try:
        view = View(node)
        if pair is None:
            peak = _peak_busbw(node, view, gpus)
        else:  # a flapping link runs at full speed until it drops
            peak = pair["busbw_gbps"] if pair["busbw_gbps"] is not None else ib.healthy_gbps()
        factor = 2.0 * (nranks - 1) / nranks if nranks > 1 else 0.0
        algbw_peak = peak / factor if factor else peak
        latency_us = 9.0 if node.model.get("busbw_gbps", 0) > 100 else 28.0
        for n, size in enumerate(sizes):
            line, busbw, t_us = row(o, n, size, algbw_peak, factor, latency_us)
            busbws.append(busbw)
            total_us += t_us
            if pair is not None and pair["error"] and n == len(sizes) // 2:
                out.flush()
                err.write("%s: Test NCCL failure common.cu:1006 '%s'\n .. %s pid %d: Test failure common.cu:891\n"
                          % (host, pair["error"], host, pid))
                return 1
            out.write(line)
            if node.scen["nccl"].get("mpi_noise") and world > 1 and n == len(sizes) // 2:
                out.write("[%s:%05d] %d more processes have sent help message help-mpi-btl-openib.txt / "
                          "no device params found\n" % (host, pid, world - 1))
                out.write("[%s:%05d] Set MCA parameter \"orte_base_help_aggregate\" to 0 to see all help / error "
                          "messages\n" % (host, pid))
            out.flush()
        # Compressed wall time for all the iterations, capped so a sweep to 8 GB stays a short test.
        time.sleep(min(3.0, total_us / 1e6 * node.scale))
        # A test that must catch the run in progress (a node killed during NCCL) holds it open this long.
        time.sleep(float(os.environ.get("GPUFLEET_SIM_NCCL_HOLD_S") or 0))
    finally:
        node.remove_load()
    text, verdict = footer(busbws)
    out.write(text)
    return 1 if verdict == "FAILED" else 0


def _real_mpi_hosts():
    """([distinct host of each rank, in rank order], this rank, done) under a real mpirun, None without mpi4py: the
    host names are gathered over MPI (MPI_Allgather, like nccl-tests' rank lines). done() waits at a barrier until
    rank 0 has finished (polling, so a waiting rank does not spin a CPU) and returns 0."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    names = comm.allgather(socket.gethostname())

    def done():
        request = comm.Ibarrier()
        while not request.Test():
            time.sleep(0.05)
        return 0
    if comm.Get_rank() == 0:
        atexit.register(done)  # rank 0 releases the others when it ends (hung: never)
    return list(dict.fromkeys(names)), comm.Get_rank(), done


def header(o):
    """The lines before the ranks: version, the options' line, "Using devices"."""
    return ("# nccl-tests version 2.13.11 nccl-headers=22304 nccl-library=22304\n"
            "# Collective test starting: all_reduce_perf\n"
            "# nThread %d nGpus %d minBytes %d maxBytes %d step: %d(%s) warmup iters: %d iters: %d agg iters: %d "
            "validation: %d graph: %d\n" % (o["t"], o["g"], o["b"], o["e"], o["f"] if o["f"] else o["i"],
                                            "factor" if o["f"] else "bytes", o["w"], o["n"], o["m"], o["c"], o["G"])
            + "#\n# Using devices\n")


def rank_line(rank, pid, host, device, pci, name):
    return "#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s] %s\n" % (rank, pid, host, device, pci, name)


TITLES = ("#\n"
          + "# %10s  %12s  %8s  %6s  %6s" % ("", "", "", "", "")
          + "           out-of-place                       in-place          \n"
          + "# %10s  %12s  %8s  %6s  %6s" % ("size", "count", "type", "redop", "root")
          + "  %7s  %6s  %6s  %6s" % ("time", "algbw", "busbw", "#wrong")
          + "  %7s  %6s  %6s  %6s\n" % ("time", "algbw", "busbw", "#wrong")
          + "# %10s  %12s  %8s  %6s  %6s" % ("(B)", "(elements)", "", "", "")
          + "  %7s  %6s  %6s  %6s" % ("(us)", "(GB/s)", "(GB/s)", "")
          + "  %7s  %6s  %6s  %6s\n" % ("(us)", "(GB/s)", "(GB/s)", ""))


def row(o, n, size, algbw_peak, factor, latency_us):
    """(data row, out-of-place busbw, time of all its iterations in us) of the n-th size."""
    count = size // TYPE_SIZES.get(o["d"], 4)
    cells, busbw_oop, total_us = [], 0.0, 0.0
    for place in (0, 1):
        wobble = 1.0 + (((n * 7 + place * 3) % 11) - 5) / 400.0
        t_us = (latency_us + size / (algbw_peak * 1e3)) * wobble
        algbw = size / t_us / 1e3
        busbw = algbw * factor
        busbw_oop = busbw if place == 0 else busbw_oop
        total_us += t_us * (o["n"] + o["w"])
        cells.append("  %s  %6.2f  %6.2f  %6s" % (_time_str(t_us), algbw, busbw, "0" if o["c"] else "N/A"))
    return "%12d  %12d  %8s  %6s  %6d" % (size, count, o["d"], o["o"], -1) + "".join(cells) + "\n", busbw_oop, total_us


def footer(busbws):
    """(the footer, OK/FAILED/"" of NCCL_TESTS_MIN_BW)."""
    avg = sum(busbws) / len(busbws) if busbws else 0.0
    min_bw = os.environ.get("NCCL_TESTS_MIN_BW")
    verdict = ""
    if min_bw:
        verdict = "FAILED" if avg < float(min_bw) * 0.9 else "OK"
    return ("# Out of bounds values : 0 OK\n# %-20s : %g %s\n" % ("Avg bus bandwidth", round(avg, 4), verdict)
            + "#\n# Collective test concluded: all_reduce_perf\n#\n\n"), verdict
