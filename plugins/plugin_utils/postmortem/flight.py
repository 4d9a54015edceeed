# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Cross-rank analysis of flight-recorder dumps (pure, stdlib only).

Dumps are added one rank at a time (dump_reader.read_dump output), so memory holds one dump plus, per process group
and sequence, which ranks ran which collective signature. Then, per process group:
- the last enqueued / started / completed collective of every member rank (or "no dump");
- the stuck collective: the first sequence not completed by every member while someone enqueued it;
- ranks that never joined it (last enqueued below it), ranks whose entry was never started on the GPU while the
  others' were, ranks that ran another collective (op, sizes, dtypes) at that sequence, and members without a dump;
- ranks that joined it late: their entry was created more than the collective's timeout after the first rank's (by
  the ranks' own clocks). A rank that stopped and woke up before it was killed (the others had given up waiting)
  enqueued the collective after all: without the enqueue times it would look like every other rank. Which of the two
  a dump shows depends on when the process was killed, so both name the same rank with the same strength. When
  every rank marked the collective completed (gloo marks one that failed with its timeout completed), the last
  collective of each group is checked for late ranks the same way;
- the first mismatched sequence anywhere in the recorded history (the desync fr_trace looks for).
The root group is the one whose stuck collective was created first: a rank stuck in one group stalls the others.
"""

from __future__ import annotations

from array import array

# Collectives in which every member's data reaches every other (torch's profiling names, after "nccl:"/"gloo:"): one
# that every member enqueued and any rank completed was joined by every member (_joined_by_all).
ALL_MEMBERS = frozenset(("all_reduce", "allreduce", "all_reduce_barrier", "all_reduce_coalesced", "allreduce_coalesced",
                         "sparse_all_reduce", "all_gather", "allgather", "_allgather_base", "_all_gather_base",
                         "all_gather_coalesced", "allgather_coalesced", "all_gather_into_tensor_coalesced",
                         "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
                         "reduce_scatter_tensor_coalesced", "all_to_all", "alltoall", "alltoall_base", "barrier"))
STRENGTH = {"never_joined": 3, "late_joined": 3, "mismatch": 3, "not_started": 2, "missing_dump": 1, "refused_dump": 1}


class FlightAccumulator:
    def __init__(self):
        self.ranks = {}  # rank -> {file, version, pgs}
        self.refused = []  # {rank, file, error}
        # Per group and sequence: the first signature seen, how many ranks recorded it, and the ranks that differ.
        self.refs, self.counts, self.odd = {}, {}, {}  # key -> {seq: sig}; key -> {seq: n}; (key, seq) -> {sig: ranks}
        self.members = {}  # pg key -> set of member ranks (pg_config), or None when unknown
        self.names = {}  # pg key -> (name, desc)
        self.problems = []

    @staticmethod
    def _key(pg):
        return pg["name"] + ("|" + ",".join(str(r) for r in pg["ranks"]) if pg["ranks"] else "")

    def add(self, reduced):
        rank = reduced["rank"]
        if rank in self.ranks:
            self.problems.append("two dumps for rank %s (%s, %s): the second is ignored"
                                 % (rank, self.ranks[rank]["file"], reduced["file"]))
            return
        pgs = {}
        for pg in reduced["pgs"].values():
            key = self._key(pg)
            pgs[key] = pg
            self.names.setdefault(key, (pg["name"], pg["desc"]))
            if pg["ranks"]:
                self.members.setdefault(key, set()).update(pg["ranks"])
            else:
                self.members.setdefault(key, set()).add(rank)
        keys = {pg["name"]: self._key(pg) for pg in reduced["pgs"].values()}
        for pg_name, pairs in reduced["signatures"].items():
            key = keys.get(pg_name, pg_name)
            ref = self.refs.setdefault(key, {})
            count = self.counts.setdefault(key, {})
            for seq, sig in pairs:
                count[seq] = count.get(seq, 0) + 1
                first = ref.get(seq)
                if first is None:
                    ref[seq] = sig
                elif first is not sig and first != sig:
                    self.odd.setdefault((key, seq), {}).setdefault(sig, array("i")).append(rank)
        self.ranks[rank] = {"file": reduced["file"], "version": reduced["version"], "pgs": pgs,
                            "entries_total": reduced["entries_total"]}
        self.problems.extend(reduced["problems"])

    def refuse(self, rank, name, error):
        self.refused.append({"rank": rank, "file": name, "error": error})

    # ---- analysis ---------------------------------------------------------------------------------------------
    def analyse(self, world_size=None):
        groups = []
        for key in sorted(self.members, key=lambda k: (len(self.members[k] or ()), k), reverse=True):
            members = set(self.members[key])
            name, desc = self.names[key]
            if desc == "default_pg" and isinstance(world_size, int) and 0 < world_size <= 100000:
                members.update(range(world_size))
            groups.append(self._group(key, name, desc, sorted(members)))
        stuck = [g for g in groups if g["stuck_seq"] is not None]
        stuck.sort(key=lambda g: (g["stuck_created_ns"] if g["stuck_created_ns"] is not None else float("inf"),
                                  -max([STRENGTH.get(c["basis"], 0) for c in g["culprits"]] + [0]), g["key"]))
        root = stuck[0] if stuck else None
        versions = sorted({r["version"] for r in self.ranks.values() if r["version"]})
        first = self._first_mismatch()
        culprits = list(root["culprits"]) if root else []
        if not culprits and first and first["odd_ranks"]:
            culprits = _culprits_of_mismatch(first)
        if not culprits and not stuck:
            culprits = next((g["late_last"] for g in groups if g["late_last"]), [])
        return {
            "ranks_with_dump": sorted(self.ranks),
            "refused": list(self.refused),
            "versions": versions,
            "groups": groups,
            "root_group": root["key"] if root else None,
            "culprits": culprits,
            "first_mismatch": first,
            "problems": self.problems[:50],
        }

    def _group(self, key, name, desc, members):
        status = {}
        for rank in members:
            pg = self._pg(rank, key)
            if pg is not None:
                status[rank] = {"last_enqueued": pg["last_enqueued"], "last_started": pg["last_started"],
                                "last_completed": pg["last_completed"], "source": pg["status_source"]}
        refused = {item["rank"] for item in self.refused}
        # A rank whose dump exists but could not be read is refused, not missing: it did dump.
        missing = [r for r in members if r not in status and r not in refused]
        group = {"key": key, "name": name, "desc": desc, "members": members, "status": status,
                 "missing_dump": missing, "refused_dump": [r for r in members if r not in status and r in refused],
                 "stuck_seq": None, "stuck_op": None, "stuck_created_ns": None,
                 "timeout_ms": None, "never_joined": [], "not_started": [], "late_joined": [], "mismatch": None,
                 "culprits": [], "late_last": []}
        known = [s for s in status.values() if s["last_completed"] is not None and s["last_enqueued"] is not None]
        if not known:
            return group
        # A rank's completion record can lag its work: a gloo rank that went to sleep right after enqueuing #4 recorded
        # #2 as its last completed, though ranks 0 and 2 had completed #3 and #4, which cannot complete without it (a
        # loaded machine, 1 run in ~10). A collective every member feeds and enqueued, completed on any rank, was
        # joined by all: the stuck one lies beyond it.
        stuck = max(min(s["last_completed"] for s in known), self._joined_by_all(key, members, status)) + 1
        if not any(s["last_enqueued"] >= stuck for s in known):
            # everything enqueued was completed: idle, not stuck, unless a rank came to the last collective late
            last = max(s["last_enqueued"] for s in known)
            at = {rank: e for rank, e in ((r, self._entry(r, key, last)) for r in status) if e is not None}
            group["late_last"] = self._late_culprits(group, at, last)
            return group
        group["stuck_seq"] = stuck
        at = {}
        for rank, st in status.items():
            entry = self._entry(rank, key, stuck)
            if st["last_enqueued"] is not None and st["last_enqueued"] < stuck:
                group["never_joined"].append(rank)
            elif entry is not None:
                at[rank] = entry
        created = [e["time_created_ns"] for e in at.values() if e["time_created_ns"]]
        group["stuck_created_ns"] = min(created) if created else None
        timeouts = [e["timeout_ms"] for e in at.values() if e["timeout_ms"]]
        group["timeout_ms"] = max(timeouts) if timeouts else None
        ops = {}
        for rank, entry in at.items():
            ops.setdefault(entry["sig"], []).append(rank)
        if at:
            _sig, major = max(ops.items(), key=lambda kv: (len(kv[1]), kv[0]))
            group["stuck_op"] = at[major[0]]["op"]
        if len(ops) > 1:
            ordered = sorted(ops.items(), key=lambda kv: (len(kv[1]), kv[0]))
            group["mismatch"] = {"seq": stuck, "variants": [{"sig": s, "ranks": sorted(r)} for s, r in ordered],
                                 "odd_ranks": sorted(ordered[0][1]) if len(ordered[0][1]) < len(ordered[-1][1]) else []}
        started = [r for r, e in at.items() if e["state"] in ("started", "completed")]
        if started:
            group["not_started"] = sorted(r for r, e in at.items() if e["state"] == "scheduled")
        group["late_joined"] = _late(at)
        group["culprits"] = self._culprits(group, at)
        return group

    def _joined_by_all(self, key, members, status):
        """The highest sequence number of a collective that every member enqueued, some rank completed, and that
        needs every member's data (all_reduce, all_gather, ...: not broadcast, whose root may finish before the others
        arrive). Enqueued by all, because gloo also marks a collective that timed out completed: rank 0's record said
        #5 completed while rank 1 never enqueued #5 (recorded). -1: none, or a member's record is missing."""
        if any(status.get(r, {}).get("last_enqueued") is None for r in members):
            return -1
        reach = min(status[r]["last_enqueued"] for r in members)
        best = -1
        for rank, st in status.items():
            if st["last_completed"] is None:
                continue
            done = min(st["last_completed"], reach)
            if done > best:
                best = max([best] + [e["seq"] for e in (self._pg(rank, key) or {}).get("entries", ())
                                     if e["seq"] <= done and e["op"] in ALL_MEMBERS])
        return best

    @staticmethod
    def _late_culprits(group, at, seq):
        label, late = group["desc"] or group["name"], _late(at)
        first = min(at, key=lambda r: (at[r]["time_created_ns"] or float("inf"), r))
        on_time = sorted(r for r in at if r not in late)
        return [{"rank": rank, "pg": label, "seq": seq, "op": at[rank]["op"], "basis": "late_joined",
                 "frames": at[rank]["frames"],
                 "reason": "rank %d joined collective %s #%d of process group %s %.1f s after rank %d, later than its "
                           "%s timeout: rank(s) %s had given up waiting (the timing is the evidence: the enqueue "
                           "times in the ranks' flight-recorder dumps, by each rank's clock)"
                           % (rank, at[rank]["op"] or "?", seq, label,
                              (at[rank]["time_created_ns"] - at[first]["time_created_ns"]) / 1e9, first,
                              _seconds(at[first]["timeout_ms"]), _short(on_time))} for rank in late]

    def _pg(self, rank, key):
        """What rank's dump holds for process group key (None: no dump, or not a member there)."""
        return (self.ranks.get(rank) or {}).get("pgs", {}).get(key)

    def _entry(self, rank, key, seq):
        for entry in (self._pg(rank, key) or {}).get("entries", ()):
            if entry["seq"] == seq:
                return entry
        return None

    def _culprits(self, group, at):
        seq, out = group["stuck_seq"], []
        label = group["desc"] or group["name"]
        if group["never_joined"] and len(group["never_joined"]) < max(1, len(group["status"])):
            for rank in group["never_joined"]:
                last = group["status"][rank]["last_enqueued"]
                frames = (self._entry(rank, group["key"], last) or {}).get("frames") or []
                out.append({"rank": rank, "pg": label, "seq": seq, "op": group["stuck_op"], "basis": "never_joined",
                            "frames": frames,
                            "reason": "rank %d never joined collective %s #%d of process group %s: its last enqueued "
                                      "collective is #%d while the other ranks wait in #%d"
                                      % (rank, group["stuck_op"] or "?", seq, label, last, seq)})
        mismatch = group["mismatch"]
        if mismatch and mismatch["odd_ranks"]:
            major = mismatch["variants"][-1]
            for rank in mismatch["odd_ranks"]:
                entry = at[rank]
                out.append({"rank": rank, "pg": label, "seq": seq, "op": entry["op"], "basis": "mismatch",
                            "frames": entry["frames"],
                            "reason": _mismatch_reason(rank, entry["sig"], seq, label, major)})
        if not out:
            out = self._late_culprits(group, at, seq)
        if not out:
            for rank in group["not_started"]:
                out.append({"rank": rank, "pg": label, "seq": seq, "op": at[rank]["op"], "basis": "not_started",
                            "frames": at[rank]["frames"],
                            "reason": "rank %d enqueued collective #%d of process group %s but its GPU never started "
                                      "it, while the other ranks' GPUs did" % (rank, seq, label)})
        if not out:
            for rank in group["missing_dump"]:
                out.append({"rank": rank, "pg": label, "seq": seq, "op": group["stuck_op"], "basis": "missing_dump",
                            "frames": [],
                            "reason": "rank %d left no dump while every rank that did joined collective #%d of "
                                      "process group %s: its process died or hung before it could dump"
                                      % (rank, seq, label)})
            why = {item["rank"]: item["error"] for item in reversed(self.refused)}
            for rank in group["refused_dump"]:
                out.append({"rank": rank, "pg": label, "seq": seq, "op": group["stuck_op"], "basis": "refused_dump",
                            "frames": [],
                            "reason": "rank %d's dump could not be read (%s) while every rank whose dump was read "
                                      "joined collective #%d of process group %s: what rank %d did is not known from "
                                      "the dumps" % (rank, why.get(rank), seq, label, rank)})
        return out

    def _first_mismatch(self):
        if not self.odd:
            return None
        key, seq = min(self.odd, key=lambda ks: (ks[1], ks[0]))
        variants = {sig: sorted(ranks) for sig, ranks in self.odd[(key, seq)].items()}
        others = sum(len(r) for r in variants.values())
        # The first signature's ranks are not listed (most ranks agree): they are the members minus the others.
        listed = set(r for ranks in variants.values() for r in ranks)
        members = sorted(r for r, info in self.ranks.items() if key in info["pgs"] and r not in listed)
        variants[self.refs[key][seq]] = members[: self.counts[key][seq] - others]
        ordered = sorted(variants.items(), key=lambda kv: (len(kv[1]), kv[0]))
        odd = ordered[0][1] if len(ordered[0][1]) < len(ordered[-1][1]) else []
        frames = {}
        for rank in odd[:8]:
            entry = self._entry(rank, key, seq)
            frames[rank] = entry["frames"] if entry else []
        name, desc = self.names.get(key, (key, None))
        return {"pg": desc or name, "seq": seq, "variants": [{"sig": s, "ranks": r} for s, r in ordered],
                "odd_ranks": odd, "frames": frames}


