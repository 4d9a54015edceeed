"""Shared test setup: make the collection importable as ansible_collections.kentino.gpufleet, and tests/helpers too."""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for p in (REPO / "collections", REPO / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
os.environ.setdefault("ANSIBLE_CONFIG", str(REPO / "ansible.cfg"))
