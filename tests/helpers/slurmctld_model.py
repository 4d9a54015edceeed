"""A model of slurmctld's drain, resume and job semantics for one node, answering the argv lists the client runs
(`scontrol show node -o`, `sinfo -h -N -n NODE -o %T`, `scontrol update ... state=drain|resume`, `scancel
--nodelist=`) in Slurm's formats (tests/fixtures/slurm/README.md), and recording what must never happen: a resume
of a node whose reason is someone else's.

Semantics modelled (Slurm's node state machine): a job starts only on a node that is neither drained nor down, and
makes it MIXED (part of its CPUs) or ALLOCATED (all of them); `state=drain` sets the DRAIN flag and the reason (the
jobs go on running: DRAINING, until they end: DRAINED); a job that ends leaves COMPLETING until slurmctld hears from
the node (a tick); `state=resume` clears DRAIN and the reason, and is refused on a node that is not drained. A resumed
node is NOT_RESPONDING (sinfo's `idle*`) until slurmctld has pinged it again (a tick), and no job starts on it
meanwhile: Slurm 22.05 does this, as the real slurmctld in tests/integration/test_slurm_real_property.py showed."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
CPUS = 64


class Slurmctld:
    def __init__(self, name="gpu01", cpus=CPUS):
        self.name, self.cpus = name, cpus
        self.jobs = []  # CPUs of each running job
        self.drain = False
        self.completing = False
        self.not_responding = False
        self.reason = None
        self.reason_user = None
        self.down = False  # slurmctld itself down: every command fails
        self.violations = []
        self.log = []

    # ---- the node's state as scontrol prints it ------------------------------------------------------------------
    def base(self):
        used = sum(self.jobs)
        return "IDLE" if not used else "ALLOCATED" if used >= self.cpus else "MIXED"

    def state(self):
        return "+".join([self.base()] + (["COMPLETING"] if self.completing else []) + (["DRAIN"] if self.drain else [])
                        + (["NOT_RESPONDING"] if self.not_responding else []))

    def show_line(self):
        line = ("NodeName=%s Arch=x86_64 CoresPerSocket=32 CPUAlloc=%d CPUEfctv=64 CPUTot=64 CPULoad=0.02 "
                "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:8(S:0-1) NodeAddr=%s NodeHostName=%s "
                "Version=23.11.4 OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)  "
                "RealMemory=1031000 AllocMem=0 FreeMem=1019876 Sockets=2 Boards=1 State=%s ThreadsPerCore=1 "
                "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  BootTime=2024-05-02T09:14:11 "
                "SlurmdStartTime=2024-05-02T09:15:02 LastBusyTime=2024-05-06T11:02:40 ResumeAfterTime=None "
                "CfgTRES=cpu=64,mem=1031000M,billing=64,gres/gpu=8 AllocTRES=%s CurrentWatts=0 AveWatts=0" % (
                    self.name, sum(self.jobs), self.name, self.name, self.state(),
                    "cpu=%d" % sum(self.jobs) if self.jobs else ""))
        if self.reason:
            line += " Reason=%s [%s@2024-05-06T11:03:12]" % (self.reason, self.reason_user)
        return line + "\n"

    def sinfo_word(self):
        if self.drain:
            word = "draining" if self.completing or self.jobs else "drained"
        else:
            word = "completing" if self.completing else self.base().lower()
        return word + ("*" if self.not_responding else "")

    # ---- what happens to the node ---------------------------------------------------------------------------------
    def job_start(self, cpus):
        if not (self.drain or self.down or self.not_responding) and sum(self.jobs) + cpus <= self.cpus:
            self.jobs.append(cpus)

    def job_end(self):
        if self.jobs:
            self.jobs.pop(0)
            self.completing = True

    def tick(self):
        self.completing = self.not_responding = False

    def admin_drain(self, reason, user="ana"):
        self.drain, self.reason, self.reason_user = True, reason, user

    def admin_resume(self):
        if self.drain:
            self.drain, self.reason, self.reason_user = False, None, None
            self.not_responding = True

    # ---- the commands ----------------------------------------------------------------------------------------------
    def run(self, argv, timeout_s):
        """The client's runner: (rc, stdout, stderr, timed_out, error)."""
        self.log.append(list(argv))
        if self.down:
            return 1, "", (FIXTURES / "err_controller_down.txt").read_text(), False, None
        tool, args = argv[0], argv[1:]
        if tool == "scontrol" and args[:3] == ["show", "node", "-o"]:
            if args[3] != self.name:
                return 1, "Node %s not found\n" % args[3], "", False, None
            return 0, self.show_line(), "", False, None
        if tool == "sinfo":
            return 0, self.sinfo_word() + "\n", "", False, None
        if tool == "scontrol" and args[0] == "update":
            opts = dict(a.split("=", 1) for a in args[1:])
            if opts.get("nodename") != self.name:
                return 1, "", "slurm_update error: Invalid node name specified\n", False, None
            if opts.get("state") == "drain":
                self.admin_drain(opts["reason"], "root")
                return 0, "", "", False, None
            if opts.get("state") == "resume":
                if not self.drain:
                    return 1, "", "slurm_update error: Invalid node state specified\n", False, None
                if not (self.reason or "").startswith("gpufleet:"):
                    self.violations.append("resumed a node drained by someone else: %r" % self.reason)
                self.admin_resume()
                return 0, "", "", False, None
        if tool == "scancel":
            self.jobs = []
            self.completing = True
            return 0, "", "", False, None
        return 1, "", "unknown command %s\n" % argv, False, None
