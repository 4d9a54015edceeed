"""The lifecycle's Slurm loop (tests/helpers/slurm_loop.py, the one the 10,000 model sequences run) against a real
slurmctld, twinned with the model of it (tests/helpers/slurmctld_model.py): 201 random sequences of administrators'
drains and resumes, gpufleet's quarantines (failures), repairs, validations that pass, and jobs that start and end,
six nodes at once. Every command the loop runs goes to both; their answers must agree (success, the node's state,
flags, reason and sinfo's word), and so must the node after every event once it settled (no COMPLETING, no
NOT_RESPONDING: the model ticks). On the real Slurm: no node drained by someone else is ever resumed, and no repair
is decided while a job runs on the node (squeue's view). Jobs are real allocations (`salloc --no-shell --immediate`:
Slurm starts them at once or refuses, so no job is left pending to start later). slurmctld down is left to
test_slurm_real.py (each try costs the client's MessageTimeout)."""

import random
import threading

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import slurm
from ansible_collections.kentino.gpufleet.plugins.module_utils.slurm import parse_node, parse_sinfo_state
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle
from helpers.slurm_loop import LOOP_EVENTS, Loop
from helpers.slurmctld_model import Slurmctld

pytestmark = [pytest.mark.xdist_group("real_slurm"), pytest.mark.slow]
SEQUENCES = 201
WORLD = [("job_start", [1, 2]), ("job_end", [None]),
         ("admin_drain", ["bad dimm", "maintenance", "gpufleet-ish but not ours"]), ("admin_resume", [None])]
CODES = ["XID_CRITICAL", "ECC_DBE"]


class Disagreement(Exception):
    pass


def view(node):
    return None if node is None else (node["base"], sorted(node["flags"]), node["reason"], node["drained"],
                                      node["draining"], node["owned"])


class RealLoop(Loop):
    """The loop with every command run by the real slurmctld and by the model, and the world's events done to both."""

    def __init__(self, real, node, events):
        Loop.__init__(self, Slurmctld(node, cpus=real.cpus), events, run=self.twin)
        self.real, self.job_ids, self.foreign_resumes, self.shown, self.changed = real, [], [], None, False

    def twin(self, argv, timeout_s):
        if argv[1:2] == ["update"] and "state=resume" in argv and not self.shown["owned"]:
            self.foreign_resumes.append(self.shown["reason"])  # as slurmctld showed it just before (release())
        self.changed = self.changed or argv[1:2] == ["update"] or argv[0] == "scancel"
        model, real = self.ctld.run(argv, timeout_s), self.real.run(argv, timeout_s)
        if real[0] == 0 and argv[1:3] == ["show", "node"]:
            self.shown = parse_node(real[1])
        if (model[0] == 0) != (real[0] == 0):
            raise Disagreement("%s: model rc %s (%s), real rc %s (%s)" % (argv, model[0], model[2].strip(), real[0],
                                                                          real[2].strip()))
        if real[0] == 0 and argv[1:3] == ["show", "node"] and view(parse_node(model[1])) != view(parse_node(real[1])):
            raise Disagreement("%s: model %s, real %s" % (argv, view(parse_node(model[1])), view(parse_node(real[1]))))
        if real[0] == 0 and argv[0] == "sinfo" and parse_sinfo_state(model[1]) != parse_sinfo_state(real[1]):
            raise Disagreement("%s: model %r, real %r" % (argv, model[1].strip(), real[1].strip()))
        return real

    def running_jobs(self):
        return len(self.real.jobs(self.node))

    def world(self, kind, arg):
        model, real, node = self.ctld, self.real, self.node
        if kind == "job_start":
            before = len(model.jobs)
            model.job_start(arg)
            job = real.allocate(node, arg)
            if job is not None:
                self.job_ids.append(job)
            if (job is not None) != (len(model.jobs) > before):
                raise Disagreement("job of %d CPUs: model started it: %s, real: %s" % (
                    arg, len(model.jobs) > before, job is not None))
        elif kind == "job_end":
            model.job_end()
            if self.job_ids:
                real.end(self.job_ids.pop(0))
        elif kind == "admin_drain":
            model.admin_drain(arg)
            real.check("scontrol", "update", "nodename=%s" % node, "state=drain", "reason=%s" % arg)
        elif kind == "admin_resume":
            model.admin_resume()
            if "DRAIN" in real.node_state(node):
                real.check("scontrol", "update", "nodename=%s" % node, "state=resume")
        self.settle(kind)

    def settle(self, after):
        self.ctld.tick()
        model, real = view(parse_node(self.ctld.show_line())), view(parse_node(self.real.settled(self.node)))
        if model != real:
            raise Disagreement("after %s: model %s, real %s" % (after, model, real))

    def step(self, kind, arg):
        self.changed = False
        Loop.step(self, kind, arg)  # the world's events settle in world()
        if kind in LOOP_EVENTS and self.changed:  # else the twin compared the node as the loop read it
            self.settle(kind)


