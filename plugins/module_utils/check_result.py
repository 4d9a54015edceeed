# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What the check modules share (stdlib only: runs on the node): the tool section of a result, and the exit.

A check module returns OBSERVATIONS (what the tool printed, parsed; how it ran) plus the verdict its judge gives with
the thresholds passed as options. The fleet report re-judges the same observations with the inventory's thresholds
(docs/contracts.md), so everything a judge reads must be in the result:

    tool       {argv, rc, timed_out, duration_s, error}   error: why it could not start (not found, not runnable)
    not_run    null, or why nothing ran (check mode)
    output_tail  last lines of output when the tool timed out (where it hung)
    verdict, reasons, evidence   the node's own judgement (informational for the report)
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import socket

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import module_fields
from ansible_collections.kentino.gpufleet.plugins.module_utils.lease import Lease
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import THRESHOLDS, resolve
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool, run_tool

# Where the validation_tools role installs gpu_burn and all_reduce_perf: the checks look there after PATH.
TOOL_DIRS = ["/opt/gpufleet/bin"]
VALIDATION_TOOLS_HINT = "install it with the kentino.gpufleet.validation_tools role or pass executable="


def planned_tool(argv, error=None):
    """The tool section when the tool did not run (check mode, missing tool): what would have run."""
    return {"argv": [str(a) for a in argv], "rc": None, "timed_out": False, "duration_s": 0.0, "error": error}


def tool_section(tool_result):
    """(tool dict, output_tail) of a finished tool_runner.ToolResult; the tail only when it timed out."""
    tail = []
    if tool_result.timed_out:
        tail = (tool_result.stdout or "").replace("\r", "\n").strip().splitlines()[-5:]
        tail += (tool_result.stderr or "").strip().splitlines()[-5:]
    return tool_result.as_dict(), [line[:300] for line in tail]


def missing_tool_reason(name, install_hint):
    return "%s not found: %s" % (name, install_hint)


def node_name():
    """How the node names itself in its own verdict's messages (the report uses the inventory name)."""
    return socket.gethostname().split(".")[0] or "this node"


def judged(observations, findings):
    """The observations with the node's verdict, reasons and evidence from the judge's findings (a check's result)."""
    result = dict(observations)
    result.setdefault("not_run", None)
    result.update(module_fields(findings, result["not_run"]))
    return result


def exit_check(module, observations, findings):
    """Exit with the observations and the node's verdict from the judge's findings."""
    result = judged(observations, findings)
    result["changed"] = False
    module.exit_json(**result)


# The option that gives a check the inventory's thresholds (doc fragment kentino.gpufleet.thresholds).
THRESHOLD_OPTIONS = dict(thresholds=dict(type="dict", default={}))


def given_thresholds(module, from_options=None, given=None):
    """The thresholds the module's judge reads: its own options' (inventory names), then those of O(thresholds) (or
    `given`), checked with thresholds.resolve as the fleet report checks them; a wrong name or type fails the task."""
    given = (module.params.get("thresholds") if given is None else given) or {}
    unknown = sorted(str(k) for k in given if k not in THRESHOLDS)
    if unknown:
        module.fail_json(msg="thresholds: %s not a threshold of this collection (docs/rules.md lists them)" % (
            ", ".join(unknown)))
    t, _sources, errors = resolve(given, node_name())
    if errors:
        module.fail_json(msg="thresholds: %s" % "; ".join(errors))
    out = dict(from_options or {})
    out.update((name, t[name]) for name in given)
    return out


# The options every long check takes to stop by itself when the controller stops waiting (module_utils/lease.py).
LEASE_OPTIONS = dict(
    state_dir=dict(type="path"),
    run_id=dict(type="str"),
    lease_timeout=dict(type="int", default=180),
)


