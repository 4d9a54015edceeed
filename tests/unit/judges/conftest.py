"""The judge tests share judgelib.py (importable by name from the tests, as the sim tests do with simlib.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
