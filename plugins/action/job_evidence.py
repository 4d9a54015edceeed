# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Action kentino.gpufleet.job_evidence: run the module on the node, then keep the dumps' bytes out of the result.

A flight-recorder dump is binary (tens of MiB as base64): in a task's result it would be printed by -v and copied
into every worker's hostvars. Each dump's bytes are written to a private file on the controller instead (a fresh
mkdtemp directory, mode 0700, files 0600) and the result names it (data_file). kentino.gpufleet.job_postmortem reads
and deletes these files. Documentation: plugins/modules/job_evidence.py.
"""

from __future__ import annotations

import base64
import binascii
import os
import tempfile

from ansible.plugins.action import ActionBase
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem.analysis import STORE_PREFIX


def store_dumps(result):
    """Move every dump's data_b64 into a file of a new private directory (data_file); returns the directory or None.
    A data_file the node sent is dropped: only this function names controller files."""
    dumps = [d for d in result.get("dumps") or [] if isinstance(d, dict)]
    for dump in dumps:
        dump["data_file"] = None
    carrying = [d for d in dumps if isinstance(d.get("data_b64"), str) and d["data_b64"]]
    if not carrying:
        return None
    store = tempfile.mkdtemp(prefix=STORE_PREFIX)
    for number, dump in enumerate(carrying):
        try:
            data = base64.b64decode(dump["data_b64"], validate=True)
        except (binascii.Error, ValueError) as exc:
            dump["error"] = "%s: the node sent bytes that are not base64 (%s): not used" % (dump.get("path"), exc)
            dump["data_b64"] = None
            continue
        path = os.path.join(store, "dump-%d" % number)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        dump["data_file"], dump["data_b64"] = path, None
    return store


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars or {})
        result.update(self._execute_module(module_name="kentino.gpufleet.job_evidence", module_args=self._task.args,
                                           task_vars=task_vars or {}))
        if not result.get("failed"):
            store_dumps(result)
        return result
