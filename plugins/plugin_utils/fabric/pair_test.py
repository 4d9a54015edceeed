# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""One pair test of the fabric search as the playbook runs it (controller side): the launch of a planned pair
(who launches, mpirun's -H) and its answer read from the task's result (kentino.gpufleet.nccl_test under mpirun,
launched asynchronously from the pair's first node and polled with async_status).

An answer is {"nodes": [a, b] (a group of the bisection: all its nodes), "busbw_gbps": float or None, "error": str
or None, "evidence": [lines]}: a figure only when the test ran to its end with result rows and no failure line;
anything else (unreachable, a hang killed by the timeout, mpirun unable to reach the partner, NCCL's remote error) is
an error naming what happened, which judge_fabric never counts against either node. Where both nodes of a pair have InfiniBand the pair also runs
ib_write_bw on each rail they share (rail_plan, the module kentino.gpufleet.ib_write_bw on both nodes), and each
rail's answer joins the pair's (rail_answers).
"""

from __future__ import annotations

import re

from ansible_collections.kentino.gpufleet.plugins.module_utils.ib_rail_test import HCA_NAME
from ansible_collections.kentino.gpufleet.plugins.module_utils.nccl_check import BYTE_COUNT

# A host name that reaches mpirun's -H: a DNS name or an address, nothing a shell or mpirun would read as syntax.
MPI_HOST = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9.-]{0,252}\Z")
# One extra mpirun argument (an item of gpufleet_fabric_mpirun_args). Open MPI hands some of them (the value of
# --mca plm_rsh_args, "-i key -o ...") to the shell that starts its daemon on the partner: no quotes, $, `, ;, |, &,
# <, >, \, globs or control characters, only what options, paths and key=value need (spaces inside one item).
MPIRUN_ARG = re.compile(r"\A[A-Za-z0-9_./:=,@+%-][A-Za-z0-9_./:=,@+% -]{0,511}\Z")
ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
ENV_VALUE = re.compile(r"\A[^\x00-\x1f\x7f]{0,4096}\Z")
DEFAULT_SIZES = ("8M", "1G")  # gpufleet_fabric_min_bytes, gpufleet_fabric_max_bytes
# Open MPI refuses to run as root without it; the pair tests run as the play's user, root on most sites.
MPIRUN_FIXED_ARGS = ["--allow-run-as-root"]
EVIDENCE_LINES = 6
# Open MPI's own warnings ("[node3:00146] plm:rsh: Warning: setpgid(...) failed ..."): kept in the evidence, never
# the headline of a pair's error (the cause is the line after: ssh's, or Open MPI's error).
OMPI_WARNING = re.compile(r"\A\[[^\]]+:\d+\] [\w:]+: Warning: ")


def host_errors(mpi_hosts, slots, timeouts, mpirun_args=None, envs=None, sizes=None, rail_timeouts=None):
    """Messages for every host whose mpirun name (gpufleet_fabric_mpi_host), rank count, timeout, extra mpirun
    arguments, rank environment, message sizes ({host: (min, max)}) or rail test timeout are not valid."""
    out = ["host %s: gpufleet_fabric_mpi_host=%r is not a host name or address mpirun can use (letters, digits, . "
           "and -): fix it in host_vars/group_vars" % (h, name) for h, name in sorted(mpi_hosts.items())
           if not (isinstance(name, str) and MPI_HOST.match(name))]
    out += ["host %s: gpufleet_fabric_ranks_per_node=%r must be a whole number from 1 to 64 (one rank a GPU)" % (
        h, n) for h, n in sorted(slots.items()) if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64]
    out += ["host %s: gpufleet_fabric_pair_timeout_s=%r must be a whole number of seconds from 10 to 86400" % (h, n)
            for h, n in sorted(timeouts.items()) if isinstance(n, bool) or not isinstance(n, int)
            or not 10 <= n <= 86400]
    out += ["host %s: gpufleet_fabric_rail_timeout_s=%r must be a whole number of seconds from 10 to 86400" % (h, n)
            for h, n in sorted((rail_timeouts or {}).items()) if isinstance(n, bool) or not isinstance(n, int)
            or not 10 <= n <= 86400]
    for h, args in sorted((mpirun_args or {}).items()):
        if not isinstance(args, list):
            out.append("host %s: gpufleet_fabric_mpirun_args must be a list of arguments, got %r" % (h, args))
            continue
        out += ["host %s: gpufleet_fabric_mpirun_args item %r is not a clean mpirun argument (letters, digits, spaces "
                "and _./:=,@+%%-; no quotes, $, `, ;, |, &, <, >, \\ or control characters): fix it in "
                "host_vars/group_vars" % (h, a) for a in args if not (isinstance(a, str) and MPIRUN_ARG.match(a))]
    for h, env in sorted((envs or {}).items()):
        if not isinstance(env, dict):
            out.append("host %s: gpufleet_fabric_env must be a mapping of variable names to values, got %r" % (h, env))
            continue
        out += ["host %s: gpufleet_fabric_env %r=%r: the name must be a shell variable name and the value a string or "
                "number without control characters" % (h, k, v) for k, v in sorted(env.items(), key=str)
                if not (isinstance(k, str) and ENV_NAME.match(k)) or isinstance(v, bool)
                or not (isinstance(v, (str, int, float)) and ENV_VALUE.match(str(v)))]
    for h, (low, high) in sorted((sizes or {}).items()):
        out += ["host %s: %s=%r must be a byte count with an optional K, M or G suffix (8M, 1G)" % (h, name, v)
                for name, v in (("gpufleet_fabric_min_bytes", low), ("gpufleet_fabric_max_bytes", high))
                if not (isinstance(v, str) and BYTE_COUNT.match(v))]
    return out


def launch(nodes, mpi_hosts, slots, timeouts, mpirun_args=None, envs=None, sizes=None, hcas=None,
           rail_timeouts=None):
    """{"nodes", "launch_from", "mpi_hosts", "np", "timeout_s", "launcher_args", "env", "min_bytes", "max_bytes",
    "rails"} of one planned pair: run from its first node with its settings (timeout, extra mpirun arguments,
    environment, sizes), every rank of both (`mpirun -np N --allow-run-as-root -H a:8,b:8 <extra> all_reduce_perf`).
    rails: the per-rail ib_write_bw (rail_plan), or None when a node of the pair has no InfiniBand. A group of the
    bisection (more nodes) is launched the same way, from its first node (`-H a:8,b:8,c:8,...`), without rails."""
    a = nodes[0]
    hosts = ",".join("%s:%d" % (mpi_hosts[n], slots[n]) for n in nodes)
    low, high = (sizes or {}).get(a) or DEFAULT_SIZES
    extra = list((mpirun_args or {}).get(a) or [])
    return {"nodes": list(nodes), "launch_from": a, "np": sum(slots[n] for n in nodes), "timeout_s": timeouts[a],
            "mpi_hosts": hosts, "launcher_args": MPIRUN_FIXED_ARGS + ["-H", hosts] + extra,
            "env": dict((k, str(v)) for k, v in ((envs or {}).get(a) or {}).items()), "min_bytes": low,
            "max_bytes": high,
            "rails": rail_plan(nodes, mpi_hosts, hcas or {}, rail_timeouts or {}) if len(nodes) == 2 else None}


def _tail(lines):
    return [str(line)[:300] for line in (lines or []) if str(line).strip()][-EVIDENCE_LINES:]


def answer(nodes, result):
    """The answer to one pair (or group) from its task result (async_status's, or the launch's when it never
    started)."""
    a, nodes = nodes[0], list(nodes)
    result = result if isinstance(result, dict) else {}
    tool = result.get("tool") if isinstance(result.get("tool"), dict) else {}
    argv = " ".join(str(x) for x in tool.get("argv") or [])
    evidence = (["on %s: %s" % (a, argv)] if argv else [])
    if result.get("unreachable"):
        return {"nodes": nodes, "busbw_gbps": None, "evidence": evidence + _tail([result.get("msg")]),
                "error": "%s, the node that launches the test, is unreachable: %s" % (
                    a, str(result.get("msg") or "no message").strip().splitlines()[0][:200])}
    if tool.get("timed_out"):
        return {"nodes": nodes, "busbw_gbps": None, "evidence": evidence + _tail(result.get("output_tail")),
                "error": "the test did not finish within its timeout (%ss): a hung collective or a partner that "
                         "stopped answering; its processes were killed" % tool.get("duration_s")}
    if tool.get("error") and tool.get("rc") is None:
        # The test could not start on the launching node (mpirun or all_reduce_perf missing there): say where.
        return {"nodes": nodes, "busbw_gbps": None, "evidence": evidence,
                "error": "on %s, the node that launches the test: %s" % (a, str(tool["error"]).strip()[:200])}
    figure = result.get("peak_busbw_gbps")
    failures = list(result.get("failures") or [])
    if result.get("failed") or tool.get("error") or failures or tool.get("rc") not in (0, None) \
            or not isinstance(figure, (int, float)) or isinstance(figure, bool):
        # What the tools said first: a failure line, else what mpirun printed (ssh, Open MPI), else the judge's words.
        unparsed = (result.get("unparsed") or {}).get("samples") or []
        said = failures or [u for u in unparsed if str(u).strip("- \t") and not OMPI_WARNING.match(str(u))] \
            or list(result.get("reasons") or []) \
            or [result.get("msg") or tool.get("error")]
        first = next((str(s) for s in said if s), "no bus bandwidth figure")
        return {"nodes": nodes, "busbw_gbps": None, "evidence": evidence + _tail(failures + unparsed),
                "error": "rc=%s: %s" % (tool.get("rc"), first.strip().splitlines()[0][:200])}
    return {"nodes": nodes, "busbw_gbps": float(figure), "error": None,
            "evidence": evidence + _tail(result.get("evidence"))}


def answers(launched, finished):
    """The answers to one round: launched are the launch task's loop results (item: the launch), finished the
    async_status loop's (item: a launched result). A pair that never started answers from its launch."""
    out = {}
    for r in launched or []:
        item = r.get("item") if isinstance(r, dict) else None
        if isinstance(item, dict) and not r.get("ansible_job_id"):
            out[tuple(item["nodes"])] = answer(item["nodes"], r)
    for r in finished or []:
        item = (r.get("item") or {}).get("item") if isinstance(r, dict) else None
        if isinstance(item, dict):
            out[tuple(item["nodes"])] = answer(item["nodes"], r)
    return list(out.values())


# ---- per rail: ib_write_bw between the two nodes' HCAs of each rail ------------------------------------------------
RAIL_PORT = 18515  # perftest's default port: rail i listens on RAIL_PORT + i, every rail of a pair at once
RAIL_CONNECT_S = 30  # how long a client retries a server another task is still starting (at most half its timeout)
DEFAULT_RAIL_TIMEOUT_S = 120


def _natural(name):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def hcas_found(results):
    """{host: [HCA names, mlx5_2 before mlx5_10]} from the loop results of kentino.gpufleet.ib_ports over the nodes
    (item: the host); a node unreachable, without InfiniBand (not_run) or whose read failed has []. A name that is
    not a clean device name is left out (ib_rail_test.HCA_NAME: it would reach a command line)."""
    out = {}
    for r in results or []:
        if not isinstance(r, dict) or not isinstance(r.get("item"), str):
            continue
        ports = r.get("ports") if not (r.get("unreachable") or r.get("failed") or r.get("not_run")) else None
        names = set(p.get("hca") for p in ports or [] if isinstance(p, dict))
        out[r["item"]] = sorted((n for n in names if isinstance(n, str) and HCA_NAME.match(n)), key=_natural)
    return out


def rail_plan(pair, mpi_hosts, hcas, rail_timeouts):
    """{"client", "server", "server_host", "hcas", "base_port", "timeout_s", "connect_timeout_s"}: the client on the
    pair's first node, the server on its second, one rail an HCA name both have; None when either has none."""
    a, b = pair
    both = [h for h in hcas.get(a) or [] if h in set(hcas.get(b) or [])]
    if not both:
        return None
    timeout = rail_timeouts.get(a, DEFAULT_RAIL_TIMEOUT_S)
    return {"client": a, "server": b, "server_host": mpi_hosts[b], "hcas": both, "base_port": RAIL_PORT,
            "timeout_s": timeout, "connect_timeout_s": min(RAIL_CONNECT_S, timeout // 2)}


def _side(results):
    """{(a, b): (plan item, result)} of one side's launch results and async_status results (the latter win)."""
    out = {}
    for r in results or []:
        if not isinstance(r, dict):
            continue
        item = r.get("item")
        if isinstance(item, dict) and isinstance(item.get("item"), dict):
            item = item["item"]  # async_status's item is the launch's result
        elif r.get("ansible_job_id") and not r.get("finished"):
            continue  # a launch that started: its answer is async_status's
        if isinstance(item, dict) and item.get("rails"):
            out[tuple(item["nodes"])] = (item, r)
    return out


def _side_rails(node, result):
    """{hca: rail} of one side's result, or the reason that side gave none."""
    if result.get("unreachable"):
        return {}, "%s is unreachable: %s" % (node, str(result.get("msg") or "no message").strip()[:200])
    rails = result.get("rails")
    if not isinstance(rails, list):
        return {}, "on %s: %s" % (node, str(result.get("msg") or "the rail test gave no answer").strip()[:200])
    return dict((r.get("hca"), r) for r in rails if isinstance(r, dict)), None


def rail_answers(plan, servers, clients):
    """{(a, b): [{hca, gbps, error, evidence}]} for every planned pair with rails: the client's figure, with both
    sides' command lines as evidence; a rail whose server could not run (ib_write_bw missing there, killed at the
    timeout) has the server's error first, the cause of the client's "Couldn't connect"."""
    servers, clients = _side(servers), _side(clients)
    out = {}
    for item in plan:
        rails = item.get("rails")
        if not rails:
            continue
        key = tuple(item["nodes"])
        srv, srv_why = _side_rails(rails["server"], (servers.get(key) or (None, {}))[1])
        cli, cli_why = _side_rails(rails["client"], (clients.get(key) or (None, {}))[1])
        out[key] = []
        for hca in rails["hcas"]:
            s, c = srv.get(hca) or {}, cli.get(hca) or {}
            gbps = c.get("gbps") if isinstance(c.get("gbps"), (int, float)) and not c.get("error") else None
            errors = [e for e in (s.get("error") or (srv_why if not s else None),
                                  c.get("error") or (cli_why if not c else None)) if e]
            if gbps is None and not errors:
                errors = ["ib_write_bw gave no figure"]
            out[key].append({"hca": hca, "gbps": gbps if not errors else None,
                             "error": "; ".join(errors) if errors else None,
                             "evidence": _tail(list(s.get("evidence") or [])[:None if s.get("error") else 1]
                                               + list(c.get("evidence") or []))})
    return out
