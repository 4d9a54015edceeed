"""The generated XID catalog: in step with data/xid_catalog.csv, complete, and the default severity policy."""

import csv
import hashlib
import importlib.util
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import xid_catalog

REPO = Path(__file__).resolve().parents[3]
CSV_PATH = REPO / "data" / "xid_catalog.csv"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_xid_catalog", REPO / "hack" / "gen_xid_catalog.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_file_is_up_to_date_with_the_csv():
    gen = _generator()
    expected = gen.render(CSV_PATH.read_bytes())
    actual = (REPO / "plugins" / "module_utils" / "xid_catalog.py").read_text()
    assert actual == expected, "plugins/module_utils/xid_catalog.py is out of date: run hack/gen_xid_catalog.py"


def test_generator_notices_a_changed_csv():
    gen = _generator()
    changed = CSV_PATH.read_bytes().replace(b"GPU has fallen off the bus", b"GPU left the bus")
    assert gen.render(changed) != (REPO / "plugins" / "module_utils" / "xid_catalog.py").read_text()


def test_snapshot_and_checksum():
    assert xid_catalog.SNAPSHOT == "2025-10"
    assert xid_catalog.SOURCE_SHA256 == hashlib.sha256(CSV_PATH.read_bytes()).hexdigest()


def test_every_csv_code_is_in_the_catalog_with_a_valid_severity():
    with open(CSV_PATH, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 172
    assert set(xid_catalog.CATALOG) == {int(r["xid"]) for r in rows}
    for code, entry in xid_catalog.CATALOG.items():
        assert entry[5] in ("critical", "warning", "info"), code
        assert entry[6], code


@pytest.mark.parametrize("code,severity", [
    (48, "critical"), (63, "critical"), (64, "critical"), (79, "critical"),  # docs/failure-modes.md: page
    (74, "critical"), (95, "critical"), (119, "critical"), (120, "critical"), (140, "critical"),  # DCGM FAIL
    (94, "warning"), (92, "warning"), (13, "warning"), (31, "warning"), (43, "warning"),  # DCGM WARN / application class
    (45, "info"), (68, "info"),  # device plugin: application errors
    (62, "critical"),  # RESET_GPU bucket
    (54, "critical"),  # CHECK_MECHANICALS: the power cable
    (106, "info"),  # IGNORE bucket: kept, as info
    (25, "info"),  # RESTART_APP without hardware causes
    (8, "warning"),  # RESTART_APP with bus/thermal causes
])
def test_default_severity_policy(code, severity):
    assert xid_catalog.lookup(code)["severity"] == severity


def test_unknown_code_is_unknown_never_ignored():
    entry = xid_catalog.lookup(4242)
    assert entry["severity"] == "unknown" and entry["mnemonic"] is None
    assert "2025-10" in entry["description"]


def test_lookup_shape():
    entry = xid_catalog.lookup(79)
    assert entry["mnemonic"] == "GPU_HAS_FALLEN_OFF_THE_BUS"
    assert entry["action"] == {"immediate": "RESTART_BM", "investigatory": "CONTACT_SUPPORT"}
    assert "BUS" in entry["categories"]
