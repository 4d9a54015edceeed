# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""One pair's per-rail `ib_write_bw` (perftest) on a node, server or client side (stdlib only: runs on the node).

Each rail is one HCA name both nodes have; rail i listens on base_port + i (perftest's default port is 18515), so
every rail of a pair runs at once. The server side starts one `ib_write_bw -d <hca> -p <port> --report_gbits` per
rail and waits for each to end (one client run ends a perftest server; one that never gets its client is killed at
the timeout). The client side runs `ib_write_bw -d <hca> -p <port> --report_gbits <server>` per rail; a client that
finds no server yet ("Couldn't connect to <server>:<port>") retries until connect_timeout_s, since the server is
started by another task on another node. Every tool runs in its own process group, killed at the timeout.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import threading
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils.perftest_output import rail_result
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool

DEFAULT_PORT = 18515
# A kernel InfiniBand device name (mlx5_0, mlx5_bond_0, ibp12s0, irdma0; IB_DEVICE_NAME_MAX is 64 with its NUL).
HCA_NAME = re.compile(r"\A[A-Za-z][A-Za-z0-9_]{0,62}\Z")
# The server's name or address as the client reaches it (the same rule as mpirun's -H).
SERVER_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9.-]{0,252}\Z")
RETRY_S = 1.0
NOT_CONNECTED = "Couldn't connect to"
INSTALL = "install perftest (Debian/Ubuntu: apt-get install perftest; RHEL: dnf install perftest)"


def option_errors(hcas, server, base_port, timeout_s, connect_timeout_s):
    """Messages for every option that may not reach a command line: each HCA and the server name whole, the ports
    (base_port + one a rail) and the timeouts in range."""
    out = ["hca %r is not an InfiniBand device name (a letter, then letters, digits and _, at most 63)" % h
           for h in hcas if not (isinstance(h, str) and HCA_NAME.match(h))]
    if len(set(hcas)) != len(hcas):
        out.append("hcas %r names a device twice" % (hcas,))
    if server is not None and not (isinstance(server, str) and SERVER_NAME.match(server)):
        out.append("server %r is not a host name or address (letters, digits, . and -)" % (server,))
    if not 1024 <= base_port <= 65535 - len(hcas):
        out.append("base_port %r: the rails' ports (one a rail from it) must lie from 1024 to 65535" % base_port)
    if not 1 <= timeout_s <= 86400:
        out.append("timeout %r must be from 1 to 86400 seconds" % timeout_s)
    if not 0 <= connect_timeout_s <= 3600:
        out.append("connect_timeout %r must be from 0 to 3600 seconds" % connect_timeout_s)
    return out


def server_argv(exe, hca, port):
    return [exe, "-d", hca, "-p", str(port), "--report_gbits"]


def client_argv(exe, hca, port, server):
    return server_argv(exe, hca, port) + [server]


def _each(hcas, work):
    """work(i, hca) for every rail at once (one thread each); the results in rail order."""
    results = [None] * len(hcas)

    def one(i, hca):
        results[i] = work(i, hca)

    threads = [threading.Thread(target=one, args=(i, h)) for i, h in enumerate(hcas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _missing(hca, host, argv):
    return {"hca": hca, "gbps": None, "argv": argv,
            "error": "ib_write_bw not found on %s: %s" % (host, INSTALL),
            "evidence": ["on %s: %s" % (host, " ".join(argv))]}


def _timed_out(hca, host, res):
    return {"hca": hca, "gbps": None, "argv": res.argv,
            "error": "ib_write_bw on %s did not finish within %ds: a hung rail test; its processes were killed"
                     % (host, int(res.duration_s)),
            "evidence": ["on %s: %s" % (host, " ".join(res.argv))] + res.stderr.strip().splitlines()[-3:]}


def run_server(exe, hcas, base_port, timeout_s, host):
    """[{hca, argv, rc, error, evidence}] of one server per rail, each ended by its client or killed at timeout_s.
    exe None: ib_write_bw is not installed (each rail an error naming host and the fix)."""
    def work(i, hca):
        argv = server_argv(exe or "ib_write_bw", hca, base_port + i)
        if exe is None:
            return _missing(hca, host, argv)
        res = run_tool(argv, timeout_s)
        if res.timed_out:
            return _timed_out(hca, host, res)
        lines = (res.stderr.strip().splitlines() or [])[-3:]
        error = res.error or ("exit status %s: %s" % (res.rc, "; ".join(lines) or "no message") if res.rc else None)
        return {"hca": hca, "argv": res.argv, "rc": res.rc, "error": error,
                "evidence": ["on %s: %s" % (host, " ".join(res.argv))] + (lines if error else [])}
    return _each(hcas, work)


def run_client(exe, hcas, server, base_port, timeout_s, connect_timeout_s, host):
    """[{hca, gbps, error, evidence, argv}] of one client per rail against server (perftest_output.rail_result),
    retrying while the server is not listening yet, for at most connect_timeout_s; each killed at timeout_s."""
    def work(i, hca):
        argv = client_argv(exe or "ib_write_bw", hca, base_port + i, server)
        if exe is None:
            return _missing(hca, host, argv)
        started = time.monotonic()
        while True:
            left = timeout_s - (time.monotonic() - started)
            res = run_tool(argv, max(1.0, left))
            if res.timed_out:
                return _timed_out(hca, host, res)
            retry = (res.rc != 0 and NOT_CONNECTED in res.stderr
                     and time.monotonic() - started + RETRY_S < min(connect_timeout_s, timeout_s))
            if not retry:
                break
            time.sleep(RETRY_S)  # perftest's server is started by another task: give it a moment, then retry
        if res.error:
            out = {"hca": hca, "gbps": None, "error": "on %s: %s" % (host, res.error), "evidence": []}
        else:
            out = rail_result(hca, res.rc, res.stdout, res.stderr)
        out["argv"] = res.argv
        out["evidence"] = ["on %s: %s" % (host, " ".join(res.argv))] + list(out["evidence"])
        return out
    return _each(hcas, work)
