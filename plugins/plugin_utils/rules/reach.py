# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Did the node take part to the end? UNREACHABLE (with the real SSH error), RUN_STOPPED (a stage failed: the node
answered, so it is never read as lost), CHECKS_REFUSED (busy GPUs) and an interrupted run."""

from __future__ import annotations

import re

# Findings about the run on the node: code -> (severity, what it means). docs/rules.md is generated from these.
CODES = {
    "UNREACHABLE": ("unreachable", "the node dropped out: the real SSH error (does not resolve, refused, permission "
                                   "denied, no route, connection lost) or left the play without a result"),
    "RUN_STOPPED": ("error", "the node stopped between stages (an unexpected failure): the message names it"),
    "STAGE_ERROR": ("error", "a task after a check's module failed; the check's own result stays judged"),
    "CHECKS_REFUSED": ("error", "invasive checks refused: a GPU is busy and gpufleet_force is false"),
    "RUN_INTERRUPTED": ("error", "the run was interrupted (Ctrl-C) while the node was in a stage"),
}

# What the SSH error says -> the operator's words and the fix. First match wins.
_SSH_ERRORS = (
    (re.compile(r"Could not resolve hostname|Name or service not known|Temporary failure in name resolution", re.I),
     "hostname does not resolve", "fix the node's name or ansible_host in the inventory (or DNS)"),
    (re.compile(r"Connection refused", re.I), "connection refused",
     "start sshd on the node (or fix ansible_port); the machine answers but SSH does not"),
    (re.compile(r"Permission denied|Authentication failed|Too many authentication failures", re.I),
     "permission denied", "install the controller's SSH key for ansible_user on the node (or fix ansible_user)"),
    (re.compile(r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED", re.I),
     "host key verification failed", "check the node is the machine you expect, then update known_hosts"),
    (re.compile(r"No route to host|Network is unreachable", re.I), "no route to host",
     "check the node's power and network link (BMC/console), then rerun"),
    (re.compile(r"timed out|Timeout|Connection reset|Broken pipe|closed by remote host|Shared connection", re.I),
     "the connection was lost", "check the node's power, network and console log (a crash or a hang), then rerun"),
)


def interrupted_cleanup(cleanup):
    """(evidence, action) of an interrupted node from what the run_record callback's stop did there (its
    gpufleet_interrupt_cleanup: {"stopped", "msg"} or {"error"}; absent when it could not try)."""
    if isinstance(cleanup, dict) and isinstance(cleanup.get("stopped"), list):
        return ("stopped on the node before this report: %s" % (cleanup.get("msg") or "%d process group(s)"
                                                                 % len(cleanup["stopped"])), "rerun")
    why = cleanup.get("error") if isinstance(cleanup, dict) else None
    return ("the run's work on the node was not stopped%s" % (": %s" % why if why else
                                                             " (the run_record callback did not run the stop)"),
            "its checks stop by themselves when the run's lease lapses (gpufleet_lease_timeout_s); "
            "`gpufleet abort` (or playbooks/abort.yml) stops them at once; then rerun")


def ssh_reason(message):
    """(short reason, action) from an Ansible unreachable message."""
    for regex, reason, action in _SSH_ERRORS:
        if regex.search(message or ""):
            return reason, action
    return "unreachable", "bring the node back (power, network, sshd), check the BMC/console log, then rerun"


def unreachable_during(results):
    """(check name, message) of the first registered result that says the node was unreachable, else None."""
    for name, result in sorted(results.items()):
        if isinstance(result, dict) and result.get("unreachable"):
            return name, str(result.get("msg") or "host unreachable")
    return None


def stage_reached(host, hv):
    """The stage the node was in last: its own gpufleet_stage where a run set it (`done` per node, in runs before the
    stage `done` was entered by all at once), else its entry in gpufleet_stages, the {node: stage} fact every stage's
    first task updates for all the nodes of the play at once (roles/gpufleet/tasks/stage_enter.yml; `done` once it
    finished). None before the first stage."""
    stage = hv.get("gpufleet_stage")
    if stage is None:
        stages = hv.get("gpufleet_stages")
        stage = stages.get(host) if isinstance(stages, dict) else None
    return str(stage) if stage is not None else None


def completed(host, hv):
    """The node finished the run: it entered the stage `done` (or, in runs before that, its own gpufleet_completed)."""
    return hv.get("gpufleet_completed") is True or stage_reached(host, hv) == "done"


def apply(node, hv, results, in_play_hosts):
    """Add the run-level findings; returns (reachable, stage)."""
    stage = stage_reached(node.host, hv)
    refused = hv.get("gpufleet_refused_reason")
    if refused:
        node.add("error", "CHECKS_REFUSED", "%s: %s" % (node.host, refused),
                 "stop the processes on the busy GPUs (or set gpufleet_force=true) and rerun", [str(refused)],
                 check="gpu_facts")
    for failure in hv.get("gpufleet_stage_failures") or []:
        result = results.get(failure.get("result")) if isinstance(failure, dict) else None
        if isinstance(result, dict) and "verdict" in result:
            # The check returned its result, then a later task of its stage failed: both are shown, the failure as
            # the run's (the check's verdict stays its judge's, the one the module gave on the node).
            node.add("error", "STAGE_ERROR", "%s: after %s: %s" % (node.host, failure.get("result"), failure.get("msg")),
                     "fix what the message names on %s, then rerun" % node.host, [failure.get("msg")], check="run")
    stopped = hv.get("gpufleet_result_run")
    if isinstance(stopped, dict) and stopped.get("msg"):
        # The node answered: a stage failed (an invalid value, a bug). Its earlier results stay judged.
        node.add("error", "RUN_STOPPED", "%s: stopped at stage %s: %s" % (node.host, stopped.get("stage") or stage,
                                                                         stopped["msg"]),
                 "fix what the message names on %s (inventory values are checked against the role's argument "
                 "spec), then rerun" % node.host, stopped.get("evidence") or [stopped["msg"]], check="run")
        return True, stage
    lost = unreachable_during(results)
    if lost is not None:
        name, message = lost
        reason, action = ssh_reason(message)
        node.add("unreachable", "UNREACHABLE", "%s: %s during %s" % (node.host, reason, name),
                 "%s; then rerun from stage %s" % (action, stage or "start"), [message], check="reachability")
        return False, stage
    if completed(node.host, hv) or in_play_hosts is True:
        return True, stage
    if in_play_hosts is False or (stage is not None and stage != "done"):
        why = "left the play at stage %s without a result saying why" % (stage or "start")
    elif stage is None and not results and not isinstance(hv.get("ansible_facts"), dict):
        why = "no results at all: the host was never reached (or not part of the play)"
    else:
        return True, stage
    if hv.get("gpufleet_interrupted"):
        stopped, action = interrupted_cleanup(hv.get("gpufleet_interrupt_cleanup"))
        node.add("error", "RUN_INTERRUPTED", "%s: the run was interrupted at stage %s" % (node.host, stage or "start"),
                 action, [why, stopped], check="run")
        return True, stage
    node.add("unreachable", "UNREACHABLE", "%s: %s" % (node.host, why),
             "bring %s back (power, network, sshd), check the BMC/console log for a crash, then rerun from stage %s"
             % (node.host, stage or "start"), [why], check="reachability")
    return False, stage
