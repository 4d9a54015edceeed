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
attributes:
  check_mode:
    support: full
    details: Read-only; check mode runs the same reads.
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    support: full
    platforms: posix
options:
  user:
    description: The user that runs training. Default the user running the module. Another user needs root (become).
    type: str
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
verdict:
  description: V(pass), V(warn), V(fail) or V(error).
  returned: always
  type: str
reasons:
  description: One line per finding, naming the variable, where it is wrong and how to fix it.
  returned: always
  type: list
  elements: str
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
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import Findings, build_result
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool, run_tool

VARIABLES = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_ASYNC_ERROR_HANDLING")
DEFAULT_EXPECTED = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000"}
ALIASES = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "TORCH_FR_BUFFER_SIZE"}
DEPRECATED = {"NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
MARK = "__GPUFLEET_ENV__"
# Printed before env so that banners from profile scripts (echo in .bash_profile, motd) cannot be mistaken for variables.
SHELL_SCRIPT = "printf '\\0%s\\0'; env -0" % MARK
_USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]*\$?$", re.IGNORECASE)
_ASSIGN_RE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def parse_env0(text):
    """NUL-separated NAME=VALUE records after the marker (env -0). Never raises."""
    if not isinstance(text, str):
        return {}
    marker = "\0%s\0" % MARK
    if marker in text:
        text = text.split(marker, 1)[1]
    records = text.split("\0") if "\0" in text else text.splitlines()
    env = {}
    for record in records:
        name, sep, value = record.partition("=")
        if sep and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            env[name] = value
    return env


def _unquote(value):
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    if value.startswith("$'") and value.endswith("'"):  # systemd >= 249 quotes special characters C-style
        try:
            return value[2:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        except (UnicodeDecodeError, UnicodeEncodeError):
            return value[2:-1]
    return value


def parse_assignments(text):
    """KEY=VALUE lines (/etc/environment, environment.d, systemctl show-environment); comments skipped."""
    env = {}
    for line in (text or "").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _ASSIGN_RE.match(line)
        if match:
            env[match.group(1)] = _unquote(match.group(2))
    return env


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


def _satisfies(name, actual, expected):
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


def _login_shell(module, user, current, timeout):
    """(env dict or None, tool dict, problem)."""
    if user == current:
        env_tool = find_tool(module, "env")
        bash = find_tool(module, "bash")
        if not env_tool or not bash:
            return None, None, "env or bash not found on PATH"
        try:
            pw = pwd.getpwnam(user)
            home, shell = pw.pw_dir, pw.pw_shell
        except KeyError:  # a uid without a passwd entry (containers)
            home, shell = os.environ.get("HOME", "/"), bash
        argv = [env_tool, "-i", "HOME=%s" % home, "USER=%s" % user, "LOGNAME=%s" % user, "SHELL=%s" % shell,
                "PATH=/usr/local/bin:/usr/bin:/bin", "TERM=dumb", bash, "-lc", SHELL_SCRIPT]
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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            user=dict(type="str"),
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
    expected = dict(DEFAULT_EXPECTED) if p["expected"] is None else dict(
        (str(k), None if v is None else str(v)) for k, v in p["expected"].items())
    names = list(VARIABLES) + [n for n in expected if n not in VARIABLES]

    findings = Findings()
    sources = {}
    login, tool, problem = _login_shell(module, user, current, p["timeout"])
    sources["login_shell"] = {"read": login is not None, "error": problem}
    if problem:
        findings.add("error", problem + ("" if user == current else "; reading another user's login needs root "
                                         "(become: true)"))

    systemd = None
    if p["check_systemd"]:
        systemctl = find_tool(module, "systemctl", p["systemctl_executable"])
        if not systemctl:
            sources["systemd"] = {"read": False, "error": "systemctl not found"}
        else:
            res = run_tool([systemctl, "show-environment"], p["timeout"])
            if res.ok:
                systemd = parse_assignments(res.stdout)
                sources["systemd"] = {"read": True, "error": None}
            else:
                # "System has not been booted with systemd as init system (PID 1)": services are not systemd's here.
                sources["systemd"] = {"read": False, "error": (res.error or res.stderr.strip() or res.stdout.strip()
                                                               or "rc %s" % res.rc)[:300]}
    else:
        sources["systemd"] = {"read": False, "error": "check_systemd=false"}

    text, err = _read(p["etc_environment"])
    etc_env = parse_assignments(text) if text is not None else {}
    sources["etc_environment"] = {"read": text is not None, "error": err}
    envd, err = _environment_d(p["environment_d"])
    sources["environment_d"] = {"read": err is None, "error": err}

    variables = []
    for name in names:
        want = expected.get(name)
        alias = ALIASES.get(name)
        value = login.get(name) if login is not None else None
        alias_used = None
        if value is None and alias and login is not None and login.get(alias) is not None:
            value, alias_used = login.get(alias), alias
        sd = systemd.get(name) if systemd is not None else None
        if sd is None and alias and systemd is not None:
            sd = systemd.get(alias)
        entry = {"name": name, "expected": want, "login_shell": value, "systemd": sd,
                 "etc_environment": etc_env.get(name), "environment_d": envd.get(name), "alias_used": alias_used}
        shown = "%s=%s" % (alias_used or name, value) if value is not None else "%s unset" % name
        if name in DEPRECATED:
            places = [where for where, v in (("login shell", value), ("systemd", sd), ("/etc/environment",
                      entry["etc_environment"]), ("environment.d", entry["environment_d"])) if v is not None]
            if places:
                entry["status"] = "deprecated"
                findings.add("warn", "%s is set (%s) but deprecated since torch 2.2: set %s=1 instead and remove it"
                             % (name, ", ".join(places), DEPRECATED[name]), shown)
            else:
                entry["status"] = "unset"
        elif want is None:
            entry["status"] = "set" if value is not None else "unset"
        elif login is None:
            entry["status"] = "unknown"
        elif value is None:
            entry["status"] = "missing"
            findings.add("fail", "%s is not set in %s's login shell (expected %s): export it in /etc/profile.d/ "
                         "(kentino.gpufleet.training_env does) or the user's profile" % (name, user, want),
                         "%s: %s unset" % (user, name))
        elif not _satisfies(name, value, want):
            entry["status"] = "wrong"
            findings.add("fail", "%s=%s in %s's login shell, expected %s: fix /etc/profile.d/ or the user's "
                         "profile" % (alias_used or name, value, user, want), shown)
        elif systemd is not None and not _satisfies(name, sd, want):
            entry["status"] = "systemd_missing"
            findings.add("warn", "%s is %s in systemd's manager environment (expected %s): jobs started as systemd "
                         "services will not see it; add it to the unit (Environment=) or `systemctl "
                         "set-environment`" % (name, "unset" if sd is None else "=" + sd, want), shown)
        else:
            entry["status"] = "ok"
            findings.add_evidence(shown)
        variables.append(entry)

    verdict = findings.verdict()
    facts = {"user": user, "variables": variables, "sources": sources, "verdict": verdict}
    result = build_result(verdict, findings.reasons, findings.evidence,
                          tool or {"argv": [], "rc": None, "timed_out": False, "duration_s": 0.0, "error": problem},
                          variables=variables, user=user, sources=sources)
    result["ansible_facts"] = {"gpufleet_training_env": facts}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
