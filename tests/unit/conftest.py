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
from helpers.schedule import longest_first, own_items


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


# The longest files of the unit suite (real torch jobs, real terminals, real playbooks; a minute or more each on a
# 2-core machine beside the fleet), started first. Every file stays whole on one worker (its module fixtures).
LONGEST = ("tests/unit/elastic/test_torchrun_elastic.py", "tests/unit/elastic/test_training_alerts.py",
           "tests/unit/postmortem/test_real_torch.py", "tests/unit/cli/test_cli.py", "tests/unit/cli/test_cli_live.py",
           "tests/unit/report/test_action.py", "tests/unit/report/test_rules_nvlink.py", "tests/unit/sim/test_fleet.py")


# Before xdist reads the groups (its own hook of the same name turns them into node ids).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in own_items(items, "unit"):
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    longest_first(items, LONGEST)
