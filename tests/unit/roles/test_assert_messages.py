"""An assert's `fail_msg` (and `success_msg`) never reads bare a variable that its own `that` allows to be undefined.

ansible-core >= 2.19 templates the messages when it finalises the task's arguments, before the assertion is evaluated:
`that: x | default('a') in [...]` with `fail_msg: "got {{ x }}"` fails with "'x' is undefined" when x is not set,
even though the assertion holds (`-e @job.yml` without elastic_training_action did). A variable the `that` guards
(`| default`, `is defined`, `is undefined`) must be guarded the same way in the messages, unless the task's `when`
already requires it to be defined. Read with Jinja2's parser, every assert of the playbooks and roles.
"""

import warnings
from pathlib import Path

import pytest
import yaml
from jinja2 import Environment, nodes

REPO = Path(__file__).resolve().parents[3]
ASSERTS = ("ansible.builtin.assert", "assert")
GUARD_FILTERS = {"default", "d"}
GUARD_TESTS = {"defined", "undefined"}
ENV = Environment()


def task_files():
    return sorted(REPO.glob("playbooks/*.yml")) + sorted(p for p in REPO.glob("roles/*/**/*.yml")
                                                          if not {"defaults", "meta", "vars"} & set(p.parts))


def asserts(node):
    """Every (task, assert arguments) in a parsed YAML document, at any depth (blocks, rescue, plays)."""
    if isinstance(node, list):
        for item in node:
            yield from asserts(item)
    elif isinstance(node, dict):
        for key in ASSERTS:
            if isinstance(node.get(key), dict):
                yield node, node[key]
        for value in node.values():
            yield from asserts(value)


def _expression(text):
    """A condition (bare Jinja expression) or a templated string, as a Jinja AST."""
    text = str(text)
    with warnings.catch_warnings():  # Jinja's lexer warns on regex escapes such as '\d' inside string literals
        warnings.simplefilter("ignore", DeprecationWarning)
        return ENV.parse(text if "{{" in text or "{%" in text else "{{ %s }}" % text)


def _path(node):
    """('x', 'a', 'b') for x.a.b or x['a'].b; None for anything that is not a variable's attribute chain."""
    if isinstance(node, nodes.Name):
        return (node.name,)
    if isinstance(node, nodes.Getattr):
        base = _path(node.node)
        return base + (node.attr,) if base else None
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        base = _path(node.node)
        return base + (str(node.arg.value),) if base else None
    return None


def reads(tree):
    """(path, guarded) of every variable or attribute chain the tree reads: guarded when a default filter or a
    defined test applies to that very chain."""
    out = []

    def walk(node, guarded):
        path = _path(node)
        if path:
            out.append((path, guarded))
            if isinstance(node, nodes.Getitem):
                walk(node.arg, False)
            return
        for child in node.iter_child_nodes():
            wraps = isinstance(node, (nodes.Filter, nodes.Test)) and child is node.node and \
                node.name in (GUARD_FILTERS if isinstance(node, nodes.Filter) else GUARD_TESTS)
            walk(child, wraps)

    walk(tree, False)
    return out


def _under(read, guard):
    """Whether reading `read` fails when `guard` is missing: the variable itself, or (for x.a) any key of x."""
    if len(guard) == 1:
        return read[0] == guard[0]
    return len(read) >= len(guard) and read[:len(guard) - 1] == guard[:-1]


def unguarded_reads(task, args):
    that = args.get("that")
    conditions = that if isinstance(that, list) else [that]
    maybe_undefined = {path for c in conditions if c is not None for path, guarded in reads(_expression(c)) if guarded}
    when = task.get("when")
    for condition in (when if isinstance(when, list) else [when]) if when is not None else []:
        maybe_undefined -= {path for path, guarded in reads(_expression(condition)) if guarded}
    return sorted({".".join(path) for key in ("fail_msg", "msg", "success_msg") if key in args
                   for path, guarded in reads(_expression(args[key]))
                   if not guarded and any(_under(path, g) for g in maybe_undefined)})


def all_bare_reads():
    found = []
    for path in task_files():
        doc = yaml.safe_load(path.read_text())
        for task, args in asserts(doc):
            for name in unguarded_reads(task, args):
                found.append("%s: %r reads %s bare" % (path.relative_to(REPO), task.get("name"), name))
    return found


def test_no_assert_message_reads_a_variable_its_condition_allows_to_be_undefined():
    found = all_bare_reads()
    assert not found, "guard these in the message as the condition does (`| default(...)`):\n" + "\n".join(found)


@pytest.mark.parametrize("message,bad", [
    ("got {{ x }}", ["x"]),
    ("got {{ x | default('deploy') }}", []),
    ("{{ 'a' if x is defined else 'b' }}", []),
])
def test_the_check_sees_a_bare_read(message, bad):
    task = {"ansible.builtin.assert": {"that": "x | default('deploy') in ['deploy']", "fail_msg": message}}
    assert unguarded_reads(task, task["ansible.builtin.assert"]) == bad


def test_a_when_that_requires_the_variable_allows_a_bare_read():
    task = {"when": "x is defined", "ansible.builtin.assert": {"that": ["x is defined", "x | int > 0"],
                                                               "fail_msg": "got {{ x }}"}}
    assert unguarded_reads(task, task["ansible.builtin.assert"]) == []


def test_there_are_asserts_to_check():
    assert sum(1 for p in task_files() for _ in asserts(yaml.safe_load(p.read_text()))) > 30


def test_a_guarded_key_makes_every_other_key_of_its_mapping_suspect():
    task = {"ansible.builtin.assert": {"that": "fm.state | default('') == 'active'",
                                       "fail_msg": "{{ fm.state | default('?') }}", "success_msg": "{{ fm.package }}"}}
    assert unguarded_reads(task, task["ansible.builtin.assert"]) == ["fm.package"]
