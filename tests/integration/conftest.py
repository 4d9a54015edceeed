"""Run each playbook on the simulated fleet once per session and hand its result to the tests.

Under pytest-xdist (`make integration`: --dist loadgroup) a test is scheduled on its own unless it shares a fixture's
run: the tests that read a session run (the demo's burn-in, the preflight) share one group named after it, so that
run happens once; the tests of a file that use its module fixtures share the file's group. A file of independent
tests spreads over every worker instead of holding one for its whole length.
"""

import pytest
from helpers.playbook_runner import run_playbook
from helpers.real_slurm import RealSlurm, unavailable
from helpers.schedule import longest_first, own_items


# Before xdist reads the groups (its own hook of the same name turns them into node ids).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in own_items(items, "integration"):
        if item.get_closest_marker("xdist_group") is None:
            group = shared_run_group(item)
            if group:
                item.add_marker(pytest.mark.xdist_group(group))
    longest_first(items, LONGEST)


# The longest units of this suite (minutes each on a 2-core machine beside the fleet), started first.
LONGEST = ("tests/integration/test_sim_audit.py::test_the_slow_ecc_leak_is_caught_as_a_trend_before_its_first_"
           "uncorrectable_error", "burn_in_run",
           "tests/integration/test_demo_loop.py::test_the_demo_loop_returns_one_node_and_sends_the_lemon_to_rma",
           "tests/integration/test_one_verdict.py",
           "tests/integration/test_operator_journey.py::test_the_burn_stage_in_a_loop_never_loses_a_finding",
           "tests/integration/test_sim_audit.py::test_a_node_twenty_percent_below_its_own_burn_in_baseline_is_flagged",
           "tests/integration/test_lifecycle.py", "real_slurm", "preflight_run")


# Session fixtures below that run a playbook or start daemons: every test that uses one (directly or through a module
# fixture) runs on the worker that made it.
SESSION_RUNS = ("burn_in_run", "preflight_run", "real_slurm")


def shared_run_group(item):
    """The group a test must share a worker with, or None when it runs its own playbooks."""
    names = item.fixturenames  # the whole closure: a module fixture's own fixtures are in it
    for name in SESSION_RUNS:
        if name in names:
            return name
    defs = item._fixtureinfo.name2fixturedefs
    if any(defs[name][-1].scope in ("module", "class") for name in names if defs.get(name)):
        return item.nodeid.split("::", 1)[0]
    return None


@pytest.fixture(scope="session")
def burn_in_run(tmp_path_factory):
    return run_playbook("burn_in", tmp_path_factory.mktemp("burn_in"))


@pytest.fixture(scope="session")
def preflight_run(tmp_path_factory):
    return run_playbook("preflight", tmp_path_factory.mktemp("preflight"))


@pytest.fixture(scope="session")
def real_slurm():
    """One real Slurm (munged, slurmctld, six slurmd: tests/helpers/real_slurm.py) for the files of the xdist group
    "real_slurm"; skipped, with the reason, where it cannot run (not root); an error as root without the packages."""
    why = unavailable()
    if why:
        pytest.skip(why)
    with RealSlurm() as cluster:
        yield cluster
