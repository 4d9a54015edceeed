"""Fixtures of the sim tests; the helpers live in simlib.py (importable by name from the tests)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from simlib import SIM, Sim  # noqa: E402


@pytest.fixture
def sim(tmp_path):
    return Sim(tmp_path)


@pytest.fixture(scope="session")
def sim_package():
    """The gpufleet_sim package importable in-process (for direct checks of scenarios and state)."""
    if str(SIM) not in sys.path:
        sys.path.insert(0, str(SIM))
    import gpufleet_sim
    return gpufleet_sim
