"""docs/rules.md is generated from the judges' CODES and module_utils/thresholds.py (hack/gen_rules_doc.py): it must be
current, every code a judge can return must have its CODES entry, and every CODES entry must be made somewhere."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_rules_doc_is_current_and_complete():
    proc = subprocess.run([sys.executable, str(REPO / "hack" / "gen_rules_doc.py"), "--check"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_threshold_table_is_generated_from_the_role_s_argument_spec():
    """One list of gpufleet_* variables: the role's argument spec; thresholds.py's table is generated from it."""
    proc = subprocess.run([sys.executable, str(REPO / "hack" / "gen_thresholds.py"), "--check"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
