"""`gpufleet history NODE` shows the node's lifecycle from the history store, also for a node that has a lifecycle
but no run yet (quarantined by the watcher before any audit), and fails while the node is out of service."""

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.lifecycle import transition
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import FILE_NAME, History

from gpufleet_cli.main import main

T0 = 1.8e9


def test_history_node_shows_the_lifecycle_and_exits_2_while_the_node_is_out(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    with History(tmp_path / FILE_NAME) as h:
        transition(h, "n1", "quarantined", "XID 79 on GPU 3", "watcher", code="XID_CRITICAL", gpu="3",
                   evidence=["NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."], now=T0)
    assert main(["history", "n1", "--history-dir", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "n1 lifecycle: QUARANTINED" in out and "XID 79 on GPU 3" in out and "watcher" in out
    assert "fallen off the bus" in out
    with History(tmp_path / FILE_NAME) as h:
        for state, actor in (("repairing", "repair"), ("validating", "repair"), ("healthy", "preflight")):
            transition(h, "n1", state, "rung 1", actor, now=T0 + 60)
    assert main(["history", "n1", "--history-dir", str(tmp_path)]) == 0
    assert "n1 lifecycle: HEALTHY" in capsys.readouterr().out
