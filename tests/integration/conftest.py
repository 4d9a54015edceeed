"""Run each playbook on the simulated fleet once per session and hand its result to the tests.

Under pytest-xdist (`make integration`: --dist loadgroup) every file is one group, so a file's module fixtures run
once on one worker; files that read the same session run (the demo's burn-in) share a group named in their
`pytestmark`, so that run happens once.
"""

import pytest
from helpers.playbook_runner import run_playbook
from helpers.real_slurm import RealSlurm, unavailable


# Before xdist reads the groups (its own hook of the same name turns them into node ids).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


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
