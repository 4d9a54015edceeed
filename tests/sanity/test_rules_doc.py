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
