"""nvidia_driver: which packages of NVIDIA's CUDA repository a branch means, decided by the branch number.

Up to branch 580 the metapackages carry the branch (nvidia-open-580, cuda-drivers-580); from 590 on they do not
(nvidia-open, cuda-drivers) and NVIDIA's pinning package chooses the branch. The role's own vars/main.yml is templated
by Ansible (one local play, no change to this machine); the fleet tests install these names for real.
"""

import os
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]

CASES = {
    # host: (branch, version) -> open metapackage, proprietary metapackage, pinning package candidates
    "b570": (("570", ""), "nvidia-open-570", "cuda-drivers-570", ["nvidia-driver-pinning-570"]),
    "b570v": (("570", "570.172.08"), "nvidia-open-570", "cuda-drivers-570",
              ["nvidia-driver-pinning-570.172.08", "nvidia-driver-pinning-570"]),
    "b580": (("580", ""), "nvidia-open-580", "cuda-drivers-580", ["nvidia-driver-pinning-580"]),
    "b590": (("590", ""), "nvidia-open", "cuda-drivers", ["nvidia-driver-pinning-590"]),
    "b595v": (("595", "595.71.05"), "nvidia-open", "cuda-drivers",
              ["nvidia-driver-pinning-595.71.05", "nvidia-driver-pinning-595"]),
    "b1000": (("1000", ""), "nvidia-open", "cuda-drivers", ["nvidia-driver-pinning-1000"]),
}

PLAY = """
- name: Template the nvidia_driver role's package names
  hosts: all
  gather_facts: false
  tasks:
    - name: Load the role's variables
      ansible.builtin.include_vars: {vars}
    - name: Resolve them
      ansible.builtin.set_fact:
        resolved:
          open: "{{{{ _nvidia_driver_packages_cuda_repo.open }}}}"
          proprietary: "{{{{ _nvidia_driver_packages_cuda_repo.proprietary }}}}"
          pinning: "{{{{ _nvidia_driver_pinning_candidates }}}}"
"""


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    import ansible_runner

    tmp = tmp_path_factory.mktemp("driver-packages")
    (tmp / "play.yml").write_text(PLAY.format(vars=REPO / "roles/nvidia_driver/vars/main.yml"))
    hosts = {name: {"ansible_connection": "local", "nvidia_driver_branch": branch, "nvidia_driver_version": version}
             for name, ((branch, version), *_) in CASES.items()}
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    env = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_INJECT_FACT_VARS": "false",
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    (tmp / "runner").mkdir()
    r = ansible_runner.run(private_data_dir=str(tmp / "runner"), playbook=str(tmp / "play.yml"),
                           inventory=str(tmp / "inventory.yml"), envvars=env, quiet=True, project_dir=str(REPO))
    out = {}
    for ev in r.events:
        data = ev.get("event_data", {})
        if ev["event"] == "runner_on_ok" and data.get("task") == "Resolve them":
            out[data["host"]] = data["res"]["ansible_facts"]["resolved"]
    assert r.rc == 0 and set(out) == set(CASES), r.stdout.read()[-3000:]
    return out


@pytest.mark.parametrize("host", sorted(CASES))
def test_packages_follow_nvidias_naming_for_the_branch(resolved, host):
    _, open_pkg, proprietary_pkg, pinning = CASES[host]
    assert resolved[host] == {"open": [open_pkg], "proprietary": [proprietary_pkg], "pinning": pinning}