def open_lease(module):
    """The run's Lease (touched once), or None when the module runs without a run id (on its own)."""
    params = module.params
    if not params.get("run_id"):
        return None
    if not params.get("state_dir"):
        module.fail_json(msg="run_id needs state_dir (where the run's lease and job records live)")
    if params["lease_timeout"] < 10:
        module.fail_json(msg="lease_timeout must be at least 10 seconds, got %s" % params["lease_timeout"])
    try:
        lease = Lease(params["state_dir"], params["run_id"], params["lease_timeout"])
        lease.touch()
        lease.record_async_job(module._name)
    except (ValueError, OSError) as exc:
        module.fail_json(msg="cannot use the run's lease under %s: %s" % (params["state_dir"], exc))
    return lease


class ToolCheck:
    """The frame of a check module that runs one tool (dcgm_diag, gpu_burn, nccl_test): the run's lease, the tool's
    lookup (a missing tool is a verdict naming what to install, never a crash), the run under the lease, and the exit
    with the verdict of the module's judge. The module keeps its options, its argv and its parsing."""

    def __init__(self, module, judge, thresholds=None):
        self.module = module
        self.judge = judge
        self.t = thresholds or {}
        self.host = node_name()
        self.lease = open_lease(module)

    def find(self, names, install_hint=VALIDATION_TOOLS_HINT, option="executable"):
        """(path, None), or (None, why and what to install): the module's `option` when given, else each of the
        tool's names on PATH and in TOOL_DIRS."""
        given = self.module.params.get(option) if option else None
        if given:
            path = find_tool(self.module, names[0], given, TOOL_DIRS)
            return (path, None) if path else (None, missing_tool_reason(given, install_hint))
        for name in names:
            path = find_tool(self.module, name, None, TOOL_DIRS)
            if path:
                return path, None
        return None, missing_tool_reason(names[0], install_hint)

    def run(self, argv, timeout_s, **kwargs):
        """(ToolResult, observations {tool, output_tail}) of the tool run under the run's lease."""
        ran = run_tool(argv, timeout_s, lease=self.lease, **kwargs)
        tool, tail = tool_section(ran)
        return ran, {"tool": tool, "output_tail": tail}

    def finish(self, observations, **judge_kwargs):
        """Exit with the observations and the judge's verdict (thresholds given as the module's options)."""
        exit_check(self.module, observations, self.judge(observations, self.t, self.host, **judge_kwargs))


class CheckExit(Exception):
    """How a check run by EmbeddedModule ends: its result (exit_json's, or fail_json's with failed and msg)."""

    def __init__(self, result):
        Exception.__init__(self, result.get("msg") or "check finished")
        self.result = result


class EmbeddedModule:
    """A check's AnsibleModule as another module's job runs it (dcgm_diag's nccl_after): its own validated options,
    its exits captured as results (CheckExit) instead of ending the process; everything else is the real module's."""

    def __init__(self, module, name, params):
        self._module = module
        self._name = name
        self.params = params

    def exit_json(self, **result):
        raise CheckExit(result)

    def fail_json(self, msg, **kwargs):
        kwargs.update(failed=True, msg=msg)
        raise CheckExit(kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)


def embedded(module, name, spec, given, inherit=("state_dir", "run_id", "lease_timeout")):
    """(EmbeddedModule, None) with `given` checked against `spec` as AnsibleModule checks a task's options (the
    options named in `inherit` taken from `module` unless given), or (None, error message)."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    params = dict(given)
    for key in inherit:
        if params.get(key) is None and module.params.get(key) is not None:
            params[key] = module.params[key]
    checked = ArgumentSpecValidator(spec).validate(params)
    if checked.error_messages:
        return None, "; ".join(checked.error_messages)
    return EmbeddedModule(module, name, checked.validated_parameters), None


def captured(body, *args):
    """The result body(*args) ends with (CheckExit); an exception it raises is a failed result that says so."""
    try:
        body(*args)
    except CheckExit as done:
        return done.result
    except Exception as exc:  # the other check's result must survive this one's bug
        return {"failed": True, "msg": "raised %s: %s (a kentino.gpufleet bug: report it with this message)"
                                       % (type(exc).__name__, exc)}
    return {"failed": True, "msg": "the check ended without a result (a kentino.gpufleet bug)"}
