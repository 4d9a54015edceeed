"""Monitoring tests: the watcher and health collector helpers (watchlib) importable by name."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
