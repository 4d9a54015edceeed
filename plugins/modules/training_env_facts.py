#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: training_env_facts
short_description: Report the PyTorch/NCCL environment a training job would really see, and judge it
description:
  - Reads the values of E(TORCH_NCCL_ASYNC_ERROR_HANDLING), E(TORCH_NCCL_TRACE_BUFFER_SIZE) (or its newer alias
    E(TORCH_FR_BUFFER_SIZE)), E(TORCH_NCCL_DUMP_ON_TIMEOUT), E(TORCH_NCCL_DEBUG_INFO_TEMP_FILE),
    E(PYTORCH_CUDA_ALLOC_CONF) and the deprecated E(NCCL_ASYNC_ERROR_HANDLING) as a fresh LOGIN shell of O(user) sees
    them (C(env -i ... bash -lc) for the user running the module, C(su - USER -c) for another user), and as systemd
    services see them (C(systemctl show-environment)), with C(/etc/environment) and C(/etc/environment.d) for context.
  - The module's own environment (Ansible's C(environment) keyword) is NOT what a job sees, so it is not used.
  - O(expected) maps variable names to required values. RV(verdict=fail) when a required variable is missing or
    wrong in the login shell; RV(verdict=warn) when the deprecated E(NCCL_ASYNC_ERROR_HANDLING) is set anywhere or
    systemd's manager environment lacks a required variable; RV(verdict=error) when the login shell could not be
    read.
  - Facts are returned under RV(ansible_facts) (C(gpufleet_training_env)) and the check result keys at the top
    level.
version_added: "0.1.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
  - kentino.gpufleet.node_module
  - kentino.gpufleet.node_module.facts
attributes:
  check_mode:
    support: full
    details: Read-only; check mode runs the same reads.