def _culprits_of_mismatch(first):
    """No group left a collective open, yet the ranks ran different collectives at one sequence number: that is what
    stopped the job. gloo records a collective that failed with its timeout as completed, so whether its dump shows
    the collective open depends on when the rank dumped."""
    major = first["variants"][-1]
    out = []
    for rank in first["odd_ranks"]:
        sig = next(v["sig"] for v in first["variants"] if rank in v["ranks"])
        out.append({"rank": rank, "pg": first["pg"], "seq": first["seq"], "op": sig.split("(", 1)[0],
                    "basis": "mismatch", "frames": first["frames"].get(rank) or [],
                    "reason": _mismatch_reason(rank, sig, first["seq"], first["pg"], major)})
    return out


def _mismatch_reason(rank, sig, seq, label, major):
    return "rank %d ran %s at collective #%d of process group %s while rank(s) %s ran %s" % (
        rank, sig, seq, label, _short(major["ranks"]), major["sig"])


def _late(at):
    """Ranks whose entry was created more than the first rank's timeout after the first rank's entry: the first had
    timed out waiting before they came. Needs the creation times and the timeout (dumps before version 2.10 have no
    timeout: then no rank is late)."""
    created = {r: e["time_created_ns"] for r, e in at.items() if e.get("time_created_ns")}
    if len(created) < 2:
        return []
    first = min(created, key=lambda r: (created[r], r))
    timeout_ms = at[first].get("timeout_ms")
    if not timeout_ms:
        return []
    return sorted(r for r, t in created.items() if t - created[first] > timeout_ms * 1e6)


