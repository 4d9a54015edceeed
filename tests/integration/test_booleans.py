"""`false` means false however it is written: the strings true/false/yes/no from `-e key=value` and YAML booleans
from an inventory switch the checks on and off (asserted on what ran, not on the exit code). The option names come
from roles/gpufleet/meta/argument_specs.yml; tests/unit/roles/test_bool_conditions.py checks every role statically.
"""

import subprocess
import sys

import yaml
from helpers.playbook_runner import REPO, codes, run_playbook

# The switches of the checks and the check each one controls.
SWITCHES = {"gpufleet_burn_enabled": "gpu_burn", "gpufleet_dcgm_enabled": "dcgm_diag",
            "gpufleet_nccl_enabled": "nccl_test"}


def _inventory(tmp_path, scenario, *nodes_vars):
    """An inventory of one node per host-vars dict (one node without any), all on `scenario`, in host-name order."""
    nodes_vars = nodes_vars or ({},)
    inv = tmp_path / "inv"
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(inv), "--nodes",
                    str(len(nodes_vars)), "--scenario", scenario], check=True)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    for name, host_vars in zip(sorted(hosts["gpufleet_sim"]["hosts"]), nodes_vars, strict=True):
        node = hosts["gpufleet_sim"]["hosts"][name]
        node.update(host_vars)
        node["gpufleet_burn_duration_s"] = 60
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return str(inv)


def _run(tmp_path, inv, extra_args=()):
    """ansible-playbook with -e KEY=VALUE strings, as an operator types them."""
    return run_playbook("burn_in", tmp_path, inventory=inv, extra={"gpufleet_fail_on": "never"}, args=list(extra_args))


def test_string_false_and_no_switch_the_checks_off(tmp_path):
    inv = _inventory(tmp_path, "healthy_h100")
    rc, output, report = _run(tmp_path, inv, ["-e", "gpufleet_burn_enabled=false", "-e", "gpufleet_dcgm_enabled=no",
                                              "-e", "gpufleet_nccl_enabled=False"])
    node = report["nodes"][0]
    for switch, check in SWITCHES.items():
        assert node["checks"][check]["verdict"] == "skipped", (check, node["checks"][check])
        assert "disabled: %s is false" % switch in node["checks"][check]["reasons"][0]


def test_yaml_booleans_in_the_inventory_switch_them_too(tmp_path):
    inv = _inventory(tmp_path, "healthy_h100", {"gpufleet_burn_enabled": False, "gpufleet_dcgm_enabled": True,
                                                "gpufleet_nccl_enabled": "yes"})
    rc, output, report = _run(tmp_path, inv)
    checks = report["nodes"][0]["checks"]
    assert checks["gpu_burn"]["verdict"] == "skipped"
    assert checks["dcgm_diag"]["verdict"] == "pass" and checks["nccl_test"]["verdict"] == "pass", checks


# One run, one node per spelling (the strings as `-e gpufleet_force=no` would pass them, here per node).
FORCE = {"false": False, "no": False, "yes": True, "true": True}


def test_force_false_never_burns_a_busy_gpu(tmp_path):
    inv = _inventory(tmp_path, "neighbour_process", *[{"gpufleet_force": force, "gpufleet_dcgm_enabled": False,
                                                       "gpufleet_nccl_enabled": False} for force in FORCE])
    rc, output, report = _run(tmp_path, inv)
    assert report is not None, output[-3000:]
    nodes = sorted(report["nodes"], key=lambda n: n["host"])
    for node, (force, burned) in zip(nodes, FORCE.items(), strict=True):
        assert "GPU_BUSY" in codes(node), (force, "the report says the GPU was busy either way")
        if burned:
            assert node["checks"]["gpu_burn"]["verdict"] != "skipped" and "CHECKS_REFUSED" not in codes(node), force
        else:
            assert node["checks"]["gpu_burn"]["verdict"] == "skipped" and "CHECKS_REFUSED" in codes(node), force
