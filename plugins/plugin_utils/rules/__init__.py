# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The judgement layer (controller side): one host's variables -> the report's node (verdict, findings, GPUs).

Every verdict is recomputed here from the modules' observations with the inventory's thresholds, by the same judge
functions the modules use on the node (plugins/module_utils/judge_*.py); the node's own verdict is never read. Each
result is checked against its module's JSON Schema first (reading.py): a result that does not match is an error that
names the key. One file per signal reads one schema: health (gpu_facts, busy GPUs), xid, samples (gpu_sample), burn,
dcgm, nccl, storage, env, dryrun; reach decides whether the node took part to the end.

Node and GPU verdicts: pass < warn < error < fail, and `unreachable` for a node that dropped out. A proven failure
outranks "could not run": it carries evidence and a concrete action, while error only says "unknown".
"""

from __future__ import annotations

from collections import namedtuple

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import lines, rank, worst
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import resolve
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import (
    burn,
    dcgm,
    dryrun,
    env,
    fabric,
    health,
    ib,
    nccl,
    nvlink,
    reach,
    samples,
    snapshot,
    storage,
    xid,
)
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.node import Node
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import (
    mapping,
    read_result,
    schema_errors,
    xid_after,
    xid_before,
)

# Findings made here rather than by a judge: code -> (severity, what it means). docs/rules.md is generated from these.
CODES = {
    "CONFIG_INVALID": ("error", "an inventory threshold of the wrong type (the default is used meanwhile)"),
    "RESULT_INVALID": ("error", "a result that does not match its module's schema; the message names the key"),
    "RULE_ERROR": ("error", "a rule crashed on this node's data (a bug: report it with report.json)"),
    "VARIABLE_UNREADABLE": ("error", "a gpufleet_* variable of the host does not template; the message says why"),
}

# A finding that says a tool every other reading depends on failed -> the codes that, on that node, follow from it.
# They become evidence under it (one headline naming the tool and its fix), never findings of their own: a GPU table
# nvidia-smi could not read is no reason to reseat risers, and an all_reduce run on the one GPU the stage could count
# measures nothing between GPUs.
CONSEQUENCES = {
    "GPU_FACTS_UNREADABLE": ("GPU_MISSING", "NCCL_BUSBW_LOW", "NCCL_NO_FIGURE", "NVLINK_UNREADABLE", "SAMPLES_MISSING",
                             "SAMPLES_NOT_UNDER_LOAD", "DCGM_NOT_RUN"),
}

# Registered results: gpufleet_result_<module> -> the rules file that judges it (the pipeline below orders them).
CHECKS = (("health_snapshot", snapshot), ("gpu_sample", samples), ("gpu_burn", burn), ("dcgm_diag", dcgm),
          ("nccl_test", nccl), ("checkpoint_storage", storage), ("training_env_facts", env), ("train_dryrun", dryrun), ("fabric", fabric),
          ("ib_ports", ib))
# Registered results that carry facts judged elsewhere (the GPU table, the XID reads) or the run's own record.
_OTHER_RESULTS = ("gpu_facts", "xid_facts", "run", "nvlink_facts")
_FACT_KEYS = ("gpufleet_gpus", "gpufleet_gpu_count", "gpufleet_driver_version", "gpufleet_gpu_problems",
              "gpufleet_pci_gpus")


# The burn's job carries the samples taken beside it and the InfiniBand ports read around it (one node-side job, one
# result registered as gpufleet_result_gpu_burn): each is a check of its own, split off here.
BURN_PARTS = (("sampling", "gpu_sample", "not sampled"), ("ib_ports", "ib_ports", "not read"))
# It also makes the reads after the load (gpu_burn's nvlink_after, xid_window) as those modules' results: read as if
# registered by their own tasks, which make them instead where the job did not (the burn stage failed).
AFTER_LOAD = (("nvlink_after", "nvlink_facts"), ("xid_window", "xid_facts"))
# The burn-in's dcgm job runs NCCL after dcgmi diag where both run (dcgm_diag's nccl_after): that part is the NCCL
# check's result, over the NCCL task's own (skipped for it).
DCGM_NCCL = "nccl_after"


def _results(hv):
    results = {k[len("gpufleet_result_"):]: v for k, v in hv.items() if k.startswith("gpufleet_result_")}
    dcgm = results.get("dcgm_diag")
    if isinstance(dcgm, dict) and isinstance(dcgm.get(DCGM_NCCL), dict):
        results["nccl_test"] = dcgm[DCGM_NCCL]
        results["dcgm_diag"] = {k: v for k, v in dcgm.items() if k != DCGM_NCCL}
    burn = results.get("gpu_burn")
    if not isinstance(burn, dict) or burn.get("skipped") or (burn.get("failed") and "verdict" not in burn):
        return results  # a stage that never got the job's result records its own reason (skip, rescue)
    for key, name in AFTER_LOAD:
        if isinstance(burn.get(key), dict):
            results.setdefault(name, burn[key])
    burn = results["gpu_burn"] = {k: v for k, v in burn.items() if k not in dict(AFTER_LOAD)}
    parts = {key: burn[key] for key, _name, _verb in BURN_PARTS if key in burn}
    why = burn.get("not_run") or mapping(burn.get("tool")).get("error")
    if not parts and not why:
        return results  # registered before the job carried its parts: they are results of their own, or absent
    results["gpu_burn"] = {k: v for k, v in burn.items() if k not in parts}
    for key, name, verb in BURN_PARTS:
        # A part missing from the job's result is a skipped check with the burn's reason, never a pass.
        results.setdefault(name, parts[key] if key in parts else {
            "skipped": True, "skip_reason": "%s: %s" % (verb, why or "the burn returned none")})
    return results


def _invalid(node, check, reason):
    node.add("error", "RESULT_INVALID", "%s: the %s result does not match its schema: %s" % (node.host, check, reason),
             "report this as a kentino.gpufleet bug with report.json (node and controller run different versions?)",
             [reason], check=check)


def _facts(node, hv, results):
    """The gpu_facts facts (validated), the XID reads (validated) and why the read after the burn is missing (or
    None); None/[] with an error finding for what does not validate."""
    facts_in = mapping(hv.get("ansible_facts"))
    facts = {k: facts_in[k] for k in _FACT_KEYS if k in facts_in}
    if facts:
        errors = schema_errors("gpu_facts", facts)
        if errors:
            _invalid(node, "gpu_facts", "; ".join(errors))
            facts = None
    after, unread = xid_after(hv, results)
    xids = []
    for read in (xid_before(hv), after):
        if read is None:
            continue
        errors = schema_errors("xid_facts", read)
        if errors:
            _invalid(node, "xid_facts", "; ".join(errors))
        else:
            xids.append(read)
    return facts or None, xids, unread


def _check_state(node, name, state, reason):
    if state == "skipped":
        # The stage's own reason (disabled by a variable, refused for a busy GPU, check mode), never Ansible's
        # "Conditional result was False".
        node.set_check(name, "skipped", ["not run: %s" % reason])
        node.not_run.add(name)
    elif state == "invalid":
        _invalid(node, name, reason)
        node.set_check(name, "error", [reason])
    elif state == "failed":
        node.add("error", "CHECK_ERROR", "%s: %s could not run: %s" % (node.host, name, reason),
                 "make %s runnable on %s (see the reason), then rerun; no result is not a pass" % (name, node.host),
                 [reason], check=name)
        node.set_check(name, "error", [reason])
    elif state == "unreachable":
        node.set_check(name, "error", [reason])  # the node's UNREACHABLE finding carries it


def _guard(node, name, rule):
    try:
        rule()
    except Exception as exc:  # a rule bug must not lose the report: it shows as an error naming the rule
        node.add("error", "RULE_ERROR", "%s: rule %s crashed on this host's data: %s: %s" % (
            node.host, name, type(exc).__name__, exc), "report this as a kentino.gpufleet bug with report.json",
            [repr(exc)], check=name)


class Rule(namedtuple("Rule", "name reads writes run")):
    """One step of a node's judgement: what it reads (inputs of the node, or what earlier rules wrote), what it writes
    (into the context; "findings" for a rule that adds findings), and run(node, ctx). The order of the steps follows
    from reads and writes (ordered()), never from where a rule happens to be written."""


# What the pipeline starts from: the host's variables, its registered results (and those read through the schema
# door), the GPU table's facts, the XID reads.
INPUTS = ("hv", "results", "read", "facts", "xid_reads", "xid_unread", "in_play_hosts")
# What a rule's output is before it runs (or when it crashed: RULE_ERROR): the next ones still judge.
CTX_DEFAULTS = {"lost": [], "interconnect": None, "reachable": True, "stage": None}


def _problem_sources(ctx):
    sources = [("gpu_facts", (ctx["facts"] or {}).get("gpufleet_gpu_problems"))]
    return sources + [(n, (ctx["read"].get(n) or {}).get("problems")) for n in ("gpu_sample", "gpu_burn")]


def _gpu_table(node, ctx):
    if ctx["facts"]:
        health.read_gpus(node, ctx["facts"])
    node.table_gpus = set(node.gpus)


def _lost(node, ctx):
    ctx["lost"] = xid.lost_entries(ctx["xid_reads"], _problem_sources(ctx))


def _gpu_facts(node, ctx):
    if ctx["facts"]:
        # In an audit a busy GPU is production work, not a finding.
        audit = mapping(ctx["results"].get("health_snapshot")).get("mode") == "audit"
        health.apply(node, ctx["facts"], [e.get("pci") for e in ctx["lost"] if e.get("pci")],
                     busy_is_finding=not audit)


def _nvlink(node, ctx):
    # Two reads of a facts module, like the XIDs; the interconnect it finds is NCCL's reference's.
    ctx["interconnect"] = nvlink.apply(node, ctx["hv"], ctx["results"].get(nvlink.MODULE))


def _check(name, rule, reads=()):
    def run(node, ctx):
        data = ctx["read"].get(name)
        if data is not None:
            rule.apply(node, data, **dict((key, ctx[key]) for key in reads))
    return Rule(name, ("read", "gpu_table") + tuple(reads), ("findings",), run)


def _sample_coverage(node, ctx):
    # The samples were taken beside a load when the burn did work: a GPU never seen loaded is then unchecked.
    burn, data = ctx["read"].get("gpu_burn") or {}, ctx["read"].get("gpu_sample")
    loaded = bool(burn.get("frames")) and any((g.get("processed") or 0) > 0 for g in burn.get("gpus") or [])
    if data is not None and loaded:
        lost = [e.get("pci") or e.get("index") for e in ctx["lost"] if e.get("pci") or e.get("index") is not None]
        samples.coverage(node, data, lost)


def _reach(node, ctx):
    ctx["reachable"], ctx["stage"] = reach.apply(node, ctx["hv"], ctx["results"], ctx["in_play_hosts"])


PIPELINE = [
    Rule("gpu_table", ("facts",), ("gpu_table",), _gpu_table),
    Rule("lost", ("xid_reads", "facts", "read"), ("lost",), _lost),
    Rule("xid_facts", ("xid_reads", "xid_unread", "facts", "read", "gpu_table"), ("findings",),
         lambda node, ctx: xid.apply(node, ctx["xid_reads"], _problem_sources(ctx), ctx["xid_unread"])),
    Rule("gpu_facts", ("facts", "results", "gpu_table", "lost"), ("findings",), _gpu_facts),
    Rule("nvlink", ("hv", "results", "gpu_table"), ("findings", "interconnect"), _nvlink),
    Rule(samples.COVERAGE, ("read", "lost"), ("findings",), _sample_coverage),
    Rule("reach", ("hv", "results", "in_play_hosts"), ("findings", "reachable", "stage"), _reach),
    # Last: it reads every finding (a tool's failure and what follows from it on the node).
    Rule("consequences", ("findings",), ("folded",), lambda node, ctx: _fold_consequences(node)),
] + [_check(name, rule, ("interconnect",) if rule is nccl else ()) for name, rule in CHECKS]


def ordered(rules):
    """The rules in an order where each runs after every rule that writes what it reads (declaration order breaks
    ties). ValueError for what no rule writes and no input gives, and for a cycle."""
    writers = {}
    for rule in rules:
        for key in rule.writes:
            writers.setdefault(key, []).append(rule.name)
    after = {}
    for rule in rules:
        for key in rule.reads:
            if key not in INPUTS and key not in writers:
                raise ValueError("rule %s reads %s, which no rule writes" % (rule.name, key))
        after[rule.name] = {w for key in rule.reads for w in writers.get(key, ()) if w != rule.name}
    out, done = [], set()
    while len(out) < len(rules):
        ready = [r for r in rules if r.name not in done and after[r.name] <= done]
        if not ready:
            raise ValueError("the rules %s wait on each other" % ", ".join(r.name for r in rules if r.name not in done))
        out.append(ready[0])
        done.add(ready[0].name)
    return out


ORDER = ordered(PIPELINE)


def evaluate_node(host, hv, in_play_hosts=None):
    """One host's gpufleet_* variables and facts (plain data) -> the report's node dict. Never raises."""
    hv = hv if isinstance(hv, dict) else {}
    thresholds, sources, config_errors = resolve(hv, host)
    node = Node(host, thresholds, sources)
    for message in config_errors:
        node.add("error", "CONFIG_INVALID", message, "correct the inventory variable and rerun", [message],
                 check="config")
    results = _results(hv)
    # What hostvars.read_host could not read (a value that does not template) comes as this pseudo result.
    for message in mapping(results.pop("report_input", None)).get("reasons") or []:
        node.add("error", "VARIABLE_UNREADABLE", message,
                 "fix that variable of %s in the inventory (the message says why it does not template), then rerun"
                 % host, [message], check="config")
    facts, xid_reads, xid_unread = _facts(node, hv, results)
    read = {}
    for name, _rule in CHECKS:
        if name in results:
            state, data, reason = read_result(name, results[name])
            read[name] = data if state == "ok" else None
            not_applicable = getattr(_rule, "not_applicable", None)
            # A stage that did not start its module (data None) says why in its reason: read as the module's not_run.
            absent = (not_applicable(data if data is not None else {"not_run": reason})
                      if not_applicable and state == "skipped" else None)
            if absent:
                # the hardware the check reads is not there: skipped with the module's reason, but not among the
                # checks the node left out (switched off, refused), which the node's summary lists
                node.set_check(name, "skipped", [absent])
            else:
                _check_state(node, name, state, reason)
    for name in sorted(set(results) - {n for n, _ in CHECKS} - set(_OTHER_RESULTS)):
        _invalid(node, name, "gpufleet_result_%s is not a result this collection knows (known: %s)" % (
            name, ", ".join(n for n, _ in CHECKS)))
    ctx = dict(CTX_DEFAULTS, hv=hv, results=results, read=read, facts=facts, xid_reads=xid_reads,
               xid_unread=xid_unread, in_play_hosts=in_play_hosts)
    for rule in ORDER:
        _guard(node, rule.name, lambda rule=rule: rule.run(node, ctx))
    _check_verdicts(node)
    return _finish(node, ctx["reachable"], ctx["stage"])


def _fold_consequences(node):
    """Findings that follow from a tool's failure (CONSEQUENCES) become the evidence of that failure; their checks
    are error (not judged: their input was unknown), and the GPUs the tool could not read are unknown (error)."""
    for cause, codes in CONSEQUENCES.items():
        head = next((f for f in node.findings if f["code"] == cause), None)
        if head is None:
            continue
        folded = [f for f in node.findings if f["code"] in codes]
        head["evidence"] = lines(head["evidence"] + ["consequence, not a finding of its own: %s (%s): %s" % (
            f["code"], f["check"], f["message"]) for f in folded], 40)
        node.findings = [f for f in node.findings if f["code"] not in codes]
        for name in sorted({f["check"] for f in folded}):
            node.set_check(name, "error", ["not judged: %s" % head["message"]],
                           (node.checks.get(name) or {}).get("figures"))
        if cause == "GPU_FACTS_UNREADABLE":
            node.unknown_gpus = set(node.gpus) - node.table_gpus


def _check_verdicts(node):
    """Every check's verdict covers its findings, including those added after it was judged (a refusal, a stop);
    findings of run-level checks (config, run, reachability) get a check of their own. Checks are never
    `unreachable`: that is the node's verdict."""
    for f in node.findings:
        check = node.checks.get(f["check"])
        if check is None:
            node.set_check(f["check"], "pass")
            check = node.checks[f["check"]]
        severity = "error" if f["severity"] == "unreachable" else f["severity"]
        if check["verdict"] == "skipped" or rank(severity) > rank(check["verdict"]):
            check["verdict"] = severity
        if f["message"] not in check["reasons"]:
            check["reasons"].append(f["message"])


