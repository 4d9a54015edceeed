"""The InfiniBand fabric between simulated nodes: per-node NIC rails, leaf switches, faults, run-to-run noise.

A fabric file (JSON; GPUFLEET_SIM_FABRIC names it for the stand-ins, the bench builds one in memory):
  {"rails": 8, "rail_gbps": 50.0, "noise": 0.03, "seed": 0,
   "leaves": {"<leaf>": ["<node>", ...]},
   "faults": [{"kind": "slow_nic", "node": n, "rail": r, "factor": 0.5},        the HCA trained at a lower rate
              {"kind": "bad_cable", "node": n, "rail": r, "factor": 0.6},       node <-> leaf cable: symbol errors,
                                                                                retransmits, lower throughput
              {"kind": "flapping_port", "node": n, "rail": r, "p_down": 0.5},   the link drops during a test
              {"kind": "bad_leaf", "leaf": l, "factor": 0.5},                   the leaf's uplinks to the spine
              {"kind": "scale_leaf", "leaf": l, "min_nodes": 6, "factor": 0.5}], the leaf slows only when a test
                                                                                has min_nodes of its nodes at once
   "down": [node, ...],   nodes SSH cannot reach: the stand-in mpirun fails to start its daemon there (Open MPI's error)
   "hung": [node, ...]}   nodes whose pair tests never finish (a stuck collective): the caller's timeout must end them
A two-node all_reduce over 8 rails runs every rail at once and waits for the slowest, so a pair's bus bandwidth is a
healthy rail's (rail_gbps x PAIR_EFFICIENCY) times the worst rail factor of either node, times a bad leaf's factor
when the pair crosses it (one end on it: a pair inside a leaf never touches its uplinks), times the noise: a normal
factor of standard deviation `noise`, seeded by (seed, test id, the pair) so a test is reproducible and every test
differs. A flapping port drops the link during a test with probability p_down: the test fails with NCCL's error.
"""

import json
import os
import random

# The share of a rail's line rate a healthy two-node all_reduce reaches as bus bandwidth.
PAIR_EFFICIENCY = 0.92
KINDS = {"slow_nic": ("node", "rail", "factor"), "bad_cable": ("node", "rail", "factor"),
         "flapping_port": ("node", "rail", "p_down"), "bad_leaf": ("leaf", "factor"),
         "scale_leaf": ("leaf", "min_nodes", "factor")}
# What NCCL prints when a peer's link goes away mid-collective (ncclRemoteError).
REMOTE_ERROR = "remote process exited or there was a network error"


class FabricError(ValueError):
    pass


