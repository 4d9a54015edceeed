# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The InfiniBand ports as the kernel shows them in sysfs (stdlib only: runs on the node).

/sys/class/infiniband/<hca>/ports/<n>/ (drivers/infiniband/core/sysfs.c):
  state       "4: ACTIVE"  (NOP, DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER, or UNKNOWN)
  phys_state  "5: LinkUp"  (Sleep, Polling, Disabled, PortConfigurationTraining, LinkUp, LinkErrorRecovery, Phy Test)
  rate        "400 Gb/sec (4X NDR)", "200 Gb/sec (2X NDR)", "2.5 Gb/sec (1X SDR)"; kernels before HDR support print
              no speed name for SDR ("2.5 Gb/sec (1X)")
  counters/<name>  one unsigned integer, or "N/A (no PMA)" when the HCA answers no performance management query.
The error counters read (their meaning, from the InfiniBand PortCounters attribute):
  symbol_error                     minor link errors on the physical lanes: a dirty or bad cable or optic
  link_error_recovery              the link retrained successfully after errors
  link_downed                      the link failed to recover and went down: a flap
  port_rcv_errors                  received packets with errors (bad CRC, malformed)
  port_rcv_remote_physical_errors  received packets marked bad by the sender's side
  port_xmit_discards               outbound packets dropped (port down, congestion)
  local_link_integrity_errors      physical errors beyond the local link's threshold
  excessive_buffer_overrun_errors  receive buffer overruns: flow control broken on the link
The counters are saturating and narrow (4 to 16 bits): compare two reads, and read a saturated value as "at least".
One parser per file format; read_ports() reads the tree.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

ROOT = "/sys/class/infiniband"
ERROR_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                  "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors")
_STATE = re.compile(r"\A(\d+): ?(.+)\Z")
_RATE = re.compile(r"\A(\d+(?:\.5)?) Gb/sec \((\d+)X(?: ?([A-Z0-9]+))?\)\Z")
_NAME = re.compile(r"\A[A-Za-z0-9_.-]{1,64}\Z")


def parse_state(text):
    """"4: ACTIVE" -> (4, "ACTIVE"); None when unreadable (state and phys_state share the format)."""
    match = _STATE.match((text or "").strip())
    return (int(match.group(1)), match.group(2).strip()) if match else None


def parse_rate(text):
    """"400 Gb/sec (4X NDR)" -> {"rate_gbps": 400.0, "width": 4, "speed": "NDR"}; None when unreadable."""
    match = _RATE.match((text or "").strip())
    if not match:
        return None
    return {"rate_gbps": float(match.group(1)), "width": int(match.group(2)), "speed": match.group(3)}


def parse_counter(text):
    """"12" -> 12; "N/A (no PMA)" or anything else -> None."""
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def read_ports(root=ROOT):
    """{"ports": [{hca, port, state, state_name, phys_state, rate_gbps, width, speed, counters {name: int or None},
    lines}], "problems"}. No root (no HCA, no driver) is an empty list, said in problems."""
    out = {"ports": [], "problems": []}
    try:
        hcas = sorted(os.listdir(root))
    except OSError as exc:
        out["problems"].append({"kind": "no_infiniband", "message": "%s: %s" % (root, exc.strerror), "line": root})
        return out
    for hca in hcas:
        ports_dir = os.path.join(root, hca, "ports")
        if not _NAME.match(hca) or not os.path.isdir(ports_dir):
            continue
        for name in sorted(os.listdir(ports_dir), key=lambda n: (len(n), n)):
            if not name.isdigit():
                continue
            out["ports"].append(_port(hca, int(name), os.path.join(ports_dir, name), out["problems"]))
    return out


def _port(hca, number, path, problems):
    port = {"hca": hca, "port": number, "state": None, "state_name": None, "phys_state": None, "rate_gbps": None,
            "width": None, "speed": None, "counters": {}, "lines": []}
    for key in ("state", "phys_state", "rate"):
        text = _read(os.path.join(path, key))
        if text is None:
            problems.append({"kind": "unreadable", "message": "%s port %d: %s/%s unreadable" % (hca, number, path, key),
                             "line": key})
            continue
        port["lines"].append("%s/%d %s: %s" % (hca, number, key, text.strip()))
        if key == "rate":
            rate = parse_rate(text)
            if rate:
                port.update(rate)
            else:
                problems.append({"kind": "unreadable", "message": "%s port %d: rate %r" % (hca, number, text.strip()),
                                 "line": text.strip()})
            continue
        state = parse_state(text)
        if state is None:
            problems.append({"kind": "unreadable", "message": "%s port %d: %s %r" % (hca, number, key, text.strip()),
                             "line": text.strip()})
        elif key == "state":
            port["state"], port["state_name"] = state
        else:
            port["phys_state"] = state[1]
    for counter in ERROR_COUNTERS:
        port["counters"][counter] = parse_counter(_read(os.path.join(path, "counters", counter)))
    return port


def port_key(port):
    """"<hca>/<port>": how two reads of the same port are joined (never by position)."""
    return "%s/%s" % (port.get("hca"), port.get("port"))


def counters_by_port(ports):
    """{"<hca>/<port>": counters} of an earlier read's ports; None for no read. ValueError names a malformed entry."""
    if ports is None:
        return None
    out = {}
    for i, port in enumerate(ports):
        if not isinstance(port, dict) or not _NAME.match(str(port.get("hca") or "")) \
                or not isinstance(port.get("port"), int) or not isinstance(port.get("counters"), dict):
            raise ValueError("entry %d is not a port read (hca, port, counters): %r" % (i, port))
        out[port_key(port)] = dict((k, v) for k, v in port["counters"].items()
                                   if k in ERROR_COUNTERS and (v is None or isinstance(v, int)))
    return out
