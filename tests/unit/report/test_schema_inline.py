"""Result and report schemas with their $refs inlined (plugin_utils/schema_inline.py) refuse exactly what the schemas
as written refuse, with the same messages at the same places, on recorded results and on results made wrong."""

import copy
import json
from pathlib import Path

import jsonschema
import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import report
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import reading
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.schema_inline import inline_refs

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "report" / "sim_burn_in.json"
SCHEMAS = sorted(p.stem for p in reading.SCHEMA_DIR.glob("*.json") if p.stem != "common")


def as_written(name):
    schema = json.loads((reading.SCHEMA_DIR / ("%s.json" % name)).read_text())
    return jsonschema.validators.validator_for(schema)(schema, registry=reading._registry())


def errors(validator, doc):
    return sorted((list(map(str, e.absolute_path)), e.validator, e.message) for e in validator.iter_errors(doc))


def leaves(node, path=()):
    """Paths of the scalar leaves of a document, in order."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from leaves(value, path + (i,))
    else:
        yield path


def made_wrong(doc):
    """The document, and copies with an unexpected key, a leaf of the wrong type, a key removed."""
    yield doc
    if isinstance(doc, dict):
        yield dict(doc, unexpected_key=1)
        for key in list(doc)[:3]:
            yield {k: v for k, v in doc.items() if k != key}
    for path in list(leaves(doc))[::11][:5]:
        wrong = copy.deepcopy(doc)
        node = wrong
        for part in path[:-1]:
            node = node[part]
        if path:
            node[path[-1]] = {"not": "a scalar"} if isinstance(node[path[-1]], str) else "not a number"
            yield wrong


def recorded_results():
    hosts = json.loads(RECORDED.read_text())["hosts"]
    for _host, variables in sorted(hosts.items()):
        for key, result in sorted(variables.items()):
            if key.startswith("gpufleet_result_") and isinstance(result, dict):
                yield key[len("gpufleet_result_"):], reading.strip_envelope(result)
                for fact in (result.get("ansible_facts") or {}).values():
                    if isinstance(fact, dict):
                        yield key[len("gpufleet_result_"):], fact


@pytest.mark.parametrize("name", SCHEMAS)
def test_an_inlined_result_schema_refuses_what_the_schema_refuses(name):
    # One recorded result a module (a burn's has thousands of elements, each validated twice); a schema with no
    # recorded result (fabric, ib_ports, rma_manifest, ...) is compared on {} and its mutations.
    doc = next((doc for module, doc in recorded_results() if module == name), {})
    written, inlined = as_written(name), reading.validator(name)
    refused = 0
    for candidate in made_wrong(doc):
        expected = errors(written, candidate)
        assert errors(inlined, candidate) == expected
        refused += bool(expected)
    assert refused, "no copy of the %s result was refused: the comparison compared nothing" % name


def test_the_inlined_report_schema_refuses_what_the_report_schema_refuses():
    hosts = json.loads(RECORDED.read_text())["hosts"]
    doc = report.build_report(report.evaluate_fleet(sorted(hosts)[:1], hosts), "20261204T000000Z-abcdef",
                              playbook="burn_in")
    written = jsonschema.Draft202012Validator(report.load_schema())
    assert errors(written, doc) == []
    for candidate in made_wrong(doc):
        assert errors(report._validator(), candidate) == errors(written, candidate)


def test_a_recursive_ref_is_left_for_the_registry_and_a_ref_beside_keywords_keeps_them():
    schema = {"$id": "https://example.invalid/tree.json", "$ref": "#/$defs/tree",
              "$defs": {"tree": {"type": "object", "properties": {"children": {"type": "array",
                                                                              "items": {"$ref": "#/$defs/tree"}}},
                                 "additionalProperties": False},
                        "named": {"$ref": "#/$defs/tree", "required": ["children"]}}}
    inlined = inline_refs(schema)
    tree = inlined["allOf"][0]["properties"]["children"]["items"]
    assert tree == {"$ref": "https://example.invalid/tree.json#/$defs/tree"}
    v = jsonschema.Draft202012Validator(inlined)
    assert v.is_valid({"children": [{"children": []}]})
    assert not v.is_valid({"children": [{"children": [], "leaf": 1}]})  # the registry resolves the recursion
    named = inline_refs(dict(schema, **{"$ref": "#/$defs/named"}))
    assert named["allOf"][0]["required"] == ["children"] and named["allOf"][0]["allOf"][0]["type"] == "object"
    v = jsonschema.Draft202012Validator(named)
    assert not v.is_valid({}) and v.is_valid({"children": []}) and not v.is_valid({"children": [], "leaf": 1})
