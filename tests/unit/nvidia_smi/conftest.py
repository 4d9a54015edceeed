"""Fixtures for the nvidia-smi tests: fixture paths and a stand-in nvidia-smi on PATH."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia_smi"
STANDIN = Path(__file__).resolve().with_name("standin_nvidia_smi.py")


class StandIn:
    """A `nvidia-smi` in tmp_path answering from one fixture scenario; `calls` lists the argv of each invocation."""

    def __init__(self, tmp_path, scenario):
        self.bin_dir = tmp_path / "bin"
        self.bin_dir.mkdir(exist_ok=True)
        self.path = self.bin_dir / "nvidia-smi"
        self.path.write_text("#!%s\n%s" % (sys.executable, STANDIN.read_text()))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.log = tmp_path / "nvsmi_calls.log"
        self.env = {
            "NVSMI_STANDIN_DIR": str(FIXTURES / scenario),
            "NVSMI_STANDIN_LOG": str(self.log),
            "NVSMI_STANDIN_STATE": str(tmp_path / "nvsmi_state"),
        }

    @property
    def calls(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


@pytest.fixture
def standin(tmp_path):
    def make(scenario):
        return StandIn(tmp_path, scenario)

    return make


@pytest.fixture
def fixture_text():
    def read(relative):
        return (FIXTURES / relative).read_text()

    return read


@pytest.fixture
def empty_path(tmp_path):
    """A PATH with no nvidia-smi on it (the module's own python is found through sys.executable, not PATH)."""
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    return {"PATH": str(empty) + os.pathsep + "/usr/bin:/bin"}
