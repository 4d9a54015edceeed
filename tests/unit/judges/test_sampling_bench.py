"""bench/sampling_result.py runs end to end on a small run: the compact result judges as the whole did, is smaller,
and the last line is machine-readable."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_bench_small():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "sampling_result.py"), "--hours", "2", "--gpus", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "same findings           yes (" in proc.stdout
    match = re.fullmatch(r"sampling_result whole_mb=(\d+\.\d+) compact_mb=(\d+\.\d+) ratio=(\d+)",
                         proc.stdout.strip().splitlines()[-1])
    assert match and float(match.group(2)) < float(match.group(1)) and int(match.group(3)) >= 2, proc.stdout