def _seconds(ms):
    return "%g s" % round(ms / 1000.0, 3)


def _short(ranks, limit=8):
    text = ",".join(str(r) for r in ranks[:limit])
    return text + (",... (%d ranks)" % len(ranks) if len(ranks) > limit else "")


def _payloads(items, acc):
    for rank, name, data in items:
        try:
            payload = data() if callable(data) else data
        except (OSError, ValueError) as exc:
            acc.refuse(rank, name, "%s: could not be read (%s)" % (name, exc))
            continue
        yield rank, name, payload


def _read_in_worker(read, payload, rank, name, limits):
    """Run in a pool process: the reading, and what it cost that process so far (pid, peak RSS in KiB, CPU s)."""
    import os
    import resource

    result = read(payload, rank, name, **limits)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return result, (os.getpid(), usage.ru_maxrss, usage.ru_utime + usage.ru_stime)


_WORKER_MARGIN_BYTES = 512 * 1024 * 1024  # the reduction's own objects and the allocator's slack, over the limit


def worker_setup(roots, max_memory):
    """(initializer, initargs) of a dump-reading pool process: the directory holding ansible_collections/ on its path
    and its address space bounded (RLIMIT_AS) to its size at start plus the dump memory limit and a margin, so a dump
    that fools the memory estimate ends in a MemoryError there (that dump is refused), never in the controller's
    memory. exec of stdlib-only source: the child cannot import this collection before its path is set."""
    source = "import site\nfor root in %r: site.addsitedir(root)\n" % (list(roots),)
    if max_memory:
        source += ("import os, resource\n"
                   "with open('/proc/self/statm') as fh: size = int(fh.read().split()[0]) * os.sysconf('SC_PAGE_SIZE')\n"
                   "limit = size + %d\n"
                   "_soft, hard = resource.getrlimit(resource.RLIMIT_AS)\n"
                   "if hard == resource.RLIM_INFINITY or hard > limit:\n"
                   "    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))\n" % (int(max_memory) + _WORKER_MARGIN_BYTES))
    return exec, (source,)


