"""Compiled code of what a simulated node's module runs import from their Ansible payload zips, kept on disk.

Python compiles a module imported from a zip at every import (zipimport writes no bytecode), so each module run
compiles ansible.module_utils.basic and the rest of its payload again: about 0.1 CPU-s of the 0.15-0.3 a module run
costs. A real node pays that on its own CPU. Simulated nodes pay it on the controller's, where a 32-node burn-in then
measures the simulation instead of the orchestration. sitecustomize.py installs this cache in every Python process of
a simulated node (the test fleet's harness in its nspawn nodes, through a .pth file); only sources from an AnsiballZ
payload (`*_payload.zip`) are cached, under the hash of the source and its path in the zip, so a changed module never
runs stale code. Anything unusual (another Python's zipimport, an unreadable cache) falls back to compiling as usual.
"""
import _imp
import marshal
import os
import sys
import zipimport

_PAYLOAD = "_payload.zip" + os.sep


def install(cache_dir):
    """Route zipimport's compilation of payload sources through the cache in cache_dir. False: not possible here."""
    compile_source = getattr(zipimport, "_compile_source", None)
    fix_filename = getattr(_imp, "_fix_co_filename", None)
    if compile_source is None or fix_filename is None or getattr(compile_source, "gpufleet_sim_cache", False):
        return False

    def cached(pathname, source):
        if _PAYLOAD not in pathname:
            return compile_source(pathname, source)
        import hashlib  # here, not at start: most processes of a node (the stand-ins) never import from a payload

        inner = pathname.split(_PAYLOAD, 1)[1]
        key = hashlib.sha256(inner.encode("utf-8", "surrogateescape") + b"\0" + source).hexdigest()
        path = os.path.join(cache_dir, "%s.%s" % (key, sys.implementation.cache_tag))
        try:
            with open(path, "rb") as fh:
                code = marshal.loads(fh.read())
        except (OSError, EOFError, ValueError, TypeError):
            code = compile_source(pathname, source)
            _store(path, code)
            return code
        fix_filename(code, pathname)  # this run's payload path, as tracebacks and __file__ expect
        return code

    cached.gpufleet_sim_cache = True
    zipimport._compile_source = cached
    return True


def _store(path, code):
    # Whole files only: the nodes' modules run at once, and test-fleet containers share the directory with PIDs of
    # their own (a PID alone is no unique name there).
    tmp = "%s.%d.%s.tmp" % (path, os.getpid(), os.urandom(6).hex())
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(marshal.dumps(code))
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
