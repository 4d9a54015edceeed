"""Bad input is refused before any change: an unsupported OS, a malformed variable (argument spec), for every role.

Runs locally in check mode on fake hosts (facts faked by library/gpufleet_fake_facts.py), one ansible-playbook run for
all roles (a few seconds). The fleet tests cover the refusals that need a real node (missing branch, bad checksum).
"""

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
ROLES = ["nvidia_driver", "dcgm", "dcgm_exporter", "gpufleet_node_exporter", "training_env", "validation_tools",
         "elastic_training", "fabric_manager"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """{host: {"failed": [(task, msg)], "changed": [task], "ok": [task]}} from ansible-runner's events."""
    import ansible_runner

    env = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_INJECT_FACT_VARS": "false",
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable, "ANSIBLE_LIBRARY": str(HERE / "library"),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    # --check: even if a preflight let something through, this test must not change the machine it runs on.
    r = ansible_runner.run(private_data_dir=str(tmp_path_factory.mktemp("refusals")), playbook=str(HERE / "refusals.yml"),
                           inventory=str(HERE / "inventory.yml"), cmdline="--check", envvars=env, quiet=True,
                           project_dir=str(REPO))
    hosts = {}
    for ev in r.events:
        data = ev.get("event_data", {})
        host = data.get("host")
        if not host or ev["event"] not in ("runner_on_ok", "runner_on_failed"):
            continue
        h = hosts.setdefault(host, {"failed": [], "changed": [], "ok": []})
        res = data.get("res", {})
        if ev["event"] == "runner_on_failed" and not data.get("ignore_errors"):
            h["failed"].append((data.get("task", ""), str(res.get("msg", ""))))
        elif res.get("changed"):
            h["changed"].append(data.get("task", ""))
        else:
            h["ok"].append(data.get("task", ""))
    assert hosts, "no events: %s" % r.stdout.read()[-3000:]
    return hosts


@pytest.mark.parametrize("role", ROLES)
def test_unsupported_os_is_refused_before_any_change(run, role):
    host = role + "_os"
    failed = run[host]["failed"]
    assert len(failed) == 1, failed
    name, msg = failed[0]
    assert "unsupported operating system" in name
    assert "CentOS-9 is not supported by kentino.gpufleet.%s" % role in msg
    assert host in msg  # the error names the host
    assert run[host]["changed"] == []


@pytest.mark.parametrize("role", ROLES)
def test_malformed_variable_is_rejected_by_the_argument_spec(run, role):
    host = role + "_var"
    failed = run[host]["failed"]
    assert len(failed) == 1, failed
    name, msg = failed[0]
    assert "Validating arguments against arg spec" in name
    assert role + "_" in msg  # names the variable
    # Argument validation is the role's first task: nothing ran before it.
    assert run[host]["changed"] == [] and run[host]["ok"] == ["Pretend to be another system", "Run the role under test"]


def test_a_branch_after_580_is_refused_for_gpus_older_than_turing(run):
    # A GTX 1080 Ti (Pascal, 1b06) and a V100 (Volta, 1db6) on branch 590: NVIDIA's drivers after 580 do not drive them.
    failed = run["nvidia_driver_legacy_gpu"]["failed"]
    assert len(failed) == 1, failed
    name, msg = failed[0]
    assert run["nvidia_driver_legacy_gpu"]["changed"] == []
    assert "nvidia_driver_legacy_gpu" in msg
    assert name.endswith("Refuse a branch after the last one for GPUs older than Turing"), name
    assert "GPUs 1b06, 1db6 include Maxwell, Pascal or Volta cards" in msg and "up to branch 580 only" in msg


def test_a_fabric_manager_version_other_than_the_drivers_is_refused_before_any_change(run):
    failed = run["fabric_manager_mismatch"]["failed"]
    assert len(failed) == 1, failed
    name, msg = failed[0]
    assert name.endswith("Refuse a fabric manager version other than the driver's (it would not start)"), name
    assert "fabric_manager_mismatch: fabric_manager_version 570.148.08 does not match the driver 570.172.08" in msg
    assert "The version that would match: 570.172.08" in msg
    assert run["fabric_manager_mismatch"]["changed"] == []


def test_a_node_without_nvswitches_installs_nothing_and_says_why(run):
    host = run["fabric_manager_no_nvswitch"]
    assert host["failed"] == [] and host["changed"] == [], host
    assert any(t.endswith("Say why nothing is installed on this node") for t in host["ok"]), host["ok"]
    # Only the preflight ran (the argument validation's name is the role's short description).
    steps = [t for t in host["ok"] if not t.startswith(("Pretend", "Run the role", "Validating arguments"))]
    assert steps == ["Refuse an unsupported operating system", "Refuse a malformed driver or fabric manager version",
                     "Look for NVSwitches (PCI class 0680 of NVIDIA, NVLink 5 switch management bridges)",
                     "Decide which fabric the node has", "Say why nothing is installed on this node"], steps


@pytest.mark.parametrize("role", ["gpu_monitoring", "audit_timer", "elastic_training"])
def test_a_documentation_url_the_unit_cannot_carry_is_refused_before_any_change(run, role):
    # A newline (a directive of its own in the unit), a space (systemd splits Documentation= there), a % (a specifier).
    host = run[role + "_docs_url"]
    assert len(host["failed"]) == 1, host
    name, msg = host["failed"][0]
    assert name.endswith("Refuse a documentation URL the unit cannot carry"), name
    assert "%s_docs_url: %s_docs_base_url must be an http:// or https:// URL" % (role, role) in msg
    assert host["changed"] == []
