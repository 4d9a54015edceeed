"""bench/postmortem.py runs end to end on a small job and prints its machine-readable last line (no timing asserted:
figures are the benchmark's business)."""

import re
import subprocess
import sys

from helpers.module_runner import REPO


def test_bench_small_job(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "postmortem.py"), "--nodes", "4", "--log-mb", "2",
                           "--entries", "120", "--workers", "2", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: hardware rank 21 on node03 GPU 5" in proc.stdout
    assert re.match(r"^postmortem seconds=\d+\.\d\d peak_rss_mb=\d+$", proc.stdout.strip().splitlines()[-1])
