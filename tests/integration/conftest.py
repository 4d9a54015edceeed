"""Run each playbook on the simulated fleet once per session and hand its result to the tests."""

import pytest
from helpers.playbook_runner import run_playbook


@pytest.fixture(scope="session")
def burn_in_run(tmp_path_factory):
    return run_playbook("burn_in", tmp_path_factory.mktemp("burn_in"))


@pytest.fixture(scope="session")
def preflight_run(tmp_path_factory):
    return run_playbook("preflight", tmp_path_factory.mktemp("preflight"))
