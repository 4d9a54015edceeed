# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Slurm's side of the lifecycle: the parsers of scontrol's and sinfo's node output, the policy (pure) and a thin
client that runs the commands as argv lists through a runner given to it (stdlib only: the module
kentino.gpufleet.slurm_node runs it on the Slurm controller host; the tests run it against a model of slurmctld).

`scontrol show node -o NODE` prints one line (src/api/node_info.c, slurm_sprint_node_table): `Key=value` pairs
separated by spaces, the state as BASE+FLAG+FLAG (node_state_string_complete: bases DOWN IDLE ALLOCATED ERROR MIXED
FUTURE UNKNOWN; flags such as DRAIN, COMPLETING, NOT_RESPONDING), and the reason near the end as
`Reason=<text> [<user>@<time>]`, its text free (spaces and `=` included), followed only by the optional Comment=,
Extra=, InstanceId=, InstanceType= and ReservationName= fields. A drained node is DRAIN without COMPLETING on a base
that is neither ALLOCATED nor MIXED (Slurm's own rule for DRAINED vs DRAINING in node_state_string); sinfo's `%T`
prints that word ("drained", "draining", with a `*`/`~`/`#`... suffix for other flags).

Policy: gpufleet owns only the drains whose reason starts with OWNER ("gpufleet:"). It never resumes a node drained
by someone else (as Slurm's Node Health Check leaves other reasons alone), never overwrites a foreign reason, never
repairs while a job is on the node (it waits for DRAINED up to a limit, then says so and the node stays quarantined),
and never cancels a job unless asked. Every failure of slurmctld (down, munge, unknown node, permissions, a timeout)
is a named state with a message; nothing is resumed on a guess.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

OWNER = "gpufleet:"
BASES = ("DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "UNKNOWN")
# Fields scontrol prints after Reason= (node_info.c): where a reason's free text ends.
AFTER_REASON = ("Comment", "Extra", "InstanceId", "InstanceType", "ReservationName")
NODE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
REASON_TAIL = re.compile(r" \[([^\]@ ]*)@([0-9T:-]+|Unknown)\]\Z")
REASON_TEXT = re.compile(r"\A[ -~]{1,200}\Z")  # printable ASCII, no control characters
# Named failures, in the order they are recognised: (state, pattern of scontrol's/sinfo's own messages, what to do).
FAILURES = (
    ("controller_down", re.compile(r"Unable to contact slurm controller|Slurmctld\S* at \S+ is DOWN|Socket timed out",
                                   re.I), "start slurmctld (systemctl status slurmctld) and check SlurmctldHost"),
    ("auth_failed", re.compile(r"Protocol authentication error|[Mm]unge|Invalid authentication credential|"
                               r"Zero Bytes were transmitted"),
     "check munged on this host and the controller, and that both have the same /etc/munge/munge.key"),
    ("unknown_node", re.compile(r"Node \S+ not found|Invalid node name specified"),
     "check the node's name in slurm.conf (NodeName=) and the inventory (gpufleet_slurm_node_name)"),
    # Slurm 22.05 answers an unprivileged node update with "slurm_update error: Invalid user id"
    ("permission_denied", re.compile(r"Access/permission denied|Permission denied|not authorized|Invalid user id",
                                     re.I),
     "run as root or SlurmUser, or as a user with AdminLevel=Admin (sacctmgr modify user ... set adminlevel=admin; "
     "Operator is not enough to update nodes)"),
)


class SlurmError(Exception):
    """Slurm could not be asked or refused: state (one of FAILURES' names, timeout, missing_tool, unparsed, bad_input)
    and a message naming the node, what failed and the fix."""

    def __init__(self, state, message):
        Exception.__init__(self, message)
        self.state = state


def check_node_name(name):
    if not isinstance(name, str) or not NODE_NAME.match(name):
        raise SlurmError("bad_input", "Slurm node name %r is not a node name (letters, digits, '.', '_', '-'; at most "
                                      "64): fix gpufleet_slurm_node_name or the inventory name" % (name,))
    return name


def classify(node, argv, rc, stdout, stderr, timed_out=False, error=None):
    """SlurmError for a failed scontrol/sinfo run (None when it succeeded)."""
    shown = " ".join(argv)
    if error:
        return SlurmError("missing_tool", "node %s: %s could not run (%s): install the Slurm client (slurm-client) on "
                                          "the host that runs the lifecycle, or set gpufleet_slurm_bin_dir" % (
                                              node, argv[0], error))
    if timed_out:
        return SlurmError("timeout", "node %s: `%s` did not answer in time: slurmctld is hung or unreachable; the "
                                     "node stays as it is" % (node, shown))
    if rc == 0:
        return None
    text = "\n".join(x for x in (stderr or "", stdout or "") if x).strip()
    for state, pattern, fix in FAILURES:
        if pattern.search(text):
            return SlurmError(state, "node %s: `%s` failed (%s): %s" % (node, shown, _last(text), fix))
    return SlurmError("failed", "node %s: `%s` exited %s: %s" % (node, shown, rc, _last(text) or "no output"))


def _last(text):
    return (text.strip().splitlines() or [""])[-1][:300]


def parse_node(text):
    """One node of `scontrol show node -o NODE` -> {name, state, base, flags, reason, reason_user, reason_time,
    drain, drained, draining, not_responding, owned}, or None when the text holds no NodeName= line."""
    line = next((x for x in (text or "").splitlines() if x.startswith("NodeName=")), None)
    if line is None:
        return None
    reason = reason_user = reason_time = None
    head = line
    if " Reason=" in line:
        head, rest = line.split(" Reason=", 1)
        cut = [m.start() for m in (re.search(r" %s=" % k, rest) for k in AFTER_REASON) if m]
        reason = rest[:min(cut)] if cut else rest
        tail = REASON_TAIL.search(reason.rstrip())
        if tail:
            reason, reason_user, reason_time = reason.rstrip()[:tail.start()], tail.group(1), tail.group(2)
        reason = reason.strip()
    fields = dict(m.groups() for m in re.finditer(r"(?:^| )([A-Za-z_]+)=(\S*)", head))
    parts = (fields.get("State") or "UNKNOWN").split("+")
    base, flags = parts[0].upper(), [p.upper() for p in parts[1:] if p]
    drain = "DRAIN" in flags
    busy = base in ("ALLOCATED", "MIXED") or "COMPLETING" in flags
    return {"name": fields.get("NodeName"), "state": fields.get("State"), "base": base, "flags": flags,
            "reason": reason, "reason_user": reason_user, "reason_time": reason_time, "drain": drain,
            "drained": drain and not busy, "draining": drain and busy, "not_responding": "NOT_RESPONDING" in flags,
            "owned": owned(reason)}


def parse_sinfo_state(text):
    """`sinfo -h -N -n NODE -o %T` -> Slurm's word for the node's state (drained, draining, idle, mixed, ...), lower
    case, its flag suffix (* ~ # ! % $ @ ^ -) removed; None for empty output."""
    words = (text or "").split()
    return words[0].lower().rstrip("*~#!%$@^-+") if words else None


def owned(reason):
    return isinstance(reason, str) and reason.startswith(OWNER)


def drain_reason(code, gpu=None, detail=None):
    """The reason gpufleet drains with: "gpufleet: <code> <gpu> <detail>", one printable line Slurm keeps as is."""
    words = [OWNER, code] + [str(w) for w in (gpu, detail) if w not in (None, "")]
    text = " ".join(words)
    if not re.match(r"\A[A-Z][A-Z0-9_]{0,63}\Z", code or "") or not REASON_TEXT.match(text):
        raise SlurmError("bad_input", "drain reason %r: the code must be UPPER_SNAKE and the whole reason one line of "
                                      "printable ASCII of at most 200 characters" % text)
    return text


# ---- the policy (pure) -------------------------------------------------------------------------------------------
def decide_drain(node):
    """(action, why) for a quarantine: drain, or keep (already drained: ours, or someone else's reason, left as is)."""
    if node["drain"] and node["owned"]:
        return "keep", "already drained by gpufleet (%s)" % node["reason"]
    if node["drain"]:
        return "keep", "already drained by someone else (%r): their reason is left as it is, and gpufleet will not " \
                       "resume it" % node["reason"]
    return "drain", "drain it"


def decide_resume(node):
    """(action, why) for a return to service: resume only a drain gpufleet owns."""
    if not node["drain"]:
        return "none", "not drained: nothing to resume (state %s)" % node["state"]
    if not node["owned"]:
        return "refuse", "drained by someone else (reason %r, set by %s): gpufleet resumes only its own drains; " \
                         "whoever drained it resumes it (scontrol update nodename=%s state=resume)" % (
                             node["reason"], node["reason_user"] or "?", node["name"])
    return "resume", "resume it (its drain is gpufleet's: %s)" % node["reason"]


def decide_repair(node, waited_s, limit_s, cancel_jobs=False):
    """(action, why) before a repair rung: repair on a DRAINED node only; wait while jobs drain, up to limit_s; then
    cancel the jobs when asked, else give up (the node stays quarantined, drained)."""
    if not node["drain"]:
        return "refuse", "not drained (state %s): drain it before any repair" % node["state"]
    if node["drained"]:
        return "repair", "drained: no job runs on it"
    if waited_s < limit_s:
        return "wait", "draining (state %s): a job still runs on it" % node["state"]
    if cancel_jobs:
        return "cancel", "still draining after %d s: cancelling its jobs as asked" % waited_s
    return "give_up", "still draining after %d s (state %s): a job still runs on it, so no repair; the node stays " \
                      "drained and quarantined. Repair it after the job ends, or cancel the job (cancel_jobs)" % (
                          waited_s, node["state"])


# ---- the client -------------------------------------------------------------------------------------------------
class SlurmClient:
    """Runs scontrol, sinfo and scancel through run(argv, timeout_s) -> (rc, stdout, stderr, timed_out, error).
    dry_run: nothing that changes Slurm runs; every step (run or not) is in `steps`."""

    def __init__(self, run, scontrol="scontrol", sinfo="sinfo", scancel="scancel", timeout_s=30, dry_run=False):
        self.run, self.timeout_s, self.dry_run = run, timeout_s, dry_run
        self.scontrol, self.sinfo, self.scancel = scontrol, sinfo, scancel
        self.steps = []

    def _call(self, node, argv, changes):
        self.steps.append({"argv": list(argv), "run": not (changes and self.dry_run)})
        if changes and self.dry_run:
            return ""
        rc, out, err, timed_out, error = self.run(argv, self.timeout_s)
        failure = classify(node, argv, rc, out, err, timed_out, error)
        if failure:
            raise failure
        return out

    def show(self, name):
        check_node_name(name)
        argv = [self.scontrol, "show", "node", "-o", name]
        node = parse_node(self._call(name, argv, False))
        if node is None or node["name"] != name:
            raise SlurmError("unparsed", "node %s: `%s` printed no NodeName=%s line: check the Slurm client's "
                                         "version and the node's name" % (name, " ".join(argv), name))
        return node

    def sinfo_state(self, name):
        return parse_sinfo_state(self._call(name, [self.sinfo, "-h", "-N", "-n", check_node_name(name), "-o", "%T"],
                                            False))

    def drain(self, name, reason):
        self._call(name, [self.scontrol, "update", "nodename=%s" % check_node_name(name), "state=drain",
                          "reason=%s" % reason], True)

    def resume(self, name):
        self._call(name, [self.scontrol, "update", "nodename=%s" % check_node_name(name), "state=resume"], True)

    def cancel_jobs(self, name):
        self._call(name, [self.scancel, "--nodelist=%s" % check_node_name(name)], True)


def quarantine(client, name, reason):
    """Drain the node with gpufleet's reason unless it is drained already. Returns {action, why, node}."""
    node = client.show(name)
    action, why = decide_drain(node)
    if action == "drain":
        client.drain(name, reason)
    return {"action": action, "why": why, "node": node}


def release(client, name):
    """Resume the node if its drain is gpufleet's; a foreign drain is refused (SlurmError foreign_drain)."""
    node = client.show(name)
    action, why = decide_resume(node)
    if action == "refuse":
        raise SlurmError("foreign_drain", "node %s: %s" % (name, why))
    if action == "resume":
        client.resume(name)
    return {"action": action, "why": why, "node": node}


def wait_drained(client, name, limit_s, clock, sleep, poll_s=10.0, cancel_jobs=False):
    """Wait until the node is DRAINED (scontrol's state and sinfo's word agree), up to limit_s. Returns {action:
    repair|give_up, why, node, waited_s}; refuses (SlurmError not_drained) a node that is not drained at all."""
    start = clock()
    cancelled = False
    while True:
        node = client.show(name)
        waited = clock() - start
        action, why = decide_repair(node, waited, limit_s, cancel_jobs and not cancelled)
        if action == "repair" and client.sinfo_state(name) != "drained":
            action, why = ("wait", "scontrol says drained but sinfo does not yet") if waited < limit_s else \
                ("give_up", "scontrol and sinfo disagree after %d s: no repair" % waited)
        if action == "refuse":
            raise SlurmError("not_drained", "node %s: %s" % (name, why))
        if action in ("repair", "give_up"):
            return {"action": action, "why": why, "node": node, "waited_s": round(waited, 1)}
        if action == "cancel":
            client.cancel_jobs(name)
            if client.dry_run:
                return {"action": "give_up", "why": why + " (dry run: nothing was cancelled, so no repair)",
                        "node": node, "waited_s": round(waited, 1)}
            cancelled, start = True, clock()  # the cancelled jobs get limit_s again to end
            continue
        sleep(max(0.1, min(poll_s, limit_s - waited)))