class Fabric:
    def __init__(self, spec):
        self.rails = int(spec.get("rails", 8))
        self.rail_gbps = float(spec.get("rail_gbps", 50.0))
        self.noise = float(spec.get("noise", 0.03))
        self.seed = spec.get("seed", 0)
        self.leaf_of = {}
        for leaf, nodes in (spec.get("leaves") or {}).items():
            for node in nodes:
                if node in self.leaf_of:
                    raise FabricError("node %s is on leaf %s and on leaf %s" % (node, self.leaf_of[node], leaf))
                self.leaf_of[node] = leaf
        self.faults = list(spec.get("faults") or [])
        self.down = set(spec.get("down") or [])
        self.hung = set(spec.get("hung") or [])
        unknown = sorted((self.down | self.hung) - set(self.leaf_of))
        if unknown:
            raise FabricError("down/hung name nodes on no leaf: %s" % ", ".join(unknown))
        for fault in self.faults:
            need = KINDS.get(fault.get("kind"))
            if need is None or any(k not in fault for k in need):
                raise FabricError("fault %r: kinds are %s, each with %s" % (fault, ", ".join(KINDS), KINDS))
            if fault.get("leaf") is not None and fault["leaf"] not in set(self.leaf_of.values()):
                raise FabricError("fault %r names an unknown leaf" % (fault,))
            if fault.get("node") is not None and fault["node"] not in self.leaf_of:
                raise FabricError("fault %r names a node on no leaf" % (fault,))

    @classmethod
    def load(cls, path):
        with open(path) as f:
            return cls(json.load(f))

    def healthy_gbps(self):
        return self.rail_gbps * PAIR_EFFICIENCY

    def rail_factor(self, node, rail):
        factor = 1.0
        for fault in self.faults:
            if fault.get("node") == node and fault.get("rail") == rail and "factor" in fault:
                factor = min(factor, float(fault["factor"]))
        return factor

    def node_factor(self, node):
        return min(self.rail_factor(node, r) for r in range(self.rails))

    def path_factor(self, a, b):
        la, lb = self.leaf_of.get(a), self.leaf_of.get(b)
        if la == lb:
            return 1.0
        return min([1.0] + [float(f["factor"]) for f in self.faults
                            if f["kind"] == "bad_leaf" and f["leaf"] in (la, lb)])

    def group(self, nodes, test_id):
        """{"busbw_gbps", "error", "flapped"} of one all_reduce over many nodes at once (a bisection step): the worst
        node, a crossed bad leaf, a scale_leaf when the test has at least its min_nodes on that leaf, the noise."""
        nodes = sorted(nodes)
        rng = random.Random("%s:%s:group:%s" % (self.seed, test_id, ",".join(nodes)))
        flapped = [(f["node"], f["rail"]) for f in self.faults
                   if f["kind"] == "flapping_port" and f["node"] in nodes and rng.random() < float(f["p_down"])]
        if flapped:
            return {"busbw_gbps": None, "error": REMOTE_ERROR, "flapped": flapped}
        leaves = set(self.leaf_of.get(n) for n in nodes)
        factor = min(self.node_factor(n) for n in nodes)
        for fault in self.faults:
            on_leaf = sum(self.leaf_of.get(n) == fault.get("leaf") for n in nodes)
            if fault["kind"] == "bad_leaf" and len(leaves) > 1 and on_leaf:
                factor = min(factor, float(fault["factor"]))
            elif fault["kind"] == "scale_leaf" and on_leaf >= int(fault["min_nodes"]):
                factor = min(factor, float(fault["factor"]))
        return {"busbw_gbps": round(self.healthy_gbps() * factor * rng.gauss(1.0, self.noise), 2), "error": None,
                "flapped": []}

    def pair(self, a, b, test_id):
        """{"busbw_gbps": float or None, "error": str or None, "flapped": [(node, rail)]} of one pair test."""
        rng = random.Random("%s:%s:%s:%s" % (self.seed, test_id, a, b))
        flapped = [(f["node"], f["rail"]) for f in self.faults
                   if f["kind"] == "flapping_port" and f["node"] in (a, b) and rng.random() < float(f["p_down"])]
        if flapped:
            return {"busbw_gbps": None, "error": REMOTE_ERROR, "flapped": flapped}
        figure = self.healthy_gbps() * min(self.node_factor(a), self.node_factor(b)) * self.path_factor(a, b)
        return {"busbw_gbps": round(figure * rng.gauss(1.0, self.noise), 2), "error": None, "flapped": []}


# ---- the node's InfiniBand ports in sysfs ---------------------------------------------------------------------------
# <sysfs>/class/infiniband/mlx5_<rail>/ports/1/ as the kernel shows them (drivers/infiniband/core/sysfs.c): one HCA
# per rail, NDR 4X when healthy. A slow NIC trained at fewer lanes (width and rate drop with its factor); a bad cable's
# symbol and receive errors, and a flapping port's link_downed and link_error_recovery, grow with the node's simulated
# load seconds (the burn), so a read before and a read after the load differ. Counters saturate at their PMA width.
LANE_GBPS = 100
COUNTER_BITS = {"symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
                "port_rcv_remote_physical_errors": 16, "port_xmit_discards": 16, "local_link_integrity_errors": 4,
                "excessive_buffer_overrun_errors": 4}
