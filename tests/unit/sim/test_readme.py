"""sim/README.md covers what the simulator has: every scenario file in its scenarios table, every scenario key the
loader knows in its schema table, every gpufleet-sim command and state file it writes."""

import re
import sys

from simlib import SCENARIOS, SIM

README = (SIM / "README.md").read_text()


def _table_keys(heading):
    """The first column's `names` of the table under a heading."""
    section = README.split(heading, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)`", section, re.M)}


def test_every_scenario_is_in_the_scenarios_table():
    missing = sorted(set(SCENARIOS) - _table_keys("## The scenarios"))
    assert not missing, "sim/README.md's scenarios table lacks: %s" % missing


def test_every_scenario_key_is_in_the_schema_table():
    sys.path.insert(0, str(SIM))
    from gpufleet_sim.scenario import DEFAULTS

    documented = {k.split(".")[0] for k in _table_keys("## Scenario schema")}
    missing = sorted(set(DEFAULTS) - documented)
    assert not missing, "sim/README.md's scenario schema lacks: %s" % missing


def test_the_clock_its_commands_and_its_state_are_documented():
    usage = (SIM / "bin" / "gpufleet-sim").read_text().split('"""')[1]
    for command in re.findall(r"gpufleet-sim (\w+)", usage):
        assert "gpufleet-sim %s" % command in README, command
    for name in ("clock.json", "leak.json", "timeline", "ecc_leak", "gpufleet-sim clock --advance"):
        assert name in README, name
    assert "is the real wall clock" not in README, "the node's clock moves its timestamps: not the real wall clock"
