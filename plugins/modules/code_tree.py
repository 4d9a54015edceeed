#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: code_tree
short_description: Install a tree of files (the collection's node-side code) in one round trip
description:
  - Installs files from the controller under one directory on the node, in one module call however many files there
    are, and writes only the files whose content, mode or owner differ (atomically, each through a temporary file in
    its own directory).
  - Made for the code the roles install on nodes (the XID watcher's and the elastic launcher's copies of the
    collection's module_utils, and their entry scripts). M(ansible.builtin.copy) in a loop costs one module call per
    file, and most of a converge that changes nothing.
  - The action plugin of the same name reads each O(files[].src) on the controller (a relative path is looked up in
    the role's C(files/) as M(ansible.builtin.copy) does) and sends the contents with the module's arguments.
  - Directories between O(dest) and each file are created with O(directory_mode), O(owner) and O(group); existing
    ones get that mode and ownership too.
  - Supports check mode (says what would change, writes nothing) and diff mode (the files that would change).
version_added: "0.3.0"
author: kentino.gpufleet contributors
attributes:
  action:
    description: Has an action plugin that runs on the controller before the module.
    support: full
    details: The action plugin reads O(files[].src) on the controller; the module writes on the node.
  check_mode:
    description: Can run in check mode and say what it would do.
    support: full
  diff_mode:
    description: Shows what would change in diff mode.
    support: full
    details: The directories and files that change, by path (not their contents).
  platform:
    description: The target operating systems.
    support: full
    platforms: posix
options:
  dest:
    description: The directory the tree goes under (an absolute path). Created when missing.
    type: path
    required: true
  files:
    description:
      - The files. Each has O(files[].dest) and either O(files[].src) or O(files[].content).
    type: list
    elements: dict
    required: true
    suboptions:
      dest:
        description:
          - The file's path under O(dest), relative (no C(..), not absolute).
        type: str
        required: true
      src:
        description:
          - The file on the controller (read by the action plugin). Relative paths are looked up like
            M(ansible.builtin.copy)'s.
        type: path
      content:
        description:
          - The file's content as text, instead of O(files[].src) (an empty package marker C(__init__.py)). The action
            plugin passes each O(files[].src)'s content here (UTF-8 text only).
        type: str
      mode:
        description: The file's mode, as an octal string.
        type: str
        default: "0644"
  owner:
    description: Owner of every file and directory of the tree.
    type: str
    default: root
  group:
    description: Group of every file and directory of the tree.
    type: str
    default: root
  directory_mode:
    description: Mode of the directories, as an octal string.
    type: str
    default: "0755"
notes:
  - Files under O(dest) that are not in O(files) are left alone.
  - A file's path is refused when it leaves O(dest), also through a symbolic link on the node.
"""

EXAMPLES = r"""
- name: Install the watcher's code
  kentino.gpufleet.code_tree:
    dest: /opt/gpufleet-monitoring
    files:
      - {src: gpufleet-xid-watcher, dest: bin/gpufleet-xid-watcher, mode: "0755"}
      - {content: "", dest: lib/ansible_collections/__init__.py}
      - {src: "{{ role_path }}/../../plugins/module_utils/pci.py", dest: lib/ansible_collections/kentino/pci.py}
"""

RETURN = r"""
changed_files:
  description: The files (paths under O(dest)) that were written or had their mode or owner set (would be, in check
    mode).
  returned: always
  type: list
  elements: str
created_directories:
  description: The directories (paths under O(dest), C(.) for O(dest) itself) that were created (would be).
  returned: always
  type: list
  elements: str
"""

import hashlib
import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils.rma_evidence import sha256_of

ARGUMENT_SPEC = dict(
    dest=dict(type="path", required=True),
    files=dict(type="list", elements="dict", required=True, options=dict(
        dest=dict(type="str", required=True),
        src=dict(type="path"),
        content=dict(type="str"),
        mode=dict(type="str", default="0644"),
    )),
    owner=dict(type="str", default="root"),
    group=dict(type="str", default="root"),
    directory_mode=dict(type="str", default="0755"),
)


def parse_mode(text, what):
    """An octal mode string ('0644') as an int; ValueError names what it is for."""
    try:
        mode = int(str(text), 8)
    except ValueError:
        raise ValueError("%s: mode %r is not an octal number such as 0644" % (what, text)) from None
    if not 0 <= mode <= 0o7777:
        raise ValueError("%s: mode %r is out of range (0000-7777)" % (what, text))
    return mode


def relative_parts(path):
    """The components of a path under dest; ValueError when it is empty, absolute or climbs out with '..'."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\0" in path:
        raise ValueError("file path %r must be relative to dest, not empty or absolute" % (path,))
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError("file path %r must stay under dest (no '..')" % (path,))
    return parts


def _inside(root_real, path):
    real = os.path.realpath(path)
    return real == root_real or real.startswith(root_real + os.sep)


def plan(dest, files):
    """What differs: ([(rel, parts, data, mode, need_write)], [rel dirs to create]) for files as [{dest, content, mode}]
    (the action plugin has replaced each src by its content); ValueError for a bad entry (nothing written)."""
    entries, seen = [], set()
    for item in files:
        parts = relative_parts(item["dest"])
        rel = "/".join(parts)
        if rel in seen:
            raise ValueError("file path %r is given twice" % rel)
        seen.add(rel)
        if item.get("content") is None:
            raise ValueError("%s: no content (src is read by the action plugin on the controller: run the module as "
                             "kentino.gpufleet.code_tree, not through another action)" % rel)
        data = item["content"].encode("utf-8")
        mode = parse_mode(item.get("mode", "0644"), rel)
        target = os.path.join(dest, *parts)
        need_write = True
        if os.path.lexists(target):
            st = os.lstat(target)
            if stat.S_ISDIR(st.st_mode):
                raise ValueError("%s is a directory on the node, not a file" % target)
            if stat.S_ISREG(st.st_mode) and st.st_size == len(data):
                need_write = sha256_of(target) != hashlib.sha256(data).hexdigest()
        entries.append((rel, parts, data, mode, need_write))
    dirs = set()
    for _rel, parts, _data, _mode, _write in entries:
        for i in range(len(parts)):
            dirs.add("/".join(parts[:i]) or ".")
    return entries, sorted(dirs, key=lambda d: (d.count("/") if d != "." else -1, d))


def run(module):
    p = module.params
    dest = p["dest"]
    if not os.path.isabs(dest):
        module.fail_json(msg="dest %r must be an absolute path" % dest)
    try:
        dir_mode = parse_mode(p["directory_mode"], "directory_mode")
        entries, dirs = plan(dest, p["files"])
    except (ValueError, OSError) as exc:
        module.fail_json(msg="code_tree under %s: %s" % (dest, exc))
    changed_files, created = [], []
    for rel in dirs:
        path = dest if rel == "." else os.path.join(dest, *rel.split("/"))
        if os.path.islink(path):
            module.fail_json(msg="code_tree: %s is a symbolic link; the tree's directories must be real ones" % path)
        if not os.path.isdir(path):
            if os.path.lexists(path):
                module.fail_json(msg="code_tree: %s exists and is not a directory" % path)
            created.append(rel)
            if module.check_mode:
                continue
            os.mkdir(path, dir_mode)
        # Every directory gets the mode and ownership the tree asks for, as ansible.builtin.file state=directory would.
        module.set_mode_if_different(path, dir_mode, False)
        module.set_owner_if_different(path, p["owner"], False)
        module.set_group_if_different(path, p["group"], False)
    root_real = os.path.realpath(dest) if not module.check_mode or os.path.isdir(dest) else None
    for rel, parts, data, mode, need_write in entries:
        target = os.path.join(dest, *parts)
        parent = os.path.dirname(target)
        if root_real is not None and os.path.isdir(parent) and not _inside(root_real, parent):
            module.fail_json(msg="code_tree: %s leaves %s through a symbolic link" % (target, dest))
        touched = need_write
        if need_write and not module.check_mode:
            fd, tmp = tempfile.mkstemp(prefix=".%s." % parts[-1], dir=parent)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.chmod(tmp, mode)
                module.atomic_move(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        if not need_write or not module.check_mode:
            # Mode and owner of a file that exists (or was just written); in check mode these report, not change.
            touched = module.set_mode_if_different(target, mode, touched)
            touched = module.set_owner_if_different(target, p["owner"], touched)
            touched = module.set_group_if_different(target, p["group"], touched)
        if touched:
            changed_files.append(rel)
    result = dict(changed=bool(changed_files or created), changed_files=changed_files, created_directories=created)
    if module._diff and result["changed"]:
        result["diff"] = dict(before_header=dest, after_header=dest, before="",
                              after="".join("%s/\n" % d for d in created) + "".join("%s\n" % f for f in changed_files))
    module.exit_json(**result)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run(module)


if __name__ == "__main__":
    main()
