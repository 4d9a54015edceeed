"""The gpu_monitoring role copies only the module_utils files it lists (vars/main.yml) to the node: every module the
watcher and the health collector import must be among them. Imported by the system Python from that tree alone, as
on a node (a missing ib_sysfs.py once stopped the health timer on every node while the unit tests passed)."""

import subprocess

from watchlib import install_tree

ENTRY_POINTS = ("xid_watcher", "node_health")


def test_the_entry_points_import_from_the_installed_tree_alone(tmp_path):
    tree = install_tree(tmp_path / "lib")
    code = ("import sys; sys.path[:0] = [%r]\n"
            "import importlib\n"
            "for name in %r:\n"
            "    m = importlib.import_module('ansible_collections.kentino.gpufleet.plugins.module_utils.' + name)\n"
            "    assert m.__file__.startswith(%r), m.__file__\n" % (str(tree), ENTRY_POINTS, str(tree)))
    out = subprocess.run(["/usr/bin/python3", "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
