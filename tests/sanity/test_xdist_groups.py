"""The suites run with pytest-xdist's --dist loadgroup (Makefile): tests of one group must share one worker, or the
fleet files' module fleets (one prefix, one subnet) are brought up twice at once and the demo run is made per worker.
A pytest or xdist upgrade that drops the grouping fails here, not as collisions in the fleet suite."""

import subprocess
import sys
import textwrap


def test_a_group_runs_on_one_worker(tmp_path):
    body = textwrap.dedent("""
        import os
        import pytest

        @pytest.mark.xdist_group("one")
        @pytest.mark.parametrize("i", range(8))
        def test_member(i):
            with open(os.path.join(%r, "%%d" %% i), "w") as fh:
                fh.write(os.environ["PYTEST_XDIST_WORKER"])
    """ % str(tmp_path))
    (tmp_path / "test_probe.py").write_text(body)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                          "loadgroup", str(tmp_path / "test_probe.py")], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:]
    workers = {(tmp_path / str(i)).read_text() for i in range(8)}
    assert len(workers) == 1, "one group ran on %s" % sorted(workers)
