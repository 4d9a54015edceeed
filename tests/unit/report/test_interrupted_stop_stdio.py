"""The run_record callback's stop (abort.yml after Ctrl-C) starts with a valid stdin, whatever the interrupted run did
to its own: ansible-core makes the controller's stdio non-inheritable, and an ansible-playbook started without an
fd 0 lost its workers ("Could not detach from stdio: Bad file descriptor"), so the stop failed now and then and the
node's work ran on until its lease lapsed."""

import os
import sys

import pytest
from ansible import context
from ansible.module_utils.common.collections import ImmutableDict
from ansible_collections.kentino.gpufleet.plugins.callback import run_record

# Stands in for ansible-playbook abort.yml: answers for node n1 only when it has a usable fd 0.
FAKE_ABORT = r"""
import json, os, sys
extra = json.loads(sys.argv[sys.argv.index("-e", sys.argv.index("-l")) + 1])
os.fstat(0)  # raises (exit 1, no record) when started without a stdin
with open(extra["gpufleet_abort_record"], "w") as fh:
    json.dump({"n1": {"stopped": [], "msg": "nothing was running"}}, fh)
"""


@pytest.fixture
def stdin_not_inheritable():
    """The controller's fd 0 as ansible-core's TaskQueueManager leaves it."""
    before = os.get_inheritable(0)
    os.set_inheritable(0, False)
    yield
    os.set_inheritable(0, before)


def test_the_stop_runs_with_a_stdin_when_the_controllers_is_not_inheritable(tmp_path, monkeypatch,
                                                                           stdin_not_inheritable):
    script = tmp_path / "fake_abort.py"
    script.write_text(FAKE_ABORT)
    monkeypatch.setattr(run_record, "_ansible_playbook", lambda: [sys.executable, str(script)])
    monkeypatch.setattr(context, "CLIARGS", ImmutableDict(inventory=("inv",), extra_vars=(), check=False))
    callback = run_record.CallbackModule()
    callback.run = {"run_id": "20261202T000000Z-abcdef"}
    callback.finished = True  # nothing for its atexit hook to do
    assert callback._stop_node_work(["n1"]) == {"n1": {"stopped": [], "msg": "nothing was running"}}
    assert callback._stop_node_work([]) == {}  # no node, no abort run
