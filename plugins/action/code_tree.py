# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Action kentino.gpufleet.code_tree: read the tree's files on the controller and install them on the node in one
module call (documentation and argument_spec in plugins/modules/code_tree.py)."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase
from ansible_collections.kentino.gpufleet.plugins.modules.code_tree import ARGUMENT_SPEC

# The whole tree travels in the module's arguments: the node-side code is a few hundred KB; far more is a mistake.
MAX_TREE_BYTES = 16 * 1024 * 1024


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def _content(self, src):
        try:
            path = self._find_needle("files", src)
        except AnsibleError as exc:
            raise AnsibleActionFail("code_tree: %s" % exc) from None
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise AnsibleActionFail("code_tree: cannot read %s on the controller: %s" % (path, exc)) from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise AnsibleActionFail("code_tree: %s is not UTF-8 text (the module installs code, not binaries)"
                                    % path) from None

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        files, total = [], 0
        for item in args["files"]:
            if (item["src"] is None) == (item["content"] is None):
                raise AnsibleActionFail("code_tree: file %r needs exactly one of src and content" % item["dest"])
            content = item["content"] if item["src"] is None else self._content(item["src"])
            total += len(content)
            if total > MAX_TREE_BYTES:
                raise AnsibleActionFail("code_tree: the tree is over %d MB; install large files with "
                                        "ansible.builtin.copy" % (MAX_TREE_BYTES // (1024 * 1024)))
            files.append({"dest": item["dest"], "content": content, "mode": item["mode"]})
        module_args = dict(args, files=files)
        result.update(self._execute_module(module_name="kentino.gpufleet.code_tree", module_args=module_args,
                                           task_vars=task_vars))
        invocation = (result.get("invocation") or {}).get("module_args")
        if isinstance(invocation, dict) and isinstance(invocation.get("files"), list):
            # -v shows the arguments: the files by path and size, not the whole tree's source.
            invocation["files"] = [dict(f, content="<%d characters>" % len(f.get("content") or "")) for f in
                                   invocation["files"] if isinstance(f, dict)]
        return result