def _parallel(jobs, read, workers, limits, costs):
    """Yield (rank, name, (reduced, error)) in order, reading up to `workers` dumps at once in child processes, at
    most 2 * workers dumps in flight. None when no pool. The children come from a fork server: they start clean
    (none of the caller's memory, e.g. every node's evidence), and with the restricted reader only."""
    import concurrent.futures
    import multiprocessing
    import os
    from pathlib import Path

    # Under Ansible this module is found by Ansible's collection loader, which a fresh process does not have: the
    # workers get the directory that holds ansible_collections/ on their path (site.addsitedir: a stdlib function,
    # so the initializer itself needs no import of this collection).
    here = Path(os.path.abspath(__file__))  # not resolved: the repository links ansible_collections back to itself
    roots = [str(p.parent) for p in here.parents if p.name == "ansible_collections"][:1]
    initializer, initargs = worker_setup(roots, limits.get("max_memory"))
    try:
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"),
                                                      initializer=initializer, initargs=initargs)
    except (OSError, ValueError, ImportError, NotImplementedError):
        return None

    def run():
        pending = []
        with pool:
            for rank, name, payload in jobs:
                pending.append((rank, name, pool.submit(_read_in_worker, read, payload, rank, name, limits)))
                while len(pending) >= 2 * workers:
                    r, n, future = pending.pop(0)
                    result, (pid, rss_kb, cpu_s) = future.result()
                    costs[pid] = (rss_kb, cpu_s)
                    yield r, n, result
            for r, n, future in pending:
                result, (pid, rss_kb, cpu_s) = future.result()
                costs[pid] = (rss_kb, cpu_s)
                yield r, n, result
    return run()


