"""The module contract, checked on every module result the unit tests produce.

A check module returns observations plus the verdict its judge gives them. The fleet report validates those
observations against the module's JSON Schema and re-judges them with the inventory's thresholds, never reading the
node's verdict. So a module result is only right when (1) it matches its schema and (2) the same judge, given the
same thresholds and the returned observations alone, answers exactly the node's verdict and reasons.
"""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import node_name
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import module_fields
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import schema_errors, strip_envelope


def rejudge(name, result, judge, t, **kwargs):
    """Findings of `judge` on a module result; asserts the schema and that they give the node's own verdict."""
    data = strip_envelope(result)
    assert schema_errors(name, data) == [], "result of %s does not match its schema" % name
    findings = judge(data, t, node_name(), **kwargs)
    mine = module_fields(findings, data.get("not_run"))
    assert (mine["verdict"], mine["reasons"]) == (result["verdict"], result["reasons"]), \
        "the judge reads the returned observations differently from the module"
    return findings


@pytest.fixture
def contract():
    """contract(module name, result, judge, thresholds, **judge kwargs) -> the judge's findings."""
    return rejudge