# What a port shows before any load: a few symbol errors from when the link first trained.
INITIAL = {"symbol_error": 2}


def port_files(fabric, node, load_s):
    """{relative path under class/infiniband: text} of the node's ports after load_s simulated load seconds; {} for a
    node on no leaf (no InfiniBand)."""
    if node not in fabric.leaf_of:
        return {}
    out = {}
    for rail in range(fabric.rails):
        width, counters = 4, dict((name, INITIAL.get(name, 0)) for name in COUNTER_BITS)
        for fault in fabric.faults:
            if fault.get("node") != node or fault.get("rail") != rail:
                continue
            if fault["kind"] == "slow_nic":
                width = min(width, max(1, int(round(4 * float(fault["factor"])))))
            elif fault["kind"] == "bad_cable":
                bad = 1.0 - float(fault["factor"])
                counters["symbol_error"] += int(bad * load_s)
                counters["port_rcv_errors"] += int(bad * load_s / 10)
                counters["excessive_buffer_overrun_errors"] += int(bad * load_s / 100)
            elif fault["kind"] == "flapping_port":
                counters["link_downed"] += int(float(fault["p_down"]) * load_s / 60)
                counters["link_error_recovery"] += int(float(fault["p_down"]) * load_s / 30)
        port = "mlx5_%d/ports/1/" % rail
        out[port + "state"] = "4: ACTIVE\n"
        out[port + "phys_state"] = "5: LinkUp\n"
        out[port + "rate"] = "%d Gb/sec (%dX NDR)\n" % (LANE_GBPS * width, width)
        for name, bits in COUNTER_BITS.items():
            out[port + "counters/" + name] = "%d\n" % min(counters[name], (1 << bits) - 1)
    return out


def write_ports(root, fabric, node, load_s):
    """Write port_files under root (<state>/sysfs/class/infiniband), each file replaced whole (a reader never sees half
    a value)."""
    for rel, text in port_files(fabric, node, load_s).items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)


# ---- one rail between two nodes: ib_write_bw ------------------------------------------------------------------------
# The share of a port's line rate RDMA writes of 1 MiB reach (an NDR 4X port: about 392 of 400 Gb/s).
WRITE_EFFICIENCY = 0.98


def rail_width(fabric, node, rail):
    """The lanes the node's port on that rail trained at (a slow NIC: fewer, as in port_files)."""
    width = 4
    for fault in fabric.faults:
        if fault["kind"] == "slow_nic" and fault.get("node") == node and fault.get("rail") == rail:
            width = min(width, max(1, int(round(4 * float(fault["factor"])))))
    return width


def rail_write(fabric, client, server, rail, test_id):
    """{"gbps": float or None, "flapped": bool} of one ib_write_bw between the two nodes' HCAs of one rail: the slower
    port's rate, a bad cable's and a bad leaf's factors (when the pair crosses it), the noise; a flapping port on the
    rail drops the link during the test with its p_down."""
    rng = random.Random("%s:%s:%s:%s:%s" % (fabric.seed, test_id, client, server, rail))
    for fault in fabric.faults:
        if (fault["kind"] == "flapping_port" and fault["node"] in (client, server) and fault["rail"] == rail
                and rng.random() < float(fault["p_down"])):
            return {"gbps": None, "flapped": True}
    width = min(rail_width(fabric, client, rail), rail_width(fabric, server, rail))
    cable = min([1.0] + [float(f["factor"]) for f in fabric.faults if f["kind"] == "bad_cable"
                         and f["node"] in (client, server) and f["rail"] == rail])
    figure = LANE_GBPS * width * WRITE_EFFICIENCY * cable * fabric.path_factor(client, server)
    return {"gbps": round(figure * rng.gauss(1.0, fabric.noise), 2), "flapped": False}
