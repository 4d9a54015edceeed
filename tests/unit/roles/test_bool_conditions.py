"""Every boolean option of every role (from its meta/argument_specs.yml) is read through `| bool` wherever a task
decides on it: `-e key=false` and INI inventories give the STRING "false", which Jinja treats as true.

Generated from the argument specs: a new bool option is covered without touching this test. The behaviour itself is
tested end to end on the simulated fleet (tests/integration/test_booleans.py).
"""

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]


def bool_options():
    for spec_file in sorted(REPO.glob("roles/*/meta/argument_specs.yml")):
        role = spec_file.parts[-3]
        specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
        names = sorted({name for entry in specs.values() for name, opt in (entry.get("options") or {}).items()
                        if opt.get("type") == "bool"})
        for name in names:
            yield role, name


def uses(role, name):
    """(file, line) of every Jinja expression or condition that reads `name` without `| bool` after it."""
    bad = []
    # `| bool` right after the name, or after its `| default(...)` (a playbook variable the role does not default)
    bare = re.compile(r"(?<![\w.'\"])%s\b(?!\s*\|\s*(?:default\([^)]*\)\s*\|\s*)?bool)(?!\s*[:=])" % re.escape(name))
    for path in sorted((REPO / "roles" / role).glob("**/*.yml")) + sorted((REPO / "playbooks").glob("*.yml")):
        if "meta" in path.parts or "defaults" in path.parts or "molecule" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            # Comments and Jinja string literals ('disabled: gpufleet_x is false') are not reads of the variable.
            code = re.sub(r"'[^']*'", "''", line.split("#", 1)[0])
            if name not in code:
                continue
            is_condition = re.match(r"\s*(when|that|until|changed_when|failed_when):", code) or \
                re.match(r"\s*-\s", code) and "when" not in code and "{{" not in code
            in_jinja = "{{" in code or is_condition
            if in_jinja and bare.search(code):
                bad.append("%s:%d: %s" % (path.relative_to(REPO), number, line.strip()))
    return bad


@pytest.mark.parametrize("role,name", list(bool_options()))
def test_boolean_option_is_read_with_bool_filter(role, name):
    assert not uses(role, name), "read %s with `| bool` (a string 'false' is true in Jinja)" % name


def test_there_are_boolean_options_to_check():
    assert len(list(bool_options())) > 20