def _finish(node, reachable, stage):
    findings = sorted(node.findings, key=lambda f: -rank(f["severity"]))  # stable: rule order within a severity
    gpus = []
    for index in sorted(node.gpus):
        gpu = node.gpus[index]
        own = [f for f in findings if f["gpu"] == index]
        unknown = ["error"] if index in node.unknown_gpus else []  # not in the GPU table nvidia-smi failed to give
        gpus.append({"index": index, "pci": gpu.get("pci"), "serial": gpu.get("serial"), "name": gpu.get("name"),
                     "uuid": gpu.get("uuid"), "verdict": worst([f["severity"] for f in own] + unknown),
                     "findings": own, "metrics": gpu["metrics"]})
    verdict = "unreachable" if not reachable else worst(f["severity"] for f in findings)
    worst_finding = findings[0] if findings else None
    if not reachable:
        # Evidence gathered before the node vanished (a PSU rail lost, a GPU off the bus) explains it best.
        worst_finding = next((f for f in findings if f["severity"] == "fail"), worst_finding)
    return {
        "host": node.host,
        "verdict": verdict,
        "stage": stage,
        "reachable": reachable,
        "skipped": sorted(name for name in node.not_run if node.checks[name]["verdict"] == "skipped"),
        "worst": worst_finding,
        "action": worst_finding["action"] if worst_finding else None,
        "gpus": gpus,
        "findings": findings,
        "checks": node.checks,
        "thresholds": dict(node.t),
        "threshold_sources": node.sources,
        "series": node.series,
        "xid_timeline": node.timeline,
    }
