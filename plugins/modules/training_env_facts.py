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
  - kentino.gpufleet.node_module
  - kentino.gpufleet.node_module.read_only
  - kentino.gpufleet.node_module.facts
  - kentino.gpufleet.thresholds
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
verdict:
  description:
    - The node's own verdict, V(pass), V(warn), V(fail), V(error) or V(skipped), from this check's judge with the
      thresholds given as options. The fleet report judges the same observations again with the inventory's.
  returned: always
  type: str
  sample: fail
reasons:
  description: One line per finding, naming what is wrong, where (GPU, device, path, rank) and what to do.
  returned: always
  type: list
  elements: str
not_run:
  description: Why nothing ran (check mode, a precondition), else null.
  returned: always
  type: str
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
  description: The training environment as facts.
  returned: always
  type: dict
  contains:
    gpufleet_training_env:
      description: The user, every expected variable as each source shows it, and the sources read.
      type: dict
      sample: {user: train, variables: [], sources: {}}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_env
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import (
    THRESHOLD_OPTIONS,
    exit_check,
    given_thresholds,
    node_name,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULT_ENV_EXPECTED
from ansible_collections.kentino.gpufleet.plugins.module_utils.training_env_state import (  # noqa: F401 (SHELL_SCRIPT: tests)
    _USER_RE,
    SHELL_SCRIPT,
    current_user,
    observe,
)


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
            **THRESHOLD_OPTIONS
        ),
        supports_check_mode=True,
    )
    p = module.params
    current = current_user()
    user = p["user"] or current
    if not _USER_RE.match(user):
        module.fail_json(msg="user %r is not a valid user name" % user)
    if p["home"] and user != current:
        module.fail_json(msg="home applies to the user running the module only (another user's login is read with su)")
    expected = dict(DEFAULT_ENV_EXPECTED) if p["expected"] is None else dict(
        (str(k), None if v is None else str(v)) for k, v in p["expected"].items())
    t = given_thresholds(module, {"gpufleet_env_expected": expected})
    expected = t["gpufleet_env_expected"]
    obs = observe(module, p, user, current, expected)
    findings = judge_env.judge(obs, t, node_name())
    obs["ansible_facts"] = {"gpufleet_training_env": {"user": user, "variables": obs["variables"],
                                                      "sources": obs["sources"]}}
    exit_check(module, obs, findings)


if __name__ == "__main__":
    main()
