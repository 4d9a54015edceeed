"""gpufleet's side of the Slurm property tests: the lifecycle's rows in memory (history/lifecycle.plan, the decision
the playbook uses) and Slurm through module_utils/slurm.py's client, driven by a list of events. Failures quarantine,
repairs wait for DRAINED, passes return the node; the other events are the world moving on (jobs, an administrator),
one of them each time the loop sleeps while it waits. The model of slurmctld (slurmctld_model.py) answers by
default; tests/integration/test_slurm_real_property.py runs the same loop against a real slurmctld."""

from ansible_collections.kentino.gpufleet.plugins.module_utils import slurm
from ansible_collections.kentino.gpufleet.plugins.module_utils.slurm import SlurmClient, SlurmError
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle

LOOP_EVENTS = ("failure", "repair", "pass")


class Loop:
    def __init__(self, ctld, events, run=None):
        self.ctld, self.events, self.rows, self.now = ctld, events, [], 0.0
        self.node = ctld.name
        self.client = SlurmClient(run or ctld.run)
        self.repairs_during_jobs = 0

    def running_jobs(self):
        return len(self.ctld.jobs)

    def world(self, kind, arg):
        ctld = self.ctld
        {"job_start": lambda: ctld.job_start(arg), "job_end": ctld.job_end, "tick": ctld.tick,
         "admin_drain": lambda: ctld.admin_drain(arg), "admin_resume": ctld.admin_resume,
         "ctld_down": lambda: setattr(ctld, "down", arg)}[kind]()

    def sleep(self, seconds):
        self.now += seconds
        if self.events:
            self.world(*self.events.pop(0)) if self.events[0][0] not in LOOP_EVENTS else None

    def move(self, to, actor, reason="step"):
        self.rows += lifecycle.plan(self.rows, self.node, to, reason, actor, now=self.now)

    def step(self, kind, arg):
        state = lifecycle.state_of(self.rows)
        try:
            if kind == "failure" and state not in lifecycle.OUT_OF_SERVICE:
                self.move("quarantined", "watcher")
                slurm.quarantine(self.client, self.node, slurm.drain_reason(arg, "3"))
            elif kind == "repair" and state == "quarantined":
                done = slurm.wait_drained(self.client, self.node, 300, lambda: self.now, self.sleep, poll_s=60)
                if done["action"] == "repair":
                    self.repairs_during_jobs += bool(self.running_jobs())
                    self.move("repairing", "repair")
                    self.move("validating", "repair")
            elif kind == "pass" and state == "validating":
                slurm.release(self.client, self.node)
                self.move("healthy", "preflight")
            elif kind not in LOOP_EVENTS:
                self.world(kind, arg)
        except SlurmError:
            pass  # a named failure: the node stays where it is in the lifecycle, nothing resumed

    def run_all(self):
        while self.events:
            self.step(*self.events.pop(0))
        return self
