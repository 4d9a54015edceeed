"""What every role needs is written once: the supported-OS gate, and the molecule create/prepare/destroy and config.

The provisioning roles import kentino.gpufleet.os_gate instead of repeating the assert. molecule reads .config/molecule/config.yml at the repository root as its base config and merges each scenario's
molecule.yml on top; the shared playbooks live in tests/molecule/. A role that brings its own copy back, or a path
that no longer resolves, fails here.
"""

import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
BASE = REPO / ".config" / "molecule" / "config.yml"
SHARED = REPO / "tests" / "molecule"
SCENARIOS = sorted(REPO.glob("roles/*/molecule/*/molecule.yml"))
# roles/nvidia_driver belongs to another change in flight; its copies are dead (the base config's paths win) and go
# when that change lands.
OWN_COPIES_ALLOWED = set()


def merged(scenario_file):
    """molecule's merge: the scenario's mapping over the base config's, recursively."""
    def merge(base, over):
        out = dict(base)
        for key, value in (over or {}).items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out
    return merge(yaml.safe_load(BASE.read_text()), yaml.safe_load(scenario_file.read_text()))


def test_scenarios_found():
    assert len(SCENARIOS) >= 6


def test_molecule_finds_the_base_config_from_a_role_directory(monkeypatch):
    util = pytest.importorskip("molecule.util")
    monkeypatch.chdir(REPO / "roles" / "dcgm")
    assert Path(util.lookup_config_file(".config/molecule/config.yml")).resolve() == BASE.resolve()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.parts[-4])
def test_playbooks_resolve_to_the_shared_ones(scenario):
    playbooks = merged(scenario)["provisioner"]["playbooks"]
    for step in ("create", "destroy", "prepare"):
        path = (scenario.parent / playbooks[step]).resolve()
        assert path.is_file(), "%s: %s playbook %s does not exist" % (scenario, step, path)
        if step != "prepare":
            assert path.parent == SHARED.resolve(), "%s: %s must be the shared tests/molecule/%s.yml" % (
                scenario, step, step)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.parts[-4])
def test_no_role_keeps_its_own_copy(scenario):
    role = scenario.parts[-4]
    if role in OWN_COPIES_ALLOWED:
        pytest.skip("%s: copies kept until its own change lands" % role)
    own = sorted(p.name for p in scenario.parent.glob("*.yml") if p.name in ("create.yml", "destroy.yml"))
    assert not own, "%s keeps %s: use the shared ones in tests/molecule/" % (scenario.parent, own)
    shared_prepare = (SHARED / "prepare.yml").read_bytes()
    prepare = scenario.parent / "prepare.yml"
    assert not (prepare.exists() and prepare.read_bytes() == shared_prepare), "%s duplicates tests/molecule/prepare.yml" % (
        prepare)
    assert os.path.exists(scenario.parent / "converge.yml") and os.path.exists(scenario.parent / "verify.yml")


def test_the_os_gate_is_written_once():
    """Only roles/os_gate says "is not supported by"; every provisioning role imports it."""
    copies = sorted(str(p.relative_to(REPO)) for p in REPO.glob("roles/*/tasks/*.yml")
                    if "is not supported by" in p.read_text()
                    and p.parts[-3] not in {"os_gate"} | OWN_COPIES_ALLOWED)
    assert not copies, "supported-OS assert repeated in %s: import kentino.gpufleet.os_gate instead" % copies
    importers = sorted({p.parts[-3] for p in REPO.glob("roles/*/tasks/preflight*.yml")
                        if "name: kentino.gpufleet.os_gate" in p.read_text()})
    assert importers == ["audit_timer", "dcgm", "dcgm_exporter", "elastic_training", "fabric_manager",
                         "gpu_monitoring", "gpufleet_node_exporter",
                         "nvidia_driver", "training_env", "validation_tools"]
