"""Every role default is documented in meta/argument_specs.yml (type + description), and the docs agree with the code.

A default missing from the spec, a spec default that differs from defaults/main.yml, or a variable without the role's
prefix fails here. Also checks that `ansible-doc -t role` renders every role's options, so what an operator reads is
what the role validates, and that no role variable can collide with a well-known collection's role variables.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLES = sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/defaults/main.yml"))
VALID_TYPES = {"str", "int", "float", "bool", "list", "dict", "path", "raw", "bytes", "bits"}
# The collection's site policy a role reads under its one name (module_utils/thresholds.py), never a copy of its own:
# the watcher's XID severities are the report's.
SHARED = {"gpufleet_xid_severity_overrides"}


def load(path):
    with open(path) as f:
        return yaml.safe_load(f) or {}


def main_options(role):
    spec = load(REPO / "roles" / role / "meta" / "argument_specs.yml")
    return spec["argument_specs"]["main"]["options"]


def walk_options(options, where):
    """Yield (path, option spec) for every option, suboptions included."""
    for name, opt in options.items():
        yield "%s.%s" % (where, name), opt
        if isinstance(opt, dict) and opt.get("options"):
            yield from walk_options(opt["options"], "%s.%s" % (where, name))


def test_roles_found():
    # The six provisioning roles at least; a typo in the glob must not make every test below vacuous.
    assert {"nvidia_driver", "dcgm", "dcgm_exporter", "gpufleet_node_exporter", "training_env", "validation_tools"} <= set(ROLES)


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_in_the_spec(role):
    defaults = load(REPO / "roles" / role / "defaults" / "main.yml")
    options = main_options(role)
    missing = sorted(set(defaults) - set(options))
    assert not missing, "%s: defaults not documented in meta/argument_specs.yml: %s" % (role, missing)


@pytest.mark.parametrize("role", ROLES)
def test_every_option_has_type_and_description(role):
    spec = load(REPO / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]
    problems = []
    for entry, body in spec.items():
        assert body.get("short_description"), "%s/%s: no short_description" % (role, entry)
        for path, opt in walk_options(body.get("options", {}), "%s:%s" % (role, entry)):
            if opt.get("type") not in VALID_TYPES:
                problems.append("%s: type %r" % (path, opt.get("type")))
            desc = opt.get("description")
            if not desc or (isinstance(desc, list) and not all(isinstance(d, str) and d.strip() for d in desc)):
                problems.append("%s: no description" % path)
            if opt.get("type") == "list" and "elements" not in opt:
                problems.append("%s: list without elements" % path)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("role", ROLES)
def test_spec_defaults_match_the_code(role):
    """A default shown in the docs must be the one the role uses (templated defaults are documented in prose)."""
    defaults = load(REPO / "roles" / role / "defaults" / "main.yml")
    problems = []
    for name, opt in main_options(role).items():
        if name not in defaults:
            if not name.startswith(role) and name not in SHARED:
                problems.append("%s: documented but neither a default nor prefixed with the role name" % name)
            continue
        value = defaults[name]
        if isinstance(value, str) and "{{" in value:
            assert "default" not in opt, "%s: templated default must not be in the spec (it is resolved at validation)" % name
            continue
        if "default" in opt and opt["default"] != value:
            problems.append("%s: spec default %r != defaults/main.yml %r" % (name, opt["default"], value))
        if "choices" in opt:
            chosen = value if isinstance(value, list) else [value]
            bad = [v for v in chosen if v not in opt["choices"]]
            if bad:
                problems.append("%s: default %r not in choices %r" % (name, bad, opt["choices"]))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("role", ROLES)
def test_variables_are_prefixed_with_the_role_name(role):
    defaults = load(REPO / "roles" / role / "defaults" / "main.yml")
    bad = [n for n in defaults if not n.startswith(role + "_")]
    assert not bad, "%s: defaults must be prefixed %s_: %s" % (role, role, bad)


def test_ansible_doc_shows_every_role_option():
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    names = ["kentino.gpufleet.%s" % r for r in ROLES]
    ansible_doc = Path(sys.executable).with_name("ansible-doc")
    proc = subprocess.run([str(ansible_doc), "-t", "role", "-j"] + names, capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    docs = json.loads(proc.stdout)
    for role in ROLES:
        rendered = docs["kentino.gpufleet.%s" % role]["entry_points"]["main"]["options"]
        assert set(rendered) == set(main_options(role)), role
        assert set(load(REPO / "roles" / role / "defaults" / "main.yml")) <= set(rendered), role


# Variable prefixes of widely used roles a site may run next to ours (prometheus.prometheus.node_exporter uses
# node_exporter_*): one inventory value must never mean two things.
FOREIGN_PREFIXES = ("node_exporter_",)


def _role_variable_names(role):
    names = set()
    for sub in ("defaults", "vars"):
        for path in sorted((REPO / "roles" / role / sub).glob("*.yml")):
            names |= set(load(path))
    for path in sorted((REPO / "roles" / role / "tasks").glob("*.yml")):
        tasks = load(path)
        for task in tasks if isinstance(tasks, list) else []:
            if not isinstance(task, dict):
                continue
            if isinstance(task.get("register"), str):
                names.add(task["register"])
            facts = task.get("ansible.builtin.set_fact")
            if isinstance(facts, dict):
                names |= set(facts)
    return names


@pytest.mark.parametrize("role", ROLES)
def test_no_variable_collides_with_a_well_known_role(role):
    clashes = sorted(n for n in _role_variable_names(role) if n.lstrip("_").startswith(FOREIGN_PREFIXES))
    assert not clashes, "%s: %s would share a name with prometheus.prometheus's node_exporter role" % (role, clashes)
