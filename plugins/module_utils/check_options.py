# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""argument_spec of the options documented by the kentino.gpufleet.check_common doc fragment (stdlib only: node side).

Every module that runs one node tool takes O(executable) (type path) and O(timeout) (seconds) from here, so their
names, types and validation agree across modules and with the doc fragment. A module's own default timeout is applied
by resolve_timeout(), not in the spec: the fragment documents one option for every module.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

COMMON_OPTIONS = ("executable", "timeout")


def check_argument_spec(**options):
    """The common options plus the module's own; a module cannot silently redefine a common one."""
    spec = dict(
        executable=dict(type="path"),
        timeout=dict(type="int"),
    )
    clash = sorted(set(spec) & set(options))
    if clash:
        raise ValueError("options %s come from check_argument_spec(); do not redefine them" % ", ".join(clash))
    spec.update(options)
    return spec


def resolve_timeout(module, default_s):
    """The timeout in seconds: the option when given, else the module's default; fails the task below 1 second.

    The resolved value is written back to module.params so the task's invocation shows what was used.
    """
    timeout = module.params.get("timeout")
    if timeout is None:
        timeout = default_s
    if timeout is None or timeout < 1:
        module.fail_json(msg="timeout must be at least 1 second, got %s" % timeout)
    module.params["timeout"] = timeout
    return timeout
