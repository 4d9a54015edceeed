"""A node's lifecycle in the history store, on real SQLite files: transitions written with their reason, finding,
evidence and actor, refused when the table does not allow them, one quarantine for two triggers (also from two
processes at once), the lemon rule, and an older history migrated forward with its runs kept."""

import sqlite3
import threading

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle, store
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.lifecycle import LifecycleError, transition
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History

DAY = 86400.0
T0 = 1.8e9
XID = {"code": "XID_CRITICAL", "gpu": "0000:3b:00", "evidence": ["NVRM: Xid (PCI:0000:3b:00): 79, pid=123, name=python, "
                                                                  "GPU has fallen off the bus."]}


def test_a_transition_is_recorded_with_its_reason_finding_evidence_and_actor(tmp_path):
    with History(tmp_path / store.FILE_NAME) as h:
        done = transition(h, "n1", "quarantined", "XID 79 on GPU 3", "watcher", now=T0, **XID)
        assert (done["previous"], done["state"]) == ("healthy", "quarantined")
        [row] = h.lifecycle_of("n1")
        assert row == {"ts": T0, "from_state": "healthy", "to_state": "quarantined", "reason": "XID 79 on GPU 3",
                       "code": "XID_CRITICAL", "gpu": "0000:3b:00", "evidence": XID["evidence"], "actor": "watcher"}
        transition(h, "n1", "repairing", "GPU reset", "repair", now=T0 + 60)
        transition(h, "n1", "validating", "preflight", "repair", now=T0 + 120)
        transition(h, "n1", "healthy", "preflight passed", "preflight", now=T0 + 900)
        assert [r["to_state"] for r in h.lifecycle_of("n1")] == ["quarantined", "repairing", "validating", "healthy"]
        assert h.lifecycle_of("n2") == []


@pytest.mark.parametrize("start, to, actor, says", [
    ([], "healthy", "operator:ana", None),  # already healthy: nothing added
    ([("quarantined", "watcher")], "healthy", "operator:ana", "quarantined -> healthy is not a transition"),
    ([("quarantined", "watcher")], "repairing", "audit", "is made by repair, an operator, not audit"),
    ([("quarantined", "watcher")], "rma", "watcher", "not watcher"),
    ([("quarantined", "watcher"), ("rma", "operator:ana")], "validating", "preflight", "not preflight"),
    ([], "broken", "audit", "unknown state"),
])
def test_a_transition_the_table_does_not_allow_is_refused_and_nothing_is_written(tmp_path, start, to, actor, says):
    with History(tmp_path / store.FILE_NAME) as h:
        for i, (state, who) in enumerate(start):
            transition(h, "n1", state, "setup", who, now=T0 + i)
        before = h.lifecycle_of("n1")
        if says is None:
            assert transition(h, "n1", to, "again", actor, now=T0 + 10)["added"] == []
        else:
            with pytest.raises(LifecycleError, match="node n1: .*" + says.replace("(", r"\(").replace(")", r"\)")):
                transition(h, "n1", to, "why", actor, now=T0 + 10)
        assert h.lifecycle_of("n1") == before


@pytest.mark.parametrize("kwargs, says", [
    ({"actor": "root; rm -rf /"}, "actor"), ({"actor": "operator:"}, "actor"),
    ({"reason": "two\nlines"}, "the reason"), ({"reason": " "}, "the reason"), ({"reason": "x" * 301}, "the reason"),
    ({"code": "xid 79"}, "finding code"), ({"gpu": "../../etc"}, "GPU"),
])
def test_bad_input_is_refused_naming_the_node_and_the_value(tmp_path, kwargs, says):
    args = dict({"reason": "XID 79", "actor": "watcher", "code": "XID_CRITICAL", "gpu": "3"}, **kwargs)
    with History(tmp_path / store.FILE_NAME) as h:
        with pytest.raises(LifecycleError, match="node n1: " + says):
            transition(h, "n1", "quarantined", now=T0, **args)
        assert h.lifecycle_of("n1") == []


def test_two_triggers_for_one_fault_make_one_quarantine_even_from_two_writers_at_once(tmp_path):
    path = tmp_path / store.FILE_NAME
    History(path).close()
    results, start = [], threading.Barrier(8)

    def trigger(actor):
        with History(path) as h:
            start.wait()
            results.append(transition(h, "n1", "quarantined", "XID 79", actor, now=T0, **XID))

    threads = [threading.Thread(target=trigger, args=(a,)) for a in ("watcher", "audit", "alert", "burn_in") * 2]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    with History(path) as h:
        assert [r["to_state"] for r in h.lifecycle_of("n1")] == ["quarantined"]
        # a later warning while it is out of service changes nothing either
        assert transition(h, "n1", "suspect", "ECC rising", "audit", now=T0 + 5)["added"] == []
    assert sorted(len(r["added"]) for r in results) == [0] * 7 + [1]


