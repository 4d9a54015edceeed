# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parser of `ibstat` (infiniband-diags) output (stdlib only: runs on the node).

Two layouts, from infiniband-diags' ibstat.c:
- every HCA (`ibstat`, `ibstat mlx5_0`): `CA 'mlx5_0'`, tab-indented CA lines (`CA type:`, `Number of ports:`,
  `Firmware version:`, ...), then per port `\tPort 1:` and its doubly indented lines;
- one port (`ibstat mlx5_0 1`): `CA: 'mlx5_0'`, `Port 1:` and unindented port lines.
Port lines: `State:` Down|Initializing|Armed|Active|???, `Physical state:` Sleep|Polling|Disabled|
PortConfigurationTraining|LinkUp|LinkErrorRecovery|PhyTest, `Rate:` an integer Gb/s, `2.5` (1X SDR) or `40 (FDR10)`,
`Base lid:`, `LMC:`, `SM lid:`, `Capability mask:`, `Port GUID:`, `Link layer:` InfiniBand|Ethernet.
ibstat shows no link width: the sysfs rate file does (ib_sysfs.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

MAX_SAMPLES = 10
_CA = re.compile(r"\A(CA|Switch|Router|iWARP RNIC|\?\?\?):? '([^']+)'\Z")
_PORT = re.compile(r"\APort (\d+):\Z")
_FIELD = re.compile(r"\A([A-Za-z][A-Za-z ]*):\s*(.*)\Z")
_RATE = re.compile(r"\A(\d+(?:\.\d+)?)(?: \((FDR10)\))?\Z")
PORT_KEYS = {"State": "state", "Physical state": "phys_state", "Rate": "rate", "Base lid": "base_lid", "LMC": "lmc",
             "SM lid": "sm_lid", "Capability mask": "capability_mask", "Port GUID": "port_guid",
             "Link layer": "link_layer"}
CA_KEYS = {"CA type": "ca_type", "Switch type": "ca_type", "Number of ports": "ports_count",
           "Firmware version": "firmware", "Hardware version": "hardware", "Node GUID": "node_guid",
           "System image GUID": "system_image_guid"}


def parse_ibstat(text):
    """{"ports": [{hca, port, state, phys_state, rate_gbps, rate_note, link_layer, port_guid, lines}], "hcas":
    [{name, ca_type, firmware, ...}], "problems", "unparsed"}. Never raises."""
    out = {"ports": [], "hcas": [], "problems": [], "unparsed": {"count": 0, "samples": []}}
    hca, port = None, None
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        match = _CA.match(line)
        if match:
            hca, port = {"name": match.group(2)}, None
            out["hcas"].append(hca)
            continue
        match = _PORT.match(line)
        if match and hca is not None:
            port = {"hca": hca["name"], "port": int(match.group(1)), "state": None, "phys_state": None,
                    "rate_gbps": None, "rate_note": None, "link_layer": None, "port_guid": None, "lines": []}
            out["ports"].append(port)
            continue
        match = _FIELD.match(line)
        if match and port is not None and match.group(1) in PORT_KEYS:
            _port_field(port, PORT_KEYS[match.group(1)], match.group(2).strip(), out)
            port["lines"].append(line)
            continue
        if match and hca is not None and port is None and match.group(1) in CA_KEYS:
            hca[CA_KEYS[match.group(1)]] = match.group(2).strip()
            continue
        if line.startswith("ibpanic:") or line.startswith("ibwarn:"):
            # ibdiag_common's IBPANIC/IBWARN: no HCA, no umad module, no permission.
            out["problems"].append({"kind": "tool_error", "message": line[:300], "line": line[:300]})
            continue
        out["unparsed"]["count"] += 1
        if len(out["unparsed"]["samples"]) < MAX_SAMPLES:
            out["unparsed"]["samples"].append(line[:300])
    return out


def _port_field(port, key, value, out):
    if key == "rate":
        match = _RATE.match(value)
        if match:
            port["rate_gbps"] = float(match.group(1))
            port["rate_note"] = match.group(2)
        else:
            out["problems"].append({"kind": "unreadable_rate", "message": "%s port %s: rate %r is not a number" % (
                port["hca"], port["port"], value), "line": "Rate: %s" % value})
    else:
        port[key] = value
