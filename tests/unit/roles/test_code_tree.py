"""kentino.gpufleet.code_tree: the roles' node-side code in one module call, writing only what differs.

The module runs as Ansible runs it (its own process, JSON arguments); the action plugin (reading src on the controller)
through a real ansible-playbook on the local connection."""

import grp
import json
import os
import pwd
import stat
import subprocess
import sys

import pytest
from helpers.module_runner import REPO, run_module

USER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


def tree_args(dest, files):
    return {"dest": str(dest), "files": files, "owner": USER, "group": GROUP}


FILES = [
    {"dest": "bin/tool", "content": "#!/usr/bin/python3\nprint('hi')\n", "mode": "0755"},
    {"dest": "lib/pkg/__init__.py", "content": ""},
    {"dest": "lib/pkg/mod.py", "content": "X = 1\n"},
]


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_check_mode_plans_the_tree_and_writes_nothing(tmp_path):
    dest = tmp_path / "opt"
    r = run_module("code_tree", tree_args(dest, FILES), check_mode=True)
    assert r["changed"] and not r.get("failed"), r
    assert r["created_directories"] == [".", "bin", "lib", "lib/pkg"]
    assert r["changed_files"] == ["bin/tool", "lib/pkg/__init__.py", "lib/pkg/mod.py"]
    assert not dest.exists()


def test_install_then_nothing_then_only_what_differs(tmp_path):
    dest = tmp_path / "opt"
    first = run_module("code_tree", tree_args(dest, FILES))
    assert first["changed"] and len(first["changed_files"]) == 3, first
    assert (dest / "bin/tool").read_text() == FILES[0]["content"] and mode_of(dest / "bin/tool") == 0o755
    assert (dest / "lib/pkg/__init__.py").read_text() == "" and mode_of(dest / "lib/pkg/mod.py") == 0o644
    assert mode_of(dest / "lib/pkg") == 0o755
    again = run_module("code_tree", tree_args(dest, FILES))
    assert not again["changed"] and again["changed_files"] == [] and again["created_directories"] == [], again

    (dest / "lib/pkg/mod.py").write_text("X = 2\n")  # same size, other content
    os.chmod(dest / "bin/tool", 0o700)
    os.chmod(dest / "lib", 0o700)
    before = os.stat(dest / "lib/pkg/__init__.py").st_ino
    planned = run_module("code_tree", tree_args(dest, FILES), check_mode=True)
    assert planned["changed_files"] == ["bin/tool", "lib/pkg/mod.py"], planned
    assert (dest / "lib/pkg/mod.py").read_text() == "X = 2\n"  # check mode wrote nothing
    fixed = run_module("code_tree", tree_args(dest, FILES))
    assert fixed["changed_files"] == ["bin/tool", "lib/pkg/mod.py"], fixed
    assert (dest / "lib/pkg/mod.py").read_text() == "X = 1\n" and mode_of(dest / "bin/tool") == 0o755
    assert mode_of(dest / "lib") == 0o755  # the directories' mode is the tree's too
    assert os.stat(dest / "lib/pkg/__init__.py").st_ino == before  # an unchanged file is not rewritten
    assert not [p for p in (dest / "lib/pkg").iterdir() if p.name.startswith(".")]  # no temporary file left


@pytest.mark.parametrize("path", ["../escape.py", "/etc/x", "a/../../b", "", "./"])
def test_a_path_that_leaves_dest_is_refused_and_nothing_is_written(tmp_path, path):
    dest = tmp_path / "opt"
    r = run_module("code_tree", tree_args(dest, FILES[:1] + [{"dest": path, "content": "x"}]))
    assert r.get("failed") and "must" in r["msg"] and str(dest) in r["msg"], r
    assert not dest.exists() and not (tmp_path / "escape.py").exists()


def test_a_symlinked_directory_that_leads_out_is_refused(tmp_path):
    dest, outside = tmp_path / "opt", tmp_path / "outside"
    outside.mkdir()
    dest.mkdir()
    (dest / "lib").symlink_to(outside)
    r = run_module("code_tree", tree_args(dest, [{"dest": "lib/mod.py", "content": "x"}]))
    assert r.get("failed") and "symbolic link" in r["msg"], r
    assert list(outside.iterdir()) == []


def test_a_bad_mode_and_a_directory_in_the_way_are_refused(tmp_path):
    dest = tmp_path / "opt"
    r = run_module("code_tree", tree_args(dest, [{"dest": "a.py", "content": "", "mode": "rwx"}]))
    assert r.get("failed") and "octal" in r["msg"], r
    (dest / "a.py").mkdir(parents=True)
    r = run_module("code_tree", tree_args(dest, [{"dest": "a.py", "content": ""}]))
    assert r.get("failed") and "is a directory" in r["msg"], r


def run_playbook(tmp_path, task, check=False):
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [dict(task, register="out"),
                                                                    {"ansible.builtin.debug": {"var": "out"}}]}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    (tmp_path / "files").mkdir(exist_ok=True)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"))
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=%s" % sys.executable, str(tmp_path / "play.yml"), "--diff"]
    proc = subprocess.run(cmd + (["--check"] if check else []), capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert "{" in proc.stdout, proc.stderr[-3000:]
    data = json.loads(proc.stdout[proc.stdout.index("{"):])
    return data["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_the_action_reads_src_on_the_controller_and_refuses_what_it_cannot_send(tmp_path):
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "entry").write_text("#!/bin/sh\necho entry\n")  # found like copy's src: files/ beside the play
    (tmp_path / "mod.py").write_text("Y = 1\n")
    dest = tmp_path / "opt"
    task = {"kentino.gpufleet.code_tree": tree_args(dest, [
        {"src": "entry", "dest": "bin/entry", "mode": "0755"},
        {"src": str(tmp_path / "mod.py"), "dest": "lib/mod.py"},
        {"content": "", "dest": "lib/__init__.py"}])}
    planned = run_playbook(tmp_path, task, check=True)
    assert planned["changed"] and not dest.exists(), planned
    assert "bin/entry" in planned["diff"]["after"], planned["diff"]
    done = run_playbook(tmp_path, task)
    assert done["changed"] and (dest / "bin/entry").read_text() == "#!/bin/sh\necho entry\n", done
    assert (dest / "lib/mod.py").read_text() == "Y = 1\n" and mode_of(dest / "bin/entry") == 0o755
    # -v shows each file's path and size, not the tree's source
    shown = json.dumps(done.get("invocation", {}))
    assert "echo entry" not in shown
    assert not run_playbook(tmp_path, task)["changed"]

    (tmp_path / "files" / "blob").write_bytes(b"\xff\xfe\x00binary")
    bad = run_playbook(tmp_path, {"kentino.gpufleet.code_tree": tree_args(dest, [{"src": "blob", "dest": "b"}])})
    assert bad["failed"] and "not UTF-8 text" in bad["msg"] and "blob" in bad["msg"], bad
    both = run_playbook(tmp_path, {"kentino.gpufleet.code_tree": tree_args(
        dest, [{"src": "entry", "content": "x", "dest": "b"}])})
    assert both["failed"] and "exactly one of src and content" in both["msg"], both
    missing = run_playbook(tmp_path, {"kentino.gpufleet.code_tree": tree_args(dest, [{"src": "nope", "dest": "b"}])})
    assert missing["failed"] and "nope" in missing["msg"], missing
    assert not (dest / "b").exists()
