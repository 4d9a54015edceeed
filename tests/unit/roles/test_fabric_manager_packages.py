"""fabric_manager: which packages a driver branch, a package source and a fabric mean, decided before any change.

NVIDIA's CUDA repository drops the branch from nvidia-fabricmanager, libnvidia-nscq and libnvsdm at branch 580;
Ubuntu's archive keeps it; NVLink 5 machines add NVLSM (and NVSDM on x86_64 from branch 570). The role's preflight runs
for real (check mode, locally, faked facts, forced platform, explicit driver version: it reads nothing of this machine)
and must agree with plugins/module_utils/fabric_manager.package_names, which the checks use.
"""

import os
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
LIBRARY = REPO / "tests" / "unit" / "roles" / "refusals" / "library"
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.kentino.gpufleet.plugins.module_utils.fabric_manager import package_names  # noqa: E402

CASES = {
    # host: (driver version, source, platform, architecture) -> pinned packages, unpinned packages
    "b570": (("570.172.08", "cuda_repo", "nvswitch", "x86_64"), ["nvidia-fabricmanager-570", "libnvidia-nscq-570"], []),
    "b575": (("575.57.08", "cuda_repo", "nvswitch", "x86_64"), ["nvidia-fabricmanager-575", "libnvidia-nscq-575"], []),
    "b580": (("580.105.08", "cuda_repo", "nvswitch", "x86_64"), ["nvidia-fabricmanager", "libnvidia-nscq"], []),
    "b590": (("590.48.01", "cuda_repo", "nvswitch", "x86_64"), ["nvidia-fabricmanager", "libnvidia-nscq"], []),
    "ubuntu590": (("590.48.01", "distribution", "nvswitch", "x86_64"),
                  ["nvidia-fabricmanager-590", "libnvidia-nscq-590"], []),
    "b570nv5": (("570.172.08", "cuda_repo", "nvlink5", "x86_64"),
                ["nvidia-fabricmanager-570", "libnvidia-nscq-570", "libnvsdm-570"], ["nvlsm", "infiniband-diags"]),
    "b580nv5": (("580.105.08", "cuda_repo", "nvlink5", "x86_64"),
                ["nvidia-fabricmanager", "libnvidia-nscq", "libnvsdm"], ["nvlsm", "infiniband-diags"]),
    "b580nv5arm": (("580.105.08", "cuda_repo", "nvlink5", "aarch64"),
                   ["nvidia-fabricmanager", "libnvidia-nscq"], ["nvlsm", "infiniband-diags"]),
}

PLAY = """
- name: Resolve the fabric manager's packages
  hosts: all
  gather_facts: false
  tasks:
    - name: Pretend to be a Debian 12 node
      gpufleet_fake_facts:  # noqa: fqcn[action]
        facts:
          distribution: Debian
          distribution_version: '12.7'
          distribution_major_version: '12'
          os_family: Debian
          kernel: 6.1.0-25-amd64
          architecture: "{{ arch }}"
    - name: Run the preflight
      ansible.builtin.include_role:
        name: kentino.gpufleet.fabric_manager
        tasks_from: preflight
    - name: Show the choice
      ansible.builtin.set_fact:
        resolved: {pinned: "{{ _fabric_manager_packages }}", unpinned: "{{ _fabric_manager_unpinned }}"}
"""


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    import ansible_runner

    tmp = tmp_path_factory.mktemp("fm-packages")
    (tmp / "play.yml").write_text(PLAY)
    hosts = {name: {"ansible_connection": "local", "fabric_manager_driver_version": version,
                    "fabric_manager_source": source, "fabric_manager_platform": platform, "arch": arch}
             for name, ((version, source, platform, arch), *_) in CASES.items()}
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    (tmp / "runner").mkdir()
    env = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_INJECT_FACT_VARS": "false",
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable, "ANSIBLE_LIBRARY": str(LIBRARY),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    r = ansible_runner.run(private_data_dir=str(tmp / "runner"), playbook=str(tmp / "play.yml"),
                           inventory=str(tmp / "inventory.yml"), cmdline="--check", envvars=env, quiet=True,
                           project_dir=str(REPO))
    out = {}
    for ev in r.events:
        data = ev.get("event_data", {})
        if ev["event"] == "runner_on_ok" and data.get("task") == "Show the choice":
            out[data["host"]] = data["res"]["ansible_facts"]["resolved"]
    assert r.rc == 0 and set(out) == set(CASES), r.stdout.read()[-3000:]
    return out


@pytest.mark.parametrize("host", sorted(CASES))
def test_the_role_follows_nvidias_names_and_agrees_with_the_checks(resolved, host):
    (version, source, platform, arch), pinned, unpinned = CASES[host]
    assert resolved[host] == {"pinned": pinned, "unpinned": unpinned}
    assert package_names(version.split(".")[0], source, platform == "nvlink5", arch) == {"pinned": pinned,
                                                                                          "unpinned": unpinned}
