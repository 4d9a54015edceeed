"""Offline equivalent of `ansible-test sanity` for this collection.

ansible-test bootstraps pip from the network for its per-test venvs, which these machines cannot reach. These tests
cover the checks that matter most: every module imports, documents itself in parseable YAML, agrees with its
argument_spec (doc fragments merged, as ansible-doc shows them), declares its attributes, uses the same names and types
as the other modules for the same things, references only options and return values that exist, renders with
ansible-doc; node-side code is stdlib-only and parses as Python 3.8.
"""

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
NODE_SIDE = sorted((REPO / "plugins" / "module_utils").glob("*.py")) + sorted((REPO / "plugins" / "modules").glob("*.py"))
FQCN = "kentino.gpufleet."
CHECK_COMMON = FQCN + "check_common"
ATTRIBUTE_SUPPORT = {"full", "partial", "none", "N/A"}


def _ansible_doc(kind, names, json_out):
    ansible_doc = Path(sys.executable).with_name("ansible-doc")
    return subprocess.run([str(ansible_doc), "-t", kind] + (["--json"] if json_out else []) + [FQCN + n for n in names],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PAGER": "cat", "ANSIBLE_NOCOLOR": "1"})


@pytest.fixture(scope="module")
def rendered_docs():
    """{kind: (JSON run, text run)} of ansible-doc over every plugin of that kind at once, made on first use: one
    start of ansible-doc per kind and form instead of two per plugin (half a minute of the suite)."""
    runs = {}

    def get(kind):
        if kind not in runs:
            names = [n for k, n in _plugin_names() if k == kind]
            runs[kind] = (_ansible_doc(kind, names, True), _ansible_doc(kind, names, False))
        return runs[kind]

    return get


@pytest.fixture(scope="module")
def merged_docs(rendered_docs):
    """{module: ansible-doc --json entry}: the documentation as users see it, doc fragments merged in."""
    proc, _text = rendered_docs("module")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    return {m: data[FQCN + m] for m in MODULES}


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
        if sorted(doc.get("aliases") or []) != sorted(arg.get("aliases") or []):
            problems.append("%s%s: aliases %r in docs, %r in spec" % (where, key, doc.get("aliases"), arg.get("aliases")))
        if "options" in arg or "suboptions" in doc:
            problems += _compare_options(doc.get("suboptions"), arg.get("options") or {}, where + key + ".")
    return problems


def test_there_are_modules():
    assert MODULES, "no modules found under plugins/modules"


@pytest.mark.parametrize("name", MODULES)
def test_module_docs_match_argument_spec(name, monkeypatch, merged_docs):
    mod, kwargs = _capture_module_kwargs(name, monkeypatch)
    doc = merged_docs[name]["doc"]
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


@pytest.mark.parametrize("name", MODULES)
def test_module_declares_its_attributes(name, merged_docs):
    attributes = merged_docs[name]["doc"].get("attributes") or {}
    problems = []
    for required in ("check_mode", "diff_mode", "platform"):
        if required not in attributes:
            problems.append("attribute %s is not documented" % required)
    for key, attr in attributes.items():
        if attr.get("support") not in ATTRIBUTE_SUPPORT:
            problems.append("attribute %s: support %r is not one of %s" % (key, attr.get("support"),
                                                                          sorted(ATTRIBUTE_SUPPORT)))
        if attr.get("support") == "partial" and not attr.get("details"):
            problems.append("attribute %s: partial support must say what is missing (details)" % key)
    if attributes.get("check_mode", {}).get("support") == "none":
        problems.append("check_mode support none, but every module supports check mode")
    if not attributes.get("platform", {}).get("platforms"):
        problems.append("attribute platform names no platforms")
    assert not problems, "\n".join(problems)


def _check_options_helper():
    return importlib.import_module("ansible_collections.kentino.gpufleet.plugins.module_utils.check_options")


def test_check_common_fragment_matches_the_helper():
    """The doc fragment and check_options.check_argument_spec() describe the same options with the same types."""
    fragment = importlib.import_module("ansible_collections.kentino.gpufleet.plugins.doc_fragments.check_common")
    documented = yaml.safe_load(fragment.ModuleDocFragment.DOCUMENTATION)["options"]
    spec = _check_options_helper().check_argument_spec()
    problems = _compare_options(documented, spec, "check_common: ")
    assert not problems, "\n".join(problems)
    with pytest.raises(ValueError):
        _check_options_helper().check_argument_spec(timeout=dict(type="int", default=5))


@pytest.mark.parametrize("name", MODULES)
def test_common_options_come_from_one_fragment(name, monkeypatch):
    """A module that takes `executable` takes it (and `timeout`) from check_common, in its docs and in its spec."""
    mod, kwargs = _capture_module_kwargs(name, monkeypatch)
    spec = kwargs["argument_spec"]
    raw = yaml.safe_load(mod.DOCUMENTATION)
    common = _check_options_helper().check_argument_spec()
    uses_fragment = CHECK_COMMON in (raw.get("extends_documentation_fragment") or [])
    if "executable" not in spec and not uses_fragment:
        pytest.skip("%s runs no single tool" % name)
    assert uses_fragment, "%s: executable must be documented by extends_documentation_fragment %s" % (name, CHECK_COMMON)
    own = sorted(set(raw.get("options") or {}) & set(common))
    assert not own, "%s documents %s itself; the fragment does (per-module defaults go in notes)" % (name, own)
    for key in common:
        assert spec.get(key) == common[key], "%s: %s must come from check_argument_spec(), got %r" % (name, key,
                                                                                                    spec.get(key))


def _all_options(merged_docs):
    for name in MODULES:
        for key, opt in (merged_docs[name]["doc"].get("options") or {}).items():
            yield name, key, opt


def test_option_names_mean_one_thing_across_modules(merged_docs):
    """Same name, same meaning and type: executables are paths, a working directory is chdir, gpus is an index list."""
    problems = []
    for name, key, opt in _all_options(merged_docs):
        if (key == "executable" or key.endswith("_executable")) and opt.get("type") != "path":
            problems.append("%s.%s: an executable option is type path, not %r" % (name, key, opt.get("type")))
        if key == "cwd":
            problems.append("%s.cwd: a working directory option is named chdir (keep cwd as an alias)" % name)
        if key == "timeout" and opt.get("type") != "int":
            problems.append("%s.timeout: seconds as int, not %r" % (name, opt.get("type")))
        if "gpus" in [key] + list(opt.get("aliases") or []) and key != "gpus_per_process" and \
                (opt.get("type"), opt.get("elements")) != ("list", "int"):
            problems.append("%s.%s: gpus means GPU indexes (list of int); a count needs another name" % (name, key))
    assert not problems, "\n".join(problems)


_REF = re.compile(r"\b(O|RV)\(([^)=]+)(?:=[^)]*)?\)")


def _texts(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from _texts(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _texts(value)


def _has_path(tree, dotted, child_key):
    """True when a.b[].c exists in an options/return tree (suboptions under child_key)."""
    node = {"_": {child_key: tree}}["_"]
    for part in dotted.replace("[]", "").split("."):
        children = node.get(child_key) or {}
        by_alias = dict((alias, opt) for opt in children.values() for alias in opt.get("aliases") or [])
        if part not in children and part not in by_alias:
            return False
        node = children.get(part) or by_alias[part]
    return True


def _owner(ref, name):
    """O(kentino.gpufleet.other#module:opt) names another module's option; a bare O(opt) is this module's."""
    if "#" not in ref:
        return name, ref
    fqcn, _, rest = ref.partition("#")
    plugin_type, _, ref = rest.partition(":")
    if not fqcn.startswith("kentino.gpufleet.") or plugin_type != "module":
        return None, ref
    return fqcn.rsplit(".", 1)[1], ref


@pytest.mark.parametrize("name", MODULES)
def test_semantic_markup_references_exist(name, merged_docs):
    """O(x) names an option of this module and RV(y) one of its return values (antsibull-docs checks more in make lint)."""
    entry = merged_docs[name]
    problems = []
    for where, tree in (("doc", entry["doc"]), ("return", entry.get("return") or {})):
        for text in _texts(tree):
            for kind, ref in _REF.findall(text):
                owner, ref = _owner(ref.strip(), name)
                if owner not in merged_docs:
                    problems.append("%s: %s(%s) names a module the collection does not have" % (where, kind, ref))
                    continue
                target = merged_docs[owner]
                if kind == "O" and not _has_path(target["doc"].get("options") or {}, ref, "suboptions"):
                    problems.append("%s: O(%s) is not an option of %s" % (where, ref, owner))
                if kind == "RV" and not _has_path(target.get("return") or {}, ref, "contains"):
                    problems.append("%s: RV(%s) is not a return value of %s" % (where, ref, owner))
    assert not problems, "\n".join(problems)


def _plugin_names():
    names = [("module", m) for m in MODULES]
    for kind in ("callback", "filter", "lookup", "inventory"):
        for path in sorted((REPO / "plugins" / kind).glob("*.py")):
            if path.stem != "__init__" and "DOCUMENTATION" in path.read_text():
                names.append((kind, path.stem))
    return names


@pytest.mark.parametrize("kind,name", _plugin_names())
def test_ansible_doc_renders(kind, name, rendered_docs):
    as_json, as_text = rendered_docs(kind)
    if as_json.returncode != 0 or as_text.returncode != 0 or "ERROR" in as_text.stderr:
        # Something of this kind does not render: run this plugin alone, so that each test names its own problem.
        as_json, as_text = _ansible_doc(kind, [name], True), _ansible_doc(kind, [name], False)
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert FQCN + name in data and data[FQCN + name]["doc"], as_json.stdout[:500]
    # The text rendering fails on docs that are valid YAML but the wrong shape (a note read as a mapping).
    assert as_text.returncode == 0 and "ERROR" not in as_text.stderr, as_text.stderr
    assert re.search(r"^> \S+ %s \(" % re.escape(FQCN + name), as_text.stdout, re.M), as_text.stdout[:500]  # its heading


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
