# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What training_env_facts observes (stdlib only: runs on the node), shared by training_env_facts and health_snapshot:
the training variables as the user's login shell sees them (env -0 after a marker), as systemd services see them
(systemctl show-environment), and in /etc/environment and environment.d. The judgement is judge_env's.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import pwd
import re

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_env
from ansible_collections.kentino.gpufleet.plugins.module_utils.env_files import MARK, parse_assignments, parse_env0
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


def current_user():
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def observe(module, p, user, current, expected):
    """The observations of the training environment of `user`. p: home, check_systemd, systemctl_executable,
    etc_environment, environment_d, timeout; expected: {name: value}. Never raises for a source that fails."""
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
    status = judge_env.statuses(obs, expected)
    for var in variables:
        var["status"] = status.get(var["name"])
    return obs
