"""Offline equivalent of `ansible-test sanity` for this collection.

ansible-test bootstraps pip from the network for its per-test venvs, which these machines cannot reach. These tests
cover the checks that matter most: every module imports, documents itself in parseable YAML, agrees with its
argument_spec, renders with ansible-doc; node-side code is stdlib-only and parses as Python 3.8.
"""

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
NODE_SIDE = sorted((REPO / "plugins" / "module_utils").glob("*.py")) + sorted((REPO / "plugins" / "modules").glob("*.py"))
FQCN = "kentino.gpufleet."


class _Captured(Exception):
    def __init__(self, kwargs):
        super().__init__("argument_spec captured")
        self.kwargs = kwargs


def _capture_module_kwargs(name, monkeypatch):
    mod = importlib.import_module("ansible_collections.kentino.gpufleet.plugins.modules." + name)

    def fake(*args, **kwargs):
        raise _Captured(kwargs)

    monkeypatch.setattr(mod, "AnsibleModule", fake)
    with pytest.raises(_Captured) as info:
        mod.main()
    return mod, info.value.kwargs


def _compare_options(doc_opts, spec, where):
    problems = []
    doc_opts = doc_opts or {}
    for key in sorted(set(doc_opts) | set(spec)):
        if key not in spec:
            problems.append("%s%s: documented but not in argument_spec" % (where, key))
            continue
        if key not in doc_opts:
            problems.append("%s%s: in argument_spec but not documented" % (where, key))
            continue
        doc, arg = doc_opts[key], spec[key]
        if doc.get("type", "str") != arg.get("type", "str"):
            problems.append("%s%s: type %r in docs, %r in spec" % (where, key, doc.get("type", "str"), arg.get("type", "str")))
        if doc.get("default") != arg.get("default"):
            problems.append("%s%s: default %r in docs, %r in spec" % (where, key, doc.get("default"), arg.get("default")))
        if bool(doc.get("required", False)) != bool(arg.get("required", False)):
            problems.append("%s%s: required differs" % (where, key))
        if doc.get("choices") != arg.get("choices"):
            problems.append("%s%s: choices %r in docs, %r in spec" % (where, key, doc.get("choices"), arg.get("choices")))
        if arg.get("type") in ("list",) and doc.get("elements") != arg.get("elements"):
            problems.append("%s%s: elements %r in docs, %r in spec" % (where, key, doc.get("elements"), arg.get("elements")))
        if "options" in arg or "suboptions" in doc:
            problems += _compare_options(doc.get("suboptions"), arg.get("options") or {}, where + key + ".")
    return problems


def test_there_are_modules():
    assert MODULES, "no modules found under plugins/modules"


@pytest.mark.parametrize("name", MODULES)
def test_module_docs_match_argument_spec(name, monkeypatch):
    mod, kwargs = _capture_module_kwargs(name, monkeypatch)
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert doc["module"] == name
    assert doc.get("short_description") and doc.get("description")
    examples = yaml.safe_load(mod.EXAMPLES)
    assert examples, "EXAMPLES is empty"
    example_text = mod.EXAMPLES
    assert FQCN + name in example_text, "EXAMPLES must use the FQCN " + FQCN + name
    returns = yaml.safe_load(mod.RETURN)
    assert returns, "RETURN is empty"
    assert kwargs.get("supports_check_mode") is True, "modules must support check mode"
    problems = _compare_options(doc.get("options"), kwargs["argument_spec"], "")
    assert not problems, "\n".join(problems)


def _plugin_names():
    names = [("module", m) for m in MODULES]
    for kind in ("callback", "filter", "lookup", "inventory"):
        for path in sorted((REPO / "plugins" / kind).glob("*.py")):
            if path.stem != "__init__" and "DOCUMENTATION" in path.read_text():
                names.append((kind, path.stem))
    return names


@pytest.mark.parametrize("kind,name", _plugin_names())
def test_ansible_doc_renders(kind, name):
    ansible_doc = Path(sys.executable).with_name("ansible-doc")
    proc = subprocess.run([str(ansible_doc), "-t", kind, "--json", FQCN + name], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert FQCN + name in data and data[FQCN + name]["doc"], proc.stdout[:500]
    # The text rendering fails on docs that are valid YAML but the wrong shape (a note read as a mapping).
    text = subprocess.run([str(ansible_doc), "-t", kind, FQCN + name], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PAGER": "cat", "ANSIBLE_NOCOLOR": "1"})
    assert text.returncode == 0 and "ERROR" not in text.stderr, text.stderr
    assert FQCN + name in text.stdout


_ALLOWED_PREFIXES = ("ansible.module_utils", "ansible_collections.kentino.gpufleet.plugins.module_utils", "__future__")


@pytest.mark.parametrize("path", NODE_SIDE, ids=lambda p: p.name)
def test_node_side_is_stdlib_only_and_py38(path):
    source = path.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            ok = top in sys.stdlib_module_names or name.startswith(_ALLOWED_PREFIXES)
            assert ok, "%s imports %s: node-side code must be stdlib-only" % (path.name, name)
