"""The execution environment for AWX / Ansible Automation Platform: `ansible-builder create` turns
execution-environment.yml and the collection's artifact into a build context that installs the collection, its Python
and system dependencies, and the persistent report and history paths the job template mounts (docs/audit.md).
Building the image itself needs a container engine and a registry: `ansible-builder build` does that step."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def test_ansible_builder_creates_the_build_context(tmp_path):
    builder = BIN / "ansible-builder"
    if not builder.exists():
        pytest.fail("ansible-builder is a dev dependency (pyproject.toml): pip install ansible-builder")
    work = tmp_path / "ee-build"
    work.mkdir()
    shutil.copy(REPO / "execution-environment.yml", work)
    shutil.copytree(REPO / "ee", work / "ee", ignore=shutil.ignore_patterns("*.tar.gz"))
    built = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path",
                            str(work / "ee"), str(REPO)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    artifact = "kentino-gpufleet-%s.tar.gz" % version
    assert (work / "ee" / artifact).exists()
    definition = yaml.safe_load((work / "execution-environment.yml").read_text())
    assert definition["version"] == 3
    assert definition["additional_build_files"][0]["src"] == "ee/" + artifact, "the EE names the current version"
    assert yaml.safe_load((work / "ee" / "requirements.yml").read_text())["collections"][0]["name"].endswith(artifact)
    proc = subprocess.run([str(builder), "create", "-f", "execution-environment.yml", "-c", "context",
                           "--output-filename", "Containerfile"], cwd=work, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    context = work / "context"
    containerfile = (context / "Containerfile").read_text()
    assert "quay.io/centos/centos:stream9" in containerfile
    assert re.search(r"ansible-galaxy collection install .*requirements\.yml", containerfile) or \
        "install-from-bindep" in containerfile and "ansible-galaxy" in containerfile
    assert "GPUFLEET_REPORT_DIR=/var/lib/gpufleet/reports" in containerfile
    assert (context / "_build" / "collections" / artifact).exists()
    python = (context / "_build" / "requirements.txt").read_text()
    project = (REPO / "pyproject.toml").read_text()
    for requirement in ("Jinja2", "PyYAML", "jsonschema", "prometheus-client", "rich"):
        assert requirement in python and requirement in project
    assert "openssh-clients" in (context / "_build" / "bindep.txt").read_text()
