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

from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import resolve
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import (
    burn,
    dcgm,
    dryrun,
    env,
    health,
    nccl,
    nvlink,
    reach,
    samples,
    snapshot,
    storage,
    xid,
)
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.node import Node
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import read_result, schema_errors

SEVERITY_ORDER = ("pass", "warn", "error", "fail", "unreachable")
# Findings made here rather than by a judge: code -> (severity, what it means). docs/rules.md is generated from these.
CODES = {
    "CONFIG_INVALID": ("error", "an inventory threshold of the wrong type (the default is used meanwhile)"),
    "RESULT_INVALID": ("error", "a result that does not match its module's schema; the message names the key"),
    "RULE_ERROR": ("error", "a rule crashed on this node's data (a bug: report it with report.json)"),
    "VARIABLE_UNREADABLE": ("error", "a gpufleet_* variable of the host does not template; the message says why"),
}
_RANK = {v: i for i, v in enumerate(SEVERITY_ORDER)}

# Registered results: gpufleet_result_<module> -> the rules file that judges it. Order matters: the GPU table and
# the samples come before the checks that name GPUs.
CHECKS = (("health_snapshot", snapshot), ("gpu_sample", samples), ("gpu_burn", burn), ("dcgm_diag", dcgm),
          ("nccl_test", nccl), ("checkpoint_storage", storage), ("training_env_facts", env), ("train_dryrun", dryrun))
# Registered results that carry facts judged elsewhere (the GPU table, the XID reads) or the run's own record.
_OTHER_RESULTS = ("gpu_facts", "xid_facts", "run", "nvlink_facts")
_FACT_KEYS = ("gpufleet_gpus", "gpufleet_gpu_count", "gpufleet_driver_version", "gpufleet_gpu_problems",
              "gpufleet_pci_gpus")


def worst(verdicts, default="pass"):
    best = default
    for verdict in verdicts:
        if _RANK.get(verdict, _RANK["error"]) > _RANK.get(best, 0):
            best = verdict if verdict in _RANK else "error"
    return best


def rank(verdict):
    return _RANK.get(verdict, _RANK["error"])


def _results(hv):
    return {k[len("gpufleet_result_"):]: v for k, v in hv.items() if k.startswith("gpufleet_result_")}


def _mapping(value):
    return value if isinstance(value, dict) else {}


def _invalid(node, check, reason):
    node.add("error", "RESULT_INVALID", "%s: the %s result does not match its schema: %s" % (node.host, check, reason),
             "report this as a kentino.gpufleet bug with report.json (node and controller run different versions?)",
             [reason], check=check)


def _facts(node, hv):
    """The gpu_facts facts (validated) and the XID reads (validated), or None/[] with an error finding."""
    facts_in = _mapping(hv.get("ansible_facts"))
    facts = {k: facts_in[k] for k in _FACT_KEYS if k in facts_in}
    if facts:
        errors = schema_errors("gpu_facts", facts)
        if errors:
            _invalid(node, "gpu_facts", "; ".join(errors))
            facts = None
    xids = []
    before = _mapping(_mapping(hv.get("gpufleet_xid_before")).get("ansible_facts")).get("gpufleet_xid")
    for read in (before, facts_in.get("gpufleet_xid")):
        if read is None:
            continue
        errors = schema_errors("xid_facts", read)
        if errors:
            _invalid(node, "xid_facts", "; ".join(errors))
        else:
            xids.append(read)
    return facts or None, xids


def _check_state(node, name, state, reason):
    if state == "skipped":
        # The stage's own reason (disabled by a variable, refused for a busy GPU, check mode), never Ansible's
        # "Conditional result was False".
        node.set_check(name, "skipped", ["not run: %s" % reason])
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
    for message in _mapping(results.pop("report_input", None)).get("reasons") or []:
        node.add("error", "VARIABLE_UNREADABLE", message,
                 "fix that variable of %s in the inventory (the message says why it does not template), then rerun"
                 % host, [message], check="config")
    facts, xid_reads = _facts(node, hv)
    if facts:
        health.read_gpus(node, facts)
    read = {}
    for name, _rule in CHECKS:
        if name in results:
            state, data, reason = read_result(name, results[name])
            read[name] = data if state == "ok" else None
            _check_state(node, name, state, reason)
    for name in sorted(set(results) - {n for n, _ in CHECKS} - set(_OTHER_RESULTS)):
        _invalid(node, name, "gpufleet_result_%s is not a result this collection knows (known: %s)" % (
            name, ", ".join(n for n, _ in CHECKS)))

    problem_sources = [("gpu_facts", (facts or {}).get("gpufleet_gpu_problems"))]
    problem_sources += [(n, (read.get(n) or {}).get("problems")) for n in ("gpu_sample", "gpu_burn")]
    lost = xid.lost_entries(xid_reads, problem_sources)
    _guard(node, "xid_facts", lambda: xid.apply(node, xid_reads, problem_sources))
    if facts:
        # In an audit a busy GPU is production work, not a finding.
        audit = _mapping(results.get("health_snapshot")).get("mode") == "audit"
        _guard(node, "gpu_facts", lambda: health.apply(node, facts, [e.get("pci") for e in lost if e.get("pci")],
                                                       busy_is_finding=not audit))
    # NVLink and fabric (two reads of a facts module, like the XIDs); before the checks: NCCL's reference needs it.
    _guard(node, "nvlink", lambda: nvlink.apply(node, hv))
    # The samples were taken beside a load when the burn did work: a GPU never seen loaded is then unchecked.
    burn = read.get("gpu_burn") or {}
    loaded = bool(burn.get("frames")) and any((g.get("processed") or 0) > 0 for g in burn.get("gpus") or [])
    lost_gpus = [e.get("pci") or e.get("index") for e in lost if e.get("pci") or e.get("index") is not None]
    for name, rule in CHECKS:
        if read.get(name) is None:
            continue
        if rule is samples:
            _guard(node, name, lambda data=read[name]: samples.apply(node, data, loaded, lost_gpus))
        else:
            _guard(node, name, lambda rule=rule, data=read[name]: rule.apply(node, data))
    reachable, stage = reach.apply(node, hv, results, in_play_hosts)
    _check_verdicts(node)
    return _finish(node, reachable, stage)


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
        gpus.append({"index": index, "pci": gpu.get("pci"), "serial": gpu.get("serial"), "name": gpu.get("name"),
                     "uuid": gpu.get("uuid"), "verdict": worst(f["severity"] for f in own),
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