def _cycle(h, host, start, fails=False):
    transition(h, host, "quarantined", "XID 79", "watcher", now=start, **XID)
    transition(h, host, "repairing", "GPU reset", "repair", now=start + 60)
    transition(h, host, "validating", "preflight", "repair", now=start + 120)
    return transition(h, host, "quarantined" if fails else "healthy", "preflight", "preflight", now=start + 600)


def test_the_second_quarantine_within_the_window_makes_a_lemon_that_goes_to_rma(tmp_path):
    with History(tmp_path / store.FILE_NAME) as h:
        _cycle(h, "n1", T0)
        done = transition(h, "n1", "quarantined", "XID 79 again", "audit", now=T0 + 6 * DAY, **XID)
        assert done["state"] == "rma"
        lemon, rma = h.lifecycle_of("n1")[-2:]
        assert (lemon["from_state"], lemon["to_state"], lemon["actor"]) == ("quarantined", "lemon", "lemon_rule")
        assert lemon["reason"].startswith("quarantined 2 times in 7 days (gpufleet_lemon_quarantines 2)")
        assert (rma["to_state"], rma["code"], rma["evidence"]) == ("rma", "XID_CRITICAL", XID["evidence"])
        # outside the window, or with the rule off, it is a plain quarantine
        _cycle(h, "n2", T0)
        assert transition(h, "n2", "quarantined", "XID 79", "audit", now=T0 + 8 * DAY)["state"] == "quarantined"
        _cycle(h, "n3", T0)
        assert transition(h, "n3", "quarantined", "XID 79", "audit", now=T0 + DAY,
                          t={"gpufleet_lemon_quarantines": 0})["state"] == "quarantined"
        # a failed validation sends the node back to quarantine without counting as a new fault
        assert _cycle(h, "n4", T0, fails=True)["state"] == "quarantined"
        assert lifecycle.lemon_count(h.lifecycle_of("n4"), T0 + DAY, 7) == 1


def test_the_transition_table_uses_only_known_states_and_every_state_can_be_reached_and_left():
    states = set(lifecycle.STATES)
    assert {s for pair in lifecycle.TRANSITIONS for s in pair} == states
    assert {t for _f, t in lifecycle.TRANSITIONS} == states - set() and {f for f, _t in lifecycle.TRANSITIONS} == states
    # only a validation returns a node to service
    assert {f for f, t in lifecycle.TRANSITIONS if t == "healthy"} == {"suspect", "validating"}


def test_an_older_history_is_migrated_forward_keeping_its_runs(tmp_path):
    path = tmp_path / store.FILE_NAME
    db = sqlite3.connect(path)
    for step in store.MIGRATIONS[:3]:
        db.executescript(step)
    db.execute("INSERT INTO hosts (name) VALUES ('n1')")
    db.execute("PRAGMA application_id = %d" % store.APPLICATION_ID)
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    with History(path) as h:
        assert h.version() == store.SCHEMA_VERSION and h.hosts() == ["n1"]
        transition(h, "n1", "suspect", "ECC rising", "audit", now=T0)
        assert lifecycle.summary(h.lifecycle_of("n1"), now=T0)["state"] == "suspect"


def test_an_alert_that_started_before_the_nodes_return_to_service_is_the_fault_already_handled(tmp_path):
    # Quarantined by the alert at T0, repaired and returned at T0+1200; Alertmanager repeats the alert (still firing,
    # startsAt T0-30) within its hour: nothing is recorded. A new XID's alert (started after the return) quarantines.
    with History(tmp_path / store.FILE_NAME) as h:
        transition(h, "n1", "quarantined", "XID 79 on GPU 3", "alert", now=T0, started=T0 - 30, **XID)
        transition(h, "n1", "repairing", "power cycle", "repair", now=T0 + 600)
        transition(h, "n1", "validating", "preflight", "repair", now=T0 + 700)
        transition(h, "n1", "healthy", "preflight passed", "repair", now=T0 + 1200)
        rows = h.lifecycle_of("n1")
        assert lifecycle.handled_before(rows, T0 - 30)["ts"] == T0 + 1200
        repeat = transition(h, "n1", "quarantined", "XID 79 on GPU 3", "alert", now=T0 + 1500, started=T0 - 30, **XID)
        assert (repeat["added"], repeat["state"]) == ([], "healthy") and h.lifecycle_of("n1") == rows
        # A finder's suspicion about the old fault is dropped too; a trigger without a start time (the audit) and an
        # operator act as before.
        assert lifecycle.plan(rows, "n1", "suspect", "old", "watcher", now=T0 + 1500, started=T0 + 1199) == []
        assert lifecycle.handled_before(rows, T0 + 1200) is None and lifecycle.handled_before(rows, None) is None
        assert lifecycle.plan(rows, "n1", "quarantined", "by hand", "operator:ana", now=T0 + 1500, started=T0)
        new = transition(h, "n1", "quarantined", "XID 48 on GPU 5", "alert", now=T0 + 1800, started=T0 + 1700,
                         code="XID_48", gpu="5")
        # (its second quarantine in a week: the lemon rule sends it on to rma)
        assert [(r["to_state"], r["code"]) for r in new["added"]][0] == ("quarantined", "XID_48")
