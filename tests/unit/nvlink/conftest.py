import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
if str(REPO / "collections") not in sys.path:
    sys.path.insert(0, str(REPO / "collections"))
