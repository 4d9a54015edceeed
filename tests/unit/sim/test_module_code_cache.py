"""A simulated node's module runs reuse code compiled from their payload zips (sim/gpufleet_sim/module_code_cache.py),
never stale code: a changed source compiles again, a damaged cache entry is compiled over, tracebacks name the zip
the code was imported from this time, and zips that are no Ansible payload are left alone."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROBE = """
import json, sys, traceback
sys.path.insert(0, sys.argv[1])
import pkg.mod
try:
    pkg.mod.fail()
except ValueError:
    where = traceback.extract_tb(sys.exc_info()[2])[-1].filename
print(json.dumps({"value": pkg.mod.VALUE, "where": where, "file": pkg.mod.__file__}))
"""


def payload(tmp_path, run, value, name="ansible_probe_payload.zip"):
    """A zip laid out like AnsiballZ's: a fresh temporary directory per run, the payload zip inside."""
    archive = tmp_path / ("run%d" % run) / name
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
        zf.writestr("pkg/mod.py", "VALUE = %r\n\ndef fail():\n    raise ValueError('from the payload')\n" % value)
    return archive


def run_probe(tmp_path, archive):
    env = dict(os.environ, PYTHONPATH=str(REPO / "sim" / "site"), GPUFLEET_SIM_STATE=str(tmp_path / "state" / "node01"))
    env.pop("GPUFLEET_SIM_SCENARIO", None)
    proc = subprocess.run([sys.executable, "-c", PROBE, str(archive)], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    assert proc.stderr == ""
    return json.loads(proc.stdout)


def cache_files(tmp_path):
    return sorted(p.name for p in (tmp_path / "state" / ".module-code").glob("*"))


def test_a_payload_compiled_once_runs_from_the_cache_with_this_runs_paths(tmp_path):
    first = payload(tmp_path, 1, "one")
    assert run_probe(tmp_path, first)["value"] == "one"
    stored = cache_files(tmp_path)
    assert len(stored) == 2 and all(name.endswith("." + sys.implementation.cache_tag) for name in stored)
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "state" / ".module-code").glob("*")}

    second = payload(tmp_path, 2, "one")  # the same source in another run's payload
    got = run_probe(tmp_path, second)
    assert got["value"] == "one"
    assert got["where"] == str(second / "pkg" / "mod.py") == got["file"]  # not the first run's path
    assert cache_files(tmp_path) == stored
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes  # read, not written again


def test_resetting_every_node_of_the_root_leaves_the_cache_alone(tmp_path):
    run_probe(tmp_path, payload(tmp_path, 1, "one"))
    node = tmp_path / "state" / "node01"
    node.mkdir()
    (node / "node.json").write_text("{}")  # what a stand-in leaves in a node's state directory
    proc = subprocess.run([sys.executable, str(REPO / "sim" / "reset"), "--root", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, "", "reset %s\n" % node)
    assert len(cache_files(tmp_path)) == 2


def test_a_changed_source_is_compiled_again_and_a_damaged_entry_is_replaced(tmp_path):
    run_probe(tmp_path, payload(tmp_path, 1, "one"))
    before = set(cache_files(tmp_path))
    assert run_probe(tmp_path, payload(tmp_path, 2, "two"))["value"] == "two"
    new = set(cache_files(tmp_path)) - before
    assert len(new) == 1  # pkg/mod.py changed, pkg/__init__.py did not

    damaged = tmp_path / "state" / ".module-code" / new.pop()
    damaged.write_bytes(b"\x00not marshal data")
    assert run_probe(tmp_path, payload(tmp_path, 3, "two"))["value"] == "two"
    assert damaged.read_bytes() != b"\x00not marshal data"


def test_other_zips_are_not_cached(tmp_path):
    assert run_probe(tmp_path, payload(tmp_path, 1, "one", name="plain.zip"))["value"] == "one"
    assert cache_files(tmp_path) == []
