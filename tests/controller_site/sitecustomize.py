"""Started with every Python process the test suites start (tests/conftest.py puts this directory on PYTHONPATH;
nothing a user runs has it): ansible-playbook keeps the module payloads it builds (AnsiballZ) for the next run.

ansible-core builds each module's payload once per run (it walks and compiles every module_util the module imports:
about 0.3 CPU-s a module) into a cache inside the run's own local temporary directory, which it deletes at exit. A
suite starts a few hundred short runs of the same modules, so that build was a fifth of its CPU. With
GPUFLEET_TEST_ANSIBALLZ_CACHE set, the run's cache directory is a link to that directory instead: ansible-core's
own cache (its lock, its atomic writes), shared by the runs of the test sessions. Everything that goes into a
payload names its directory: the collection's plugins (tests/conftest.py hashes them into the variable's value), then
here the running ansible-core's version and the Python's, so a changed module is never served from it. Anything
unexpected leaves ansible as it is.

With GPUFLEET_TEST_MODULE_CODE_CACHE set, the modules those runs start here keep their compiled code too (below).
"""
import os
import sys

_MODULE = "ansible.executor.module_common"


class _LinkCacheAfterImport:
    """A finder that only notices the import of _MODULE, then links the run's payload cache once it has run."""

    def __init__(self, shared):
        self.shared = shared

    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module
        shared = self.shared

        def exec_module(module):
            run_module(module)
            _link(module, shared)

        spec.loader.exec_module = exec_module
        return spec


def _link(module_common, shared):
    try:
        from ansible.release import __version__

        shared = os.path.join(shared, "ansible-%s-py%d.%d" % ((__version__,) + tuple(sys.version_info[:2])))
        link = os.path.join(module_common.C.DEFAULT_LOCAL_TMP, "ansiballz_cache")
        if not os.path.lexists(link):
            os.makedirs(shared, exist_ok=True)
            os.symlink(shared, link)  # ansible removes its local temporary directory at exit: the link, not the cache
    except Exception:  # noqa: BLE001 - the run builds its payloads itself, as without this
        pass


if os.environ.get("GPUFLEET_TEST_ANSIBALLZ_CACHE"):
    sys.meta_path.insert(0, _LinkCacheAfterImport(os.environ["GPUFLEET_TEST_ANSIBALLZ_CACHE"]))


def _module_code_cache(cache_dir):
    """The modules these runs start on the local connection reuse what they compiled before: the simulated fleet's
    module code cache (sim/gpufleet_sim/module_code_cache.py, only sources from an AnsiballZ payload, keyed by their
    hash), which a simulated node installs through its own sitecustomize. Loaded by path: nothing else of the
    simulator becomes importable."""
    try:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "sim",
                            "gpufleet_sim", "module_code_cache.py")
        spec = importlib.util.spec_from_file_location("_gpufleet_test_module_code_cache", path)
        cache = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cache)
        cache.install(cache_dir)
    except Exception:  # noqa: BLE001 - the module compiles its code itself, as without this
        pass


if os.environ.get("GPUFLEET_TEST_MODULE_CODE_CACHE"):
    _module_code_cache(os.environ["GPUFLEET_TEST_MODULE_CODE_CACHE"])
