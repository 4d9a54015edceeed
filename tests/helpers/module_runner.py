"""Run a collection module the way Ansible does on a node: a separate Python process, args from a JSON file.

Running it for real (rather than calling main() in-process) exercises argument parsing, check mode, the process-group
handling of tool_runner and the exact JSON a controller receives.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_module(name, args=None, env=None, check_mode=False, timeout=300, path_prepend=None):
    """Return the module's JSON result (dict). `failed` modules return their dict too; crashes raise AssertionError."""
    module_args = dict(args or {})
    module_args["_ansible_check_mode"] = check_mode
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO / "collections")
    if path_prepend:
        full_env["PATH"] = os.pathsep.join([str(p) for p in path_prepend] + [full_env.get("PATH", "")])
    if env:
        full_env.update({k: str(v) for k, v in env.items()})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"ANSIBLE_MODULE_ARGS": module_args}, fh)
        args_path = fh.name
    try:
        proc = subprocess.run([sys.executable, str(REPO / "plugins" / "modules" / (name + ".py")), args_path],
                              capture_output=True, text=True, env=full_env, timeout=timeout)
    finally:
        os.unlink(args_path)
    out = proc.stdout.strip()
    try:
        # Modules print exactly one JSON document; warnings from Python would precede it.
        result = json.loads(out[out.index("{"):])
    except ValueError as exc:
        raise AssertionError("module %s printed no JSON (rc=%s)\nstdout: %s\nstderr: %s"
                             % (name, proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])) from exc
    return result
