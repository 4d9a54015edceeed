"""Stand-in for perftest's ib_write_bw (client side) on a simulated node with a fabric (GPUFLEET_SIM_FABRIC).

`ib_write_bw -d mlx5_<rail> [-i 1] [-p <port>] [-s <bytes>] [--report_gbits] [-F] <server>` prints the real tool's
banner and result table (perftest_parameters.h formats) with the rail's figure between this node and <server>
(ib_fabric.rail_write); without a server it plays the server side (prints the banner and waits for nothing: the
simulated client computes both ends). The real tool's failures, on stderr with exit status 1: a node without
InfiniBand (no fabric, or not on it) " Did not detect devices", an unknown -d "IB device <name> not found", a server
SSH cannot reach (the fabric's `down`) "Couldn't connect to <server>:<port>" (18515 unless -p), a flapping port's
link lost during the test " Completion with error at client".
"""

import os
import sys
import time

from . import ib_fabric

LINE = "-" * 87 + "\n"
PORT = 18515


def _args(argv):
    opts = {"device": None, "size": 65536, "gbits": False, "server": None, "iters": 5000, "port": PORT}
    it = iter(argv)
    for arg in it:
        if arg in ("-d", "--ib-dev"):
            opts["device"] = next(it, None)
        elif arg.startswith("--ib-dev="):
            opts["device"] = arg.split("=", 1)[1]
        elif arg in ("-s", "--size"):
            opts["size"] = int(next(it, "65536"))
        elif arg in ("-n", "--iters"):
            opts["iters"] = int(next(it, "5000"))
        elif arg in ("-p", "--port"):
            opts["port"] = int(next(it, str(PORT)))
        elif arg in ("-i", "--ib-port", "-D", "--duration", "-x", "--gid-index", "-q", "--qp"):
            next(it, None)
        elif arg == "--report_gbits":
            opts["gbits"] = True
        elif not arg.startswith("-"):
            opts["server"] = arg
    return opts


def _banner(device):
    return (LINE + "                    RDMA_Write BW Test\n"
            " Dual-port       : OFF\t\tDevice         : %s\n"
            " Number of qps   : 1\t\tTransport type : IB\n"
            " Connection type : RC\t\tUsing SRQ      : OFF\n"
            " PCIe relax order: ON\n ibv_wr* API     : ON\n TX depth        : 128\n CQ Moderation   : 100\n"
            " Mtu             : 4096[B]\n Link type       : IB\n Max inline data : 0[B]\n rdma_cm QPs\t : OFF\n"
            " Data ex. method : Ethernet\n" % device + LINE)


def main(node, argv, out=sys.stdout, err=sys.stderr):
    opts = _args(argv)
    fabric = ib_fabric.Fabric.load(node.fabric_path) if node.fabric_path else None
    if fabric is None or node.hostname not in fabric.leaf_of:
        err.write(" Did not detect devices \n If device exists, check if driver is up\n"
                  " Unable to find the Infiniband/RoCE device\n")
        return 1
    devices = ["mlx5_%d" % r for r in range(fabric.rails)]
    device = opts["device"] or devices[0]
    if device not in devices:
        err.write("IB device %s not found\n Unable to find the Infiniband/RoCE device\n" % device)
        return 1
    server = opts["server"]
    if server is None:
        out.write("\n************************************\n* Waiting for client to connect... *\n"
                  "************************************\n")
        return 0
    if server in fabric.down or server not in fabric.leaf_of:
        err.write("Couldn't connect to %s:%d\n Unable to init the socket connection\n" % (server, opts["port"]))
        return 1
    test_id = os.environ.get("GPUFLEET_SIM_FABRIC_TEST") or time.time_ns()
    result = ib_fabric.rail_write(fabric, node.hostname, server, devices.index(device), test_id)
    out.write(_banner(device))
    if result["flapped"]:
        err.write(" Completion with error at client\n Failed status 12: wr_id 0 syndrom 0x81\n"
                  "scnt=128, ccnt=0\n Failed to complete run_iter_bw function successfully\n")
        return 1
    gbps = result["gbps"]
    value, unit = (gbps, "Gb") if opts["gbits"] else (gbps * 1e9 / 8 / 1048576, "MB")
    out.write(" #bytes     #iterations    BW peak[%s/sec]    BW average[%s/sec]   MsgRate[Mpps]\n" % (unit, unit))
    rate = gbps * 1e9 / 8 / opts["size"] / 1e6
    out.write(" %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n" % (
        opts["size"], opts["iters"], value * 1.0005, value, rate))
    out.write(LINE)
    return 0