options:
  user:
    description: The user that runs training. Default the user running the module. Another user needs root (become).
    type: str
  home:
    description:
      - Home directory whose login files the login shell reads, for the user running the module only (another
        user's login is read with C(su), from its own home). Default that user's home from the password database.
    type: path
  expected:
    description:
      - Variable name to required value. A null value means report only. Default the recommendation of
        docs/failure-modes.md, C({TORCH_NCCL_ASYNC_ERROR_HANDLING "1", TORCH_NCCL_TRACE_BUFFER_SIZE "20000"}), the
        others reported only.
      - Names ending in C(_BUFFER_SIZE) pass with any integer at least the expected one. For
        E(PYTORCH_CUDA_ALLOC_CONF) every comma-separated C(key:value) of the expected value must be present.
      - E(TORCH_NCCL_TRACE_BUFFER_SIZE) is satisfied by E(TORCH_FR_BUFFER_SIZE) when only the alias is set.
    type: dict
  check_systemd:
    description: Also read C(systemctl show-environment). Skipped (noted) where systemd is not PID 1.
    type: bool
    default: true
  systemctl_executable:
    description: Path or name of systemctl. Default C(systemctl) on E(PATH).
    type: path
  etc_environment:
    description: The pam_env file read for context.
    type: path
    default: /etc/environment
  environment_d:
    description: The environment.d directory (systemd user managers) read for context.
    type: path
    default: /etc/environment.d
  timeout:
    description: Seconds for each shell or systemctl run.
    type: int
    default: 30
"""

EXAMPLES = r"""
- name: Verify the training user's environment
  kentino.gpufleet.training_env_facts:
    user: train
  become: true
  register: gpufleet_result_env

- name: Require the allocator setting as well
  kentino.gpufleet.training_env_facts:
    user: train
    expected:
      TORCH_NCCL_ASYNC_ERROR_HANDLING: "1"
      TORCH_NCCL_TRACE_BUFFER_SIZE: "20000"
      TORCH_NCCL_DUMP_ON_TIMEOUT: "1"
      PYTORCH_CUDA_ALLOC_CONF: "expandable_segments:True"
  become: true
  register: gpufleet_result_env
"""

RETURN = r"""
extends_documentation_fragment:
  - kentino.gpufleet.node_module.check_result
evidence:
  description: The NAME=VALUE lines (or their absence) that justify the verdict.
  returned: always
  type: list
  elements: str
tool:
  description: The login shell run (argv, rc, timed_out, duration_s, error).
  returned: always
  type: dict
variables:
  description:
    - Per variable - name, expected, login_shell, systemd, etc_environment, environment_d, alias_used, status
      (ok, missing, wrong, systemd_missing, deprecated, set, unset).
  returned: always
  type: list
  elements: dict
user:
  description: The user whose login shell was read.
  returned: always
  type: str
sources:
  description: Per source (login_shell, systemd, etc_environment, environment_d) whether it could be read and why not.
  returned: always
  type: dict
ansible_facts:
  description: C(gpufleet_training_env) = {user, variables, sources, verdict}.
  returned: always
  type: dict
"""

import os
import pwd
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_env
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import exit_check, node_name
from ansible_collections.kentino.gpufleet.plugins.module_utils.env_files import MARK, parse_assignments, parse_env0
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULT_ENV_EXPECTED
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool, run_tool

VARIABLES = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_ASYNC_ERROR_HANDLING")
SHELL_SCRIPT = "printf '\\0%s\\0'; env -0" % MARK
_USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]*\$?$", re.IGNORECASE)


def _read(path):
    try:
        with open(path, "r") as fh:
            return fh.read(), None
    except (IOError, OSError) as exc:
        return None, exc.strerror or str(exc)


def _environment_d(directory):
    """environment.d(5): *.conf files in lexical order, later assignments win."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".conf"))
    except OSError as exc:
        return {}, "%s: %s" % (directory, exc.strerror or exc)
    env = {}
    for name in names:
        text, _err = _read(os.path.join(directory, name))
        env.update(parse_assignments(text))
    return env, None


def _login_shell(module, user, current, home, timeout):
    """(env dict or None, tool dict, problem)."""
    if user == current:
        env_tool = find_tool(module, "env")
        bash = find_tool(module, "bash")
        if not env_tool or not bash:
            return None, None, "env or bash not found on PATH"
        try:
            pw = pwd.getpwnam(user)
            pw_home, shell = pw.pw_dir, pw.pw_shell
        except KeyError:  # a uid without a passwd entry (containers)
            pw_home, shell = os.environ.get("HOME", "/"), bash
        argv = [env_tool, "-i", "HOME=%s" % (home or pw_home), "USER=%s" % user, "LOGNAME=%s" % user,
                "SHELL=%s" % shell, "PATH=/usr/local/bin:/usr/bin:/bin", "TERM=dumb", bash, "-lc", SHELL_SCRIPT]
    else:
        su = find_tool(module, "su")
        if not su:
            return None, None, "su not found: cannot read %s's login environment" % user
        argv = [su, "-", user, "-c", SHELL_SCRIPT]
    res = run_tool(argv, timeout)
    if res.error or res.timed_out or res.rc != 0 or ("\0%s\0" % MARK) not in res.stdout:
        detail = res.error or ("timed out after %ss (a password prompt? run with become: true)" % timeout
                               if res.timed_out else (res.stderr or res.stdout).strip()[:300] or "rc %s" % res.rc)
        return None, res.as_dict(), "login shell of %s could not be read: %s" % (user, detail)
    return parse_env0(res.stdout), res.as_dict(), None


def _systemd(module, p):
    """(env or None, source dict) from `systemctl show-environment`."""
    if not p["check_systemd"]:
        return None, {"read": False, "error": "check_systemd=false"}
    systemctl = find_tool(module, "systemctl", p["systemctl_executable"])
    if not systemctl:
        return None, {"read": False, "error": "systemctl not found"}
    res = run_tool([systemctl, "show-environment"], p["timeout"])
    if res.ok:
        return parse_assignments(res.stdout), {"read": True, "error": None}
    # "System has not been booted with systemd as init system (PID 1)": services are not systemd's here.
    return None, {"read": False, "error": (res.error or res.stderr.strip() or res.stdout.strip()
                                           or "rc %s" % res.rc)[:300]}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            user=dict(type="str"),
            home=dict(type="path"),
            expected=dict(type="dict"),
            check_systemd=dict(type="bool", default=True),
            systemctl_executable=dict(type="path"),
            etc_environment=dict(type="path", default="/etc/environment"),
            environment_d=dict(type="path", default="/etc/environment.d"),
            timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        current = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        current = str(os.geteuid())
    user = p["user"] or current
    if not _USER_RE.match(user):
        module.fail_json(msg="user %r is not a valid user name" % user)
    if p["home"] and user != current:
        module.fail_json(msg="home applies to the user running the module only (another user's login is read with su)")
    expected = dict(DEFAULT_ENV_EXPECTED) if p["expected"] is None else dict(
        (str(k), None if v is None else str(v)) for k, v in p["expected"].items())
    names = list(VARIABLES) + [n for n in expected if n not in VARIABLES]

    sources = {}
    login, tool, problem = _login_shell(module, user, current, p["home"], p["timeout"])
    if problem and user != current:
        problem += "; reading another user's login needs root (become: true)"
    sources["login_shell"] = {"read": login is not None, "error": problem}
    systemd, sources["systemd"] = _systemd(module, p)
    text, err = _read(p["etc_environment"])
    etc_env = parse_assignments(text) if text is not None else {}
    sources["etc_environment"] = {"read": text is not None, "error": err}
    envd, err = _environment_d(p["environment_d"])
    sources["environment_d"] = {"read": err is None, "error": err}

    variables = []
    for name in names:
        alias = judge_env.ALIASES.get(name)
        value = login.get(name) if login is not None else None
        alias_used = None
        if value is None and alias and login is not None and login.get(alias) is not None:
            value, alias_used = login.get(alias), alias
        sd = systemd.get(name) if systemd is not None else None
        if sd is None and alias and systemd is not None:
            sd = systemd.get(alias)
        variables.append({"name": name, "expected": expected.get(name), "login_shell": value, "systemd": sd,
                          "etc_environment": etc_env.get(name), "environment_d": envd.get(name),
                          "alias_used": alias_used})
    obs = {"tool": tool or {"argv": [], "rc": None, "timed_out": False, "duration_s": 0.0, "error": problem},
           "variables": variables, "user": user, "sources": sources}
    t = {"gpufleet_env_expected": expected}
    status = judge_env.statuses(obs, expected)
    for var in variables:
        var["status"] = status.get(var["name"])
    findings = judge_env.judge(obs, t, node_name())
    obs["ansible_facts"] = {"gpufleet_training_env": {"user": user, "variables": variables, "sources": sources}}
    exit_check(module, obs, findings)


if __name__ == "__main__":
    main()