def analyse_dumps(items, world_size=None, read=None, workers=0, unread=(), **limits):
    """items: iterable of (rank, name, bytes or callable returning bytes). Returns the analysis dict; never raises.
    unread: [{rank, file, host, error}] dumps that exist but were not sent (too large, outside the limits): refused
    like the ones the reader refuses, never counted as missing.

    Bytes are read and dropped one dump at a time, so a callable keeps a large job's dumps out of memory until used.
    workers > 1 reads dumps in that many child processes (the action uses the CPUs of the controller); a pool that
    cannot start, or dies, falls back to reading them here.
    """
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem.dump_reader import read_dump

    read = read or read_dump
    acc = FlightAccumulator()
    acc.refused.extend(dict(u) for u in unread or ())
    items = list(items)
    done, costs = set(), {}
    parallel = workers and workers > 1 and len(items) >= 16  # a pool costs a start-up: not worth it for a few dumps
    results = _parallel(_payloads(items, acc), read, workers, limits, costs) if parallel else None
    if results is not None:
        try:
            for rank, name, (reduced, error) in results:
                done.add((rank, name))
                if error:
                    acc.refuse(rank, name, error)
                else:
                    acc.add(reduced)
        except Exception as exc:  # a broken pool (a worker killed): read the rest here
            acc.problems.append("parallel dump reading stopped (%s): the rest was read serially" % exc)
    for rank, name, payload in _payloads([i for i in items if (i[0], i[1]) not in done], acc):
        reduced, error = read(payload, rank, name, **limits)
        payload = None
        if error:
            acc.refuse(rank, name, error)
        else:
            acc.add(reduced)
    out = acc.analyse(world_size)
    out["workers"] = {"processes": len(costs), "peak_rss_mb": round(max([c[0] for c in costs.values()] or [0]) / 1024.0,
                                                                     1),
                      "cpu_s": round(sum(c[1] for c in costs.values()), 3)}
    return out
