# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""A JSON Schema with its $refs replaced by what they point to, once, when it is loaded.

jsonschema looks a $ref up in its referencing registry at every use: for a result of thousands of elements (a burn's
per-GPU series, NVLink counters per link, a 32-node report) that lookup was half of each validation's time. The
inlined schema accepts and refuses the same documents with the same messages: a $ref beside other keywords becomes an
allOf beside them (what 2020-12 defines it to mean), and a $ref that reaches itself again (a recursive schema) is left
in place for the registry to resolve.
"""

from __future__ import annotations

from urllib.parse import urldefrag, urljoin


def _target(documents, uri):
    """(base of the document the target is in, the target) for an absolute ref uri."""
    base, fragment = urldefrag(uri)
    node = documents[base]
    for part in (p for p in fragment.split("/") if p):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return base, node


def inline_refs(schema, documents=None):
    """A copy of schema (a dict with an $id) with every non-recursive $ref inlined. documents: {$id: schema} of the
    other documents its refs name (schema itself is added)."""
    documents = dict(documents or {})
    documents[schema["$id"]] = schema

    def walk(node, base, seen):
        if isinstance(node, list):
            return [walk(item, base, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            uri = urljoin(base, ref)
            if uri not in seen:
                target_base, target = _target(documents, uri)
                target = walk(target, target_base, seen | {uri})
                rest = walk({k: v for k, v in node.items() if k != "$ref"}, base, seen)
                if not rest:
                    return target
                return dict(rest, allOf=[target] + rest.get("allOf", []))
            return dict(node, **{"$ref": uri})  # recursive: absolute, so it resolves wherever it now sits
        # $defs are reached through the refs that use them; left as written for any ref resolved by the registry.
        return {k: (v if k == "$defs" else walk(v, base, seen)) for k, v in node.items()}

    return walk(schema, schema["$id"], frozenset())
