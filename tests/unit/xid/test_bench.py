"""bench/xid_scan.py runs end to end on a tiny file: the parser agrees with grep and the last line is machine-readable.

The ratio itself is only meaningful on the 256 MB default (`make bench`); a 2 MB file is dominated by process start.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(not (shutil.which("grep") and shutil.which("zcat")), reason="needs grep and zcat")
def test_bench_small(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "xid_scan.py"), "--size-mb", "2", "--small-mb", "1",
                           "--repeat", "1", "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "MISMATCH" not in proc.stdout
    match = re.fullmatch(r"xid_scan ratio=(\d+\.\d+) peak_rss_mb=(\d+\.\d+)", lines[-1])
    assert match, lines[-1]
    assert float(match.group(2)) < 200  # streaming: far below the file sizes a real run uses
    xid_counts = [int(m) for m in re.findall(r"xid_lines\s+(\d+)", proc.stdout)]
    assert len(xid_counts) == 4 and all(n > 0 for n in xid_counts)
