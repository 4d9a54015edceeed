"""CPU seconds per test (the worker's own plus its reaped children's: playbooks, stand-ins, nodes' commands run
over local processes), for finding what to cut when the suite's time budget is tight. Wall times hide CPU on a
loaded 2-core machine; CPU is what the suites compete for.

    PYTHONPATH=tests PYTEST_ADDOPTS="-p helpers.cpu_profile" make integration
    sort -t$'\\t' -k2 -rn tests/output/cpu-profile.tsv | head

Each line: nodeid, CPU seconds (setup, call and teardown: a module or session fixture counts on the test that made
or ended it), wall seconds. Lines are appended (one write each), so parallel workers share the file.
"""

import os
import resource
import time
from pathlib import Path

import pytest

OUT = Path(__file__).resolve().parents[1] / "output" / "cpu-profile.tsv"


def _cpu():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = _cpu(), time.monotonic()
    yield
    line = "%s\t%.2f\t%.1f\n" % (item.nodeid, _cpu() - cpu, time.monotonic() - wall)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(OUT, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
