"""Shared test setup: make the collection importable as ansible_collections.kentino.gpufleet, and tests/helpers too."""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for p in (REPO / "collections", REPO / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
os.environ.setdefault("ANSIBLE_CONFIG", str(REPO / "ansible.cfg"))


def _stand_in_python3():
    """The simulator's stand-in tools (sim/bin) are `#!/usr/bin/env python3` scripts, started thousands of times a
    suite. Found through PATH, `python3` is the virtualenv's (make puts it first) or a pyenv shim (a bash script that
    starts pyenv, then an unoptimised build): a stand-in call costs 81 or ~130 ms of CPU there, 36 ms on the system's
    python3. Tests therefore find that one first, as a simulated node does (inventories/sim), through a directory
    that holds nothing else."""
    system = Path("/usr/bin/python3")
    if not system.exists():
        return
    bindir = REPO / "tests" / "output" / "python3-bin"
    link = bindir / "python3"
    if os.path.realpath(link) != os.path.realpath(system):
        bindir.mkdir(parents=True, exist_ok=True)
        tmp = bindir / (".python3.%d" % os.getpid())  # xdist workers may do this at once: replace atomically
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(system)
        tmp.replace(link)
    path = os.environ.get("PATH", "")
    if not path.startswith(str(bindir) + os.pathsep):
        os.environ["PATH"] = str(bindir) + os.pathsep + path


_stand_in_python3()


def _shared_module_payloads():
    """ansible-playbook runs started by the tests reuse the module payloads earlier runs built (tests/controller_site,
    tests/helpers/module_payloads.py): a fifth of the suites' CPU was ansible building the same payloads again.
    GPUFLEET_TEST_ANSIBALLZ_CACHE=off: every run builds its own, and every module compiles its code, as a user's do."""
    from helpers.module_payloads import cache_dir

    if os.environ.get("GPUFLEET_TEST_ANSIBALLZ_CACHE") == "off":
        del os.environ["GPUFLEET_TEST_ANSIBALLZ_CACHE"]
        return
    os.environ["GPUFLEET_TEST_ANSIBALLZ_CACHE"] = str(cache_dir(REPO / "plugins", REPO / "tests" / "output" / "ansiballz"))
    # ... and the modules those runs start on this machine reuse their compiled code (controller_site/sitecustomize.py).
    os.environ["GPUFLEET_TEST_MODULE_CODE_CACHE"] = str(REPO / "tests" / "output" / "module-code")
    site = str(REPO / "tests" / "controller_site")
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if site not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([site] + parts)


_shared_module_payloads()
