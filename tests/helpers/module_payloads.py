"""Where the test sessions' ansible-playbook runs keep the module payloads they built (tests/controller_site)."""

import hashlib


def cache_dir(plugins, root):
    """root/<digest of every file under plugins, path and bytes>: a changed module or module_util, or one added or
    removed, names another directory, so no run is ever served a payload built from other code. (ansible-core's
    version and the Python's are added below it by the runs themselves.)"""
    digest = hashlib.sha256()
    for path in sorted(p for p in plugins.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        data = path.read_bytes()
        digest.update(b"%s\0%d\0" % (str(path.relative_to(plugins)).encode(), len(data)) + data)
    return root / digest.hexdigest()[:16]
