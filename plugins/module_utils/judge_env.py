# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge training_env_facts: the PyTorch/NCCL variables a training job would really see (stdlib only).

Why these variables: with TORCH_NCCL_ASYNC_ERROR_HANDLING=1 a collective that times out aborts the job (and torchrun
restarts it from the last checkpoint) instead of hanging it; TORCH_NCCL_TRACE_BUFFER_SIZE keeps the flight recorder's
last collectives for the post-mortem. NCCL_ASYNC_ERROR_HANDLING is the pre-2.2 name: it is reported, never advised.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door

CHECK = "training_env_facts"
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads: what a module passes it.
THRESHOLDS = ("gpufleet_env_expected",)

CODES = {
    "ENV_MISSING": ("fail", "a variable of gpufleet_env_expected is unset or wrong in the training user's login shell"),
    "ENV_SYSTEMD_MISSING": ("warn", "the login shell has it, systemd services would not"),
    "ENV_DEPRECATED": ("warn", "NCCL_ASYNC_ERROR_HANDLING (pre-2.2 name) is set somewhere"),
    "ENV_UNREADABLE": ("error", "the login shell could not be read, or an expected variable was not read"),
}
DEPRECATED = {"NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
ALIASES = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE"}
ROLE = "kentino.gpufleet.training_env"


def satisfies(name, actual, expected):
    if actual is None:
        return False
    if name.endswith("_BUFFER_SIZE") and str(expected).strip().isdigit():
        try:
            return int(actual.strip()) >= int(str(expected).strip())
        except ValueError:
            return False
    if name == "PYTORCH_CUDA_ALLOC_CONF":
        have = set(item.strip() for item in actual.split(",") if item.strip())
        return all(item.strip() in have for item in str(expected).split(",") if item.strip())
    return actual == str(expected)


def _by_name(result):
    """{name: variable} of the variables that carry a name (an entry without one names nothing to judge)."""
    return dict((v["name"], v) for v in result.get("variables") or [] if isinstance(v.get("name"), str))


def statuses(result, expected):
    """{name: status} per variable: ok, missing, wrong, systemd_missing, deprecated, set, unset, unknown, not_read."""
    out = {}
    sources = result.get("sources") or {}
    login_read = (sources.get("login_shell") or {}).get("read")
    systemd_read = (sources.get("systemd") or {}).get("read")
    by_name = _by_name(result)
    for name in sorted(set(by_name) | set(n for n, v in expected.items() if v is not None)):
        var = by_name.get(name)
        want = expected.get(name)
        if var is None:
            out[name] = "not_read"
            continue
        value, systemd = var.get("login_shell"), var.get("systemd")
        if name in DEPRECATED:
            places = [var.get(k) for k in ("login_shell", "systemd", "etc_environment", "environment_d")]
            out[name] = "deprecated" if any(p is not None for p in places) else "unset"
        elif want is None:
            out[name] = "set" if value is not None else "unset"
        elif not login_read:
            out[name] = "unknown"
        elif value is None:
            out[name] = "missing"
        elif not satisfies(name, value, want):
            out[name] = "wrong"
        elif systemd_read and not satisfies(name, systemd, want):
            out[name] = "systemd_missing"
        else:
            out[name] = "ok"
    return out


@judge_door(CHECK)
def judge(result, t, host):
    """[finding] for one training_env_facts result, against gpufleet_env_expected."""
    expected = t["gpufleet_env_expected"]
    user = result.get("user") or "the training user"
    sources = result.get("sources") or {}
    login = sources.get("login_shell") or {}
    out = []
    if not login.get("read"):
        out.append(finding("error", "ENV_UNREADABLE", "%s: %s" % (host, login.get("error") or "login shell not read"),
                           "make %s's login shell readable on %s (become: true to read another user's)" % (user, host),
                           [login.get("error")]))
    by_name = _by_name(result)
    for name, status in sorted(statuses(result, expected).items()):
        var = by_name.get(name) or {}
        want = expected.get(name)
        shown = "%s=%s" % (var.get("alias_used") or name, var["login_shell"]) if var.get("login_shell") is not None \
            else "%s unset" % name
        fix = "set %s=%s for %s on %s (role %s)" % (name, want, user, host, ROLE)
        if status == "not_read":
            out.append(finding("error", "ENV_UNREADABLE", "%s: %s was not read on the node (expected %s)" % (
                host, name, want), "pass it to training_env_facts' expected option", [name]))
        elif status == "deprecated":
            places = [where for where, key in (("login shell", "login_shell"), ("systemd", "systemd"),
                                               ("/etc/environment", "etc_environment"),
                                               ("environment.d", "environment_d")) if var.get(key) is not None]
            out.append(finding("warn", "ENV_DEPRECATED", "%s: %s is set (%s) but deprecated since torch 2.2" % (
                host, name, ", ".join(places)), "remove %s and set %s=1 on %s (role %s removes it)" % (
                name, DEPRECATED[name], host, ROLE), [shown]))
        elif status == "missing":
            out.append(finding("fail", "ENV_MISSING", "%s: %s is not set in %s's login shell (expected %s)" % (
                host, name, user, want), fix, ["%s: %s unset" % (user, name)]))
        elif status == "wrong":
            out.append(finding("fail", "ENV_MISSING", "%s: %s in %s's login shell, expected %s" % (
                host, shown, user, want), fix, [shown]))
        elif status == "systemd_missing":
            sd = var.get("systemd")
            out.append(finding("warn", "ENV_SYSTEMD_MISSING", "%s: %s is %s in systemd's manager environment "
                               "(expected %s): jobs started as systemd services will not see it" % (
                                   host, name, "unset" if sd is None else "=" + sd, want),
                               "add it to the unit (Environment=) or the manager environment (role %s does)" % ROLE,
                               [shown]))
    return out