def sequence(seed):
    """Up to three of the world's events with the loop's failure, repair(s) and pass among them, in that order: short
    sequences that each go round the loop (random draws of all kinds alike seldom reach a release)."""
    rng = random.Random(seed)
    world = [(kind, rng.choice(args)) for kind, args in (rng.choice(WORLD) for _ in range(rng.randint(0, 3)))]
    loop = [("failure", rng.choice(CODES))] + [("repair", None)] * rng.randint(1, 2) + [("pass", None)]
    events = []
    while world or loop:
        source = world if world and (not loop or rng.random() < 0.5) else loop
        events.append(source.pop(0))
    return events


def check_sequence(real, node, events):
    """The problems of one sequence on the real Slurm (empty: none)."""
    loop = RealLoop(real, node, list(events))
    try:
        loop.run_all()
    except Disagreement as exc:
        return ["model and Slurm disagree: %s" % exc]
    finally:
        real.reset(node, loop.job_ids)
    problems = ["resumed a node drained by someone else: %r" % r for r in loop.foreign_resumes]
    problems += ["a repair was decided while a job ran"] * loop.repairs_during_jobs
    problems += ["off the lifecycle table: %s -> %s" % (r["from_state"], r["to_state"]) for r in loop.rows
                 if (r["from_state"], r["to_state"]) not in lifecycle.TRANSITIONS]
    return problems + loop.ctld.violations


@pytest.fixture
def cluster(real_slurm):
    for node in real_slurm.nodes:
        real_slurm.reset(node)
    yield real_slurm
    for node in real_slurm.nodes:
        real_slurm.reset(node)


def test_random_sequences_on_a_real_slurmctld_agree_with_the_model_and_keep_both_rules(cluster):
    failures, errors = [], []

    def worker(node, seeds):
        try:
            for seed in seeds:
                events = sequence(seed)
                failures.extend("seed %d on %s %s: %s" % (seed, node, events, p)
                                for p in check_sequence(cluster, node, events))
        except Exception as exc:  # noqa: BLE001 - reported below with the node, a thread's exception is lost
            errors.append("%s: %r" % (node, exc))

    threads = [threading.Thread(target=worker, args=(node, range(i, SEQUENCES, len(cluster.nodes))))
               for i, node in enumerate(cluster.nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not failures, "\n".join(errors + failures[:20])


def test_the_real_check_catches_a_policy_that_resumes_any_drain(cluster, monkeypatch):
    monkeypatch.setattr(slurm, "decide_resume", lambda node: ("resume", "any drain") if node["drain"] else
                        ("none", "not drained"))
    problems = check_sequence(cluster, "gf1", [("failure", "XID_CRITICAL"), ("repair", None), ("admin_drain", "bad dimm"),
                                             ("pass", None)])
    assert "resumed a node drained by someone else: 'bad dimm'" in problems


def test_the_real_check_catches_a_policy_that_repairs_while_a_job_runs(cluster, monkeypatch):
    monkeypatch.setattr(slurm, "decide_repair", lambda node, *a, **k: ("repair", "always"))
    monkeypatch.setattr(slurm.SlurmClient, "sinfo_state", lambda self, name: "drained")
    problems = check_sequence(cluster, "gf2", [("job_start", 1), ("failure", "XID_CRITICAL"), ("repair", None)])
    assert problems == ["a repair was decided while a job ran"]



def test_the_twin_catches_a_model_that_differs_from_slurm(cluster, monkeypatch):
    """A model that starts jobs on a drained node: the real slurmctld refuses the job, and the twin says so."""
    monkeypatch.setattr(Slurmctld, "job_start", lambda self, cpus: self.jobs.append(cpus))
    problems = check_sequence(cluster, "gf3", [("failure", "XID_CRITICAL"), ("job_start", 1)])
    assert problems == ["model and Slurm disagree: job of 1 CPUs: model started it: True, real: False"]
