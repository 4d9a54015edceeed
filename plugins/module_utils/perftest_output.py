# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parser of perftest's `ib_write_bw` client output (stdlib only: runs on the node).

The format (perftest_parameters.h and ctx_print_test_info): a banner between dashed lines (`RDMA_Write BW Test`,
` Dual-port       : OFF\t\tDevice         : mlx5_0`, ` Link type       : IB`, ...), the local and remote
addresses, then a result table:
   #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
   1048576    5000             392.41             392.35\t\t   0.046773
`--report_gbits` gives Gb/sec; without it the unit is MB/sec (MiB/sec in newer releases), both 2^20 bytes a second.
Failures go to stderr: without an HCA " Did not detect devices" / " Unable to find the Infiniband/RoCE device" (an
unknown -d: "IB device <name> not found"); a server that does not answer "Couldn't connect to <host>:<port>" and
" Unable to init the socket connection"; a link lost under the test " Completion with error at client" and
" Failed status 12: wr_id 0 syndrom 0x81".
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

_HEADER = re.compile(r"\A#bytes\s+#iterations\s+BW peak\[(Gb/sec|MB/sec|MiB/sec)\]\s+BW average\[(?:Gb|MB|MiB)/sec\]"
                     r"\s+MsgRate\[Mpps\]")
_ROW = re.compile(r"\A(\d+)\s+(\d+)\s+(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\Z")
_DEVICE = re.compile(r"Device\s+:\s+(\S+)")
_LINK = re.compile(r"\ALink type\s+:\s+(\S+)")
# stderr lines -> what went wrong (the tool's own words are kept as the problem's message).
_ERRORS = (
    (re.compile(r"Did not detect devices|Unable to find the Infiniband/RoCE device|No IB devices found|"
                r"IB device \S+ not found"), "no_device"),
    (re.compile(r"Couldn't connect to \S+|Unable to init the socket connection|Failed to exchange"), "connect"),
    # A work completion in error: the link went away under the test (status 12: transport retry counter exceeded).
    (re.compile(r"Completion with error|Failed status \d+"), "completion_error"),
)
MAX_SAMPLES = 10


def _gbps(value, unit):
    return value if unit == "Gb/sec" else round(value * 1048576 * 8 / 1e9, 2)


def parse_ib_write_bw(stdout, stderr=""):
    """{"device", "link_type", "unit", "rows": [{bytes, iterations, peak_gbps, average_gbps, msg_rate_mpps}],
    "average_gbps" (at the largest size, None without a row), "problems": [{kind, message, line}], "unparsed"}.
    Never raises."""
    out = {"device": None, "link_type": None, "unit": None, "rows": [], "average_gbps": None, "problems": [],
           "unparsed": {"count": 0, "samples": []}}
    for raw in (stdout or "").splitlines():
        line = raw.strip()
        if not line or set(line) <= set("-*") or line.startswith(("local address", "remote address", "GID:")):
            continue
        match = _HEADER.match(line)
        if match:
            out["unit"] = match.group(1)
            continue
        match = _ROW.match(line)
        if match and out["unit"]:
            size, iters, peak, avg, rate = match.groups()
            out["rows"].append({"bytes": int(size), "iterations": int(iters),
                                "peak_gbps": _gbps(float(peak), out["unit"]),
                                "average_gbps": _gbps(float(avg), out["unit"]), "msg_rate_mpps": float(rate)})
            continue
        match = _DEVICE.search(line)
        if match and out["device"] is None:
            out["device"] = match.group(1)
        if _LINK.match(line):
            out["link_type"] = _LINK.match(line).group(1)
        if match or _LINK.match(line) or ":" in line or line.endswith("Test"):
            continue  # the banner's other settings
        out["unparsed"]["count"] += 1
        if len(out["unparsed"]["samples"]) < MAX_SAMPLES:
            out["unparsed"]["samples"].append(line[:300])
    for raw in (stderr or "").splitlines():
        line = raw.strip()
        for pattern, kind in _ERRORS:
            if line and pattern.search(line):
                out["problems"].append({"kind": kind, "message": line[:300], "line": line[:300]})
                break
    if out["rows"]:
        out["average_gbps"] = max(out["rows"], key=lambda r: r["bytes"])["average_gbps"]
    return out


def rail_result(hca, rc, stdout, stderr=""):
    """One rail's entry of a fabric pair test: {"hca", "gbps" (the average at the largest size) or None, "error" (the
    tool's own words) or None, "evidence" (the result row or the error lines)}."""
    parsed = parse_ib_write_bw(stdout, stderr)
    evidence = ["%s: %s" % (hca, p["line"]) for p in parsed["problems"]]
    if rc == 0 and parsed["average_gbps"] is not None:
        row = max(parsed["rows"], key=lambda r: r["bytes"])
        return {"hca": hca, "gbps": parsed["average_gbps"], "error": None,
                "evidence": ["%s: %d bytes x %d: %.2f Gb/s average" % (hca, row["bytes"], row["iterations"],
                                                                        row["average_gbps"])]}
    why = "; ".join(p["message"] for p in parsed["problems"]) or "exit status %s and no result row" % rc
    return {"hca": hca, "gbps": None, "error": why, "evidence": evidence or (stderr or "").strip().splitlines()[-3:]}
