"""inventories/example is the template operators copy: the playbooks accept it (syntax check), the run's own check
(kentino.gpufleet.run_guard) accepts every variable name and type in it, every role variable in it is an option of
that role with a valid value, and the ansible.cfg beside it is the one docs/operating.md shows."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "inventories" / "example"
BIN = Path(sys.executable).parent
ROLES = sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/meta/argument_specs.yml"))

GUARD = """
- name: Check the example inventory as a run does before it touches a node
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Refuse typos, wrong types and an unwritable report directory
      kentino.gpufleet.run_guard:
        hosts: "{{ groups['gpufleet_nodes'] }}"
        playbook: burn_in
        report_dir: "{{ report_dir }}"
      register: __guard

    - name: Show what it checked
      ansible.builtin.debug:
        msg: "{{ __guard.msg }}"
"""

ROLE_SPECS = """
- name: Validate every role's variables of the example inventory against the role's argument spec
  hosts: gpufleet_nodes
  gather_facts: false
  tasks:
    - name: Validate against {{ item }}'s argument spec
      ansible.builtin.validate_argument_spec:
        argument_spec: "{{ (lookup('ansible.builtin.file', repo ~ '/roles/' ~ item ~ '/meta/argument_specs.yml')
                            | from_yaml).argument_specs.main.options }}"
        # A role's required options the inventory does not set: os_gate's caller, the example job's file.
        provided_arguments: "{{ {'os_gate_role': 'example'} if item == 'os_gate' else
                                (lookup('ansible.builtin.file', repo ~ '/inventories/example-job.yml')
                                 | from_yaml) if item == 'elastic_training' else {} }}"
      loop: %s
""" % json.dumps(ROLES)


def _env():
    return dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_INJECT_FACT_VARS="false",
                ANSIBLE_NOCOLOR="1")


def _playbook(args, **kwargs):
    return subprocess.run([str(BIN / "ansible-playbook")] + args, cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=300, **kwargs)


@pytest.mark.parametrize("playbook", ["burn_in", "preflight", "provision"])
def test_playbooks_accept_the_example_inventory(playbook):
    proc = _playbook(["kentino.gpufleet.%s" % playbook, "-i", str(EXAMPLE), "--syntax-check"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[WARNING]" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def _guard(tmp_path, inventory, *extra):
    (tmp_path / "guard.yml").write_text(GUARD)
    return _playbook([str(tmp_path / "guard.yml"), "-i", str(inventory), "--check",
                      "-e", "report_dir=%s" % (tmp_path / "reports")] + list(extra))


def test_run_guard_accepts_every_name_and_type_of_the_example(tmp_path):
    proc = _guard(tmp_path, EXAMPLE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 host(s) checked" in proc.stdout


def test_run_guard_would_refuse_a_typo_in_it(tmp_path):
    # The same check fails on the example with one misspelt name (here a provisioning role's): it can fail.
    copy = tmp_path / "inventory"
    subprocess.run(["cp", "-r", str(EXAMPLE), str(copy)], check=True)
    group = copy / "group_vars" / "gpufleet_nodes.yml"
    group.write_text(group.read_text().replace("gpufleet_node_exporter_listen_address:",
                                               "gpufleet_node_exporter_listen_adress:"))
    proc = _guard(tmp_path, copy)
    assert proc.returncode != 0
    assert "unknown variable gpufleet_node_exporter_listen_adress" in proc.stdout
    assert "did you mean gpufleet_node_exporter_listen_address" in proc.stdout


def test_role_variables_are_valid_for_their_roles(tmp_path):
    (tmp_path / "roles.yml").write_text(ROLE_SPECS)
    proc = _playbook([str(tmp_path / "roles.yml"), "-i", str(EXAMPLE), "-e", "repo=%s" % REPO])
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert proc.stdout.count("ok: [") >= 3 * len(ROLES) or "ok=%d" % len(ROLES) in proc.stdout


def _role_prefixes():
    """Longest prefix first, so dcgm_exporter_ is not taken for dcgm_ nor gpufleet_node_exporter_ for gpufleet_."""
    return sorted(((r + "_", r) for r in ROLES), key=lambda p: -len(p[0]))


def test_every_role_variable_of_the_example_is_an_option_of_its_role():
    options = {}
    for role in ROLES:
        spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        options[role] = {name for entry in spec.values() for name in (entry.get("options") or {})}
    seen = {}
    for path in sorted(EXAMPLE.rglob("*.yml")):
        data = yaml.safe_load(path.read_text()) or {}
        for name in data if "group_vars" in path.parts else []:
            role = next((r for prefix, r in _role_prefixes() if name.startswith(prefix)), None)
            if role is None or role == "gpufleet":
                continue  # the gpufleet role's options and the thresholds: run_guard checks them above
            assert name in options[role], "%s: %s is not an option of %s" % (path.name, name, role)
            seen.setdefault(role, set()).add(name)
    provisioning = {"nvidia_driver", "dcgm", "dcgm_exporter", "gpufleet_node_exporter", "training_env",
                    "validation_tools", "gpu_monitoring"}
    assert provisioning <= set(seen), "the example sets variables of every provisioning role: %s" % (
        provisioning - set(seen))


def test_the_example_has_what_a_real_fleet_needs():
    merged = {}
    for name in ("gpufleet_nodes.yml", "rtx5090_risers.yml", "h100_sxm.yml"):
        merged.update(yaml.safe_load((EXAMPLE / "group_vars" / name).read_text()))
    for name in ("gpufleet_expected_gpus", "gpufleet_nccl_min_busbw_gbps", "gpufleet_psu_rails",
                 "gpufleet_checkpoint_path", "gpufleet_checkpoint_size_gb", "gpufleet_checkpoint_keep",
                 "gpufleet_checkpoint_interval_min", "gpufleet_train_user", "gpufleet_ssh_extra_args",
                 "gpufleet_fail_on"):
        assert name in merged, name


def test_the_example_ansible_cfg_is_the_documented_one():
    cfg = (EXAMPLE / "ansible.cfg").read_text()
    assert "callbacks_enabled = kentino.gpufleet.run_record" in cfg
    assert cfg.strip() in (REPO / "docs" / "operating.md").read_text(), "docs/operating.md shows this ansible.cfg"


def test_every_playbook_variable_is_documented_for_operators():
    from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import THRESHOLDS
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils import run_guard

    doc = (REPO / "docs" / "operating.md").read_text()
    defaults = yaml.safe_load((REPO / "roles" / "gpufleet" / "defaults" / "main.yml").read_text())
    playbook_vars = [n for n in run_guard.role_spec() if n not in defaults and n not in THRESHOLDS]
    missing = [name for name in playbook_vars if "`%s`" % name not in doc]
    assert not missing, "docs/operating.md does not describe %s" % missing
