"""Shared test setup: make the collection importable as ansible_collections.kentino.gpufleet."""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLLECTIONS = REPO / "collections"
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
os.environ.setdefault("ANSIBLE_CONFIG", str(REPO / "ansible.cfg"))
