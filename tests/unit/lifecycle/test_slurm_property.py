"""The loop against a model of slurmctld (tests/helpers/slurmctld_model.py), 10,000 random sequences of admin
drains and resumes, gpufleet quarantines (failures), repairs, validations that pass, jobs that start and end: no node
drained by someone else is ever resumed, and no repair runs while a job is on the node. The lifecycle's own decision
(history/lifecycle.plan) and Slurm's policy (module_utils/slurm.py) are the ones the playbook uses."""

import random

from ansible_collections.kentino.gpufleet.plugins.module_utils import slurm
from ansible_collections.kentino.gpufleet.plugins.module_utils.slurm import SlurmClient
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle
from helpers.slurm_loop import Loop
from helpers.slurmctld_model import Slurmctld
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EVENTS = st.one_of(
    st.tuples(st.just("job_start"), st.sampled_from([8, 32, 64])),
    st.tuples(st.just("job_end"), st.none()), st.tuples(st.just("tick"), st.none()),
    st.tuples(st.just("admin_drain"), st.sampled_from(["bad dimm", "maintenance", "gpufleet-ish but not ours"])),
    st.tuples(st.just("admin_resume"), st.none()),
    st.tuples(st.just("failure"), st.sampled_from(["XID_CRITICAL", "ECC_DBE"])),
    st.tuples(st.just("repair"), st.none()), st.tuples(st.just("pass"), st.none()),
    st.tuples(st.just("ctld_down"), st.booleans()),
)


def _run(events):
    ctld = Slurmctld()
    return ctld, Loop(ctld, list(events)).run_all()


def _check(events):
    ctld, loop = _run(events)
    assert ctld.violations == [] and loop.repairs_during_jobs == 0, events
    # the node's lifecycle only ever moved along the table
    for row in loop.rows:
        assert (row["from_state"], row["to_state"]) in lifecycle.TRANSITIONS, events


# Hypothesis explores and shrinks a counterexample to its shortest form; the 10,000 seeded sequences below cover the
# ground at a fraction of hypothesis's cost per example.
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EVENTS, max_size=30))
def test_no_foreign_drain_is_resumed_and_no_repair_runs_during_a_job(events):
    _check(events)


CHOICES = [("job_start", [8, 32, 64]), ("job_end", [None]), ("tick", [None]),
           ("admin_drain", ["bad dimm", "maintenance", "gpufleet-ish but not ours"]), ("admin_resume", [None]),
           ("failure", ["XID_CRITICAL", "ECC_DBE"]), ("repair", [None]), ("pass", [None]), ("ctld_down", [True, False])]


def test_ten_thousand_seeded_sequences_keep_both_rules():
    for seed in range(10000):
        rng = random.Random(seed)
        events = []
        for _ in range(rng.randint(0, 30)):
            kind, args = rng.choice(CHOICES)
            events.append((kind, rng.choice(args)))
        _check(events)


def test_the_model_catches_a_policy_that_resumes_any_drain(monkeypatch):
    """The property can fail: with the owner check removed, a foreign drain is resumed."""
    monkeypatch.setattr(slurm, "decide_resume", lambda node: ("resume", "any drain") if node["drain"] else
                        ("none", "not drained"))
    ctld = Slurmctld()
    Loop(ctld, [("failure", "XID_CRITICAL"), ("repair", None), ("admin_drain", "bad dimm"), ("pass", None)]).run_all()
    assert ctld.violations == ["resumed a node drained by someone else: 'bad dimm'"]


def test_the_model_catches_a_policy_that_repairs_while_draining(monkeypatch):
    """With both guards gone (scontrol's state and sinfo's word), a repair runs under a job."""
    monkeypatch.setattr(slurm, "decide_repair", lambda node, *a, **k: ("repair", "always"))
    monkeypatch.setattr(SlurmClient, "sinfo_state", lambda self, name: "drained")
    ctld = Slurmctld()
    loop = Loop(ctld, [("job_start", 8), ("failure", "XID_CRITICAL"), ("repair", None)]).run_all()
    assert loop.repairs_during_jobs == 1
