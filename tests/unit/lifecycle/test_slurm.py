"""Slurm's side of the lifecycle: scontrol's one-line node output in its exact formats (tests/fixtures/slurm), the
named failures of slurmctld, the policy (never resume a foreign drain, never repair while a job runs, never cancel
unless asked) and the dry run, which prints every step and changes nothing."""

from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import slurm
from ansible_collections.kentino.gpufleet.plugins.module_utils.slurm import SlurmClient, SlurmError
from helpers.slurmctld_model import Slurmctld

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


@pytest.mark.parametrize("name, state, drained, draining, owned, reason, user", [
    ("idle.txt", "IDLE", False, False, False, None, None),
    ("idle_drain_owned.txt", "IDLE+DRAIN", True, False, True,
     "gpufleet: XID_CRITICAL 0000:3b:00 XID 79 GPU has fallen off the bus", "root"),
    ("idle_drain_owned_20.11.txt", "IDLE+DRAIN", True, False, True, "gpufleet: XID_CRITICAL 0000:3b:00", "root"),
    ("idle_drain_owned_comment.txt", "IDLE+DRAIN", True, False, True, "gpufleet: PSU_RAIL_LOST 4-7", "root"),
    ("mixed_drain_owned.txt", "MIXED+DRAIN", False, True, True, "gpufleet: ECC_DBE 3 volatile=2", "slurm"),
    ("allocated_drain_foreign.txt", "ALLOCATED+DRAIN", False, True, False,
     "bad dimm, see ticket INC-4711 (owner=hw)", "ana"),
    ("idle_completing_drain_owned.txt", "IDLE+COMPLETING+DRAIN", False, True, True, "gpufleet: XID_CRITICAL 2",
     "root"),
    ("down_drain_not_responding.txt", "DOWN+DRAIN+NOT_RESPONDING", True, False, False, "Not responding", "slurm"),
])
def test_scontrol_one_line_output_is_read_in_every_variant(name, state, drained, draining, owned, reason, user):
    node = slurm.parse_node((FIXTURES / name).read_text())
    assert (node["name"], node["state"], node["drained"], node["draining"]) == ("gpu01", state, drained, draining)
    assert (node["owned"], node["reason"], node["reason_user"]) == (owned, reason, user)


def test_text_without_a_node_line_is_none_and_sinfo_words_lose_their_flag_suffix():
    assert slurm.parse_node("") is None and slurm.parse_node("garbage\x00\n") is None
    assert [slurm.parse_sinfo_state(t) for t in ("drained\n", "draining*\n", "drained~", "", "mixed-")] == [
        "drained", "draining", "drained", None, "mixed"]


def _fixed(rc, out="", err="", timed_out=False, error=None):
    return lambda argv, timeout_s: (rc, out, err, timed_out, error)


@pytest.mark.parametrize("runner, state, says", [
    (_fixed(1, err=(FIXTURES / "err_controller_down.txt").read_text()), "controller_down", "start slurmctld"),
    (_fixed(1, err=(FIXTURES / "err_munge.txt").read_text()), "auth_failed", "munge.key"),
    (_fixed(1, out=(FIXTURES / "err_unknown_node.txt").read_text()), "unknown_node", "NodeName="),
    (_fixed(None, timed_out=True), "timeout", "did not answer in time"),
    (_fixed(None, error="No such file or directory"), "missing_tool", "install the Slurm client"),
    (_fixed(0, out="NodeName=gpu02 State=IDLE\n"), "unparsed", "printed no NodeName=gpu01 line"),
    (_fixed(0, out="Segmentation fault\n"), "unparsed", "printed no NodeName=gpu01 line"),
])
def test_every_failure_of_slurm_is_a_named_state_and_nothing_is_resumed(runner, state, says):
    client = SlurmClient(runner)
    for call in (lambda: client.show("gpu01"), lambda: slurm.release(client, "gpu01")):
        with pytest.raises(SlurmError, match="node gpu01: .*" + says) as err:
            call()
        assert err.value.state == state
    assert [s["argv"][1] for s in client.steps] == ["show", "show"], "only reads: nothing changed on a failure"


@pytest.mark.parametrize("err, state", [("err_update_denied.txt", "permission_denied"),
                                        ("err_update_unknown.txt", "unknown_node")])
def test_a_refused_update_is_named(err, state):
    failure = slurm.classify("gpu01", ["scontrol", "update"], 1, "", (FIXTURES / err).read_text())
    assert failure.state == state and "node gpu01" in str(failure)


@pytest.mark.parametrize("name", ["gpu01;reboot", "-x", "a b", "", "n" * 65, "gpu01\n"])
def test_a_node_name_that_is_not_one_is_refused_before_anything_runs(name):
    client = SlurmClient(_fixed(0))
    with pytest.raises(SlurmError, match="is not a node name") as err:
        client.show(name)
    assert err.value.state == "bad_input" and client.steps == []


def test_reasons_are_owned_one_printable_line():
    assert slurm.drain_reason("XID_CRITICAL", "0000:3b:00", "XID 79") == "gpufleet: XID_CRITICAL 0000:3b:00 XID 79"
    for code, detail in (("xid", None), ("XID_CRITICAL", "a\nb"), ("XID_CRITICAL", "x" * 200)):
        with pytest.raises(SlurmError, match="drain reason"):
            slurm.drain_reason(code, None, detail)


def test_quarantine_drains_with_the_owned_reason_and_leaves_a_foreign_drain_alone():
    ctld = Slurmctld()
    client = SlurmClient(ctld.run)
    done = slurm.quarantine(client, "gpu01", "gpufleet: XID_CRITICAL 3")
    assert done["action"] == "drain" and ctld.reason == "gpufleet: XID_CRITICAL 3" and ctld.drain
    assert client.steps[-1]["argv"] == ["scontrol", "update", "nodename=gpu01", "state=drain",
                                        "reason=gpufleet: XID_CRITICAL 3"]
    assert slurm.quarantine(client, "gpu01", "gpufleet: XID_CRITICAL 3")["action"] == "keep"
    ctld.admin_drain("bad dimm")
    assert "someone else" in slurm.quarantine(client, "gpu01", "gpufleet: ECC_DBE 1")["why"]
    assert ctld.reason == "bad dimm", "a foreign reason is never overwritten"
    with pytest.raises(SlurmError, match="drained by someone else .*'bad dimm', set by ana.*resumes only its own") \
            as err:
        slurm.release(client, "gpu01")
    assert err.value.state == "foreign_drain" and ctld.drain and ctld.violations == []


def test_the_dry_run_prints_every_step_and_changes_nothing():
    ctld = Slurmctld()
    client = SlurmClient(ctld.run, dry_run=True)
    slurm.quarantine(client, "gpu01", "gpufleet: XID_CRITICAL 3")
    assert not ctld.drain and [s["run"] for s in client.steps] == [True, False]
    assert client.steps[1]["argv"][-2:] == ["state=drain", "reason=gpufleet: XID_CRITICAL 3"]
    assert ["scontrol", "update", "nodename=gpu01", "state=drain", "reason=gpufleet: XID_CRITICAL 3"] not in ctld.log


class Clock:
    """A clock the wait loop sleeps on: each sleep advances it and lets the world go on (events at given times)."""

    def __init__(self, events=()):
        self.now, self.events, self.sleeps = 0.0, sorted(events, key=lambda e: e[0]), []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds
        while self.events and self.events[0][0] <= self.now:
            self.events.pop(0)[1]()


def test_no_repair_while_a_job_runs_it_waits_for_drained_up_to_the_limit():
    ctld = Slurmctld()
    ctld.job_start(16)
    client = SlurmClient(ctld.run)
    slurm.quarantine(client, "gpu01", "gpufleet: XID_CRITICAL 3")
    clock = Clock([(120, ctld.job_end), (130, ctld.tick)])
    done = slurm.wait_drained(client, "gpu01", 600, clock, clock.sleep, poll_s=30)
    assert done["action"] == "repair" and ctld.jobs == [] and 120 <= done["waited_s"] <= 160
    # a job that outlives the limit: no repair, said so, the node stays drained, nothing cancelled
    ctld = Slurmctld()
    ctld.job_start(64)
    client = SlurmClient(ctld.run)
    slurm.quarantine(client, "gpu01", "gpufleet: XID_CRITICAL 3")
    clock = Clock()
    done = slurm.wait_drained(client, "gpu01", 300, clock, clock.sleep, poll_s=60)
    assert done["action"] == "give_up" and "ALLOCATED+DRAIN" in done["why"] and "stays drained" in done["why"]
    assert ctld.jobs == [64] and ctld.drain and not any(a[0] == "scancel" for a in ctld.log)
    # asked to cancel: scancel, then the node drains
    clock = Clock([(400, ctld.tick)])
    done = slurm.wait_drained(client, "gpu01", 300, clock, clock.sleep, poll_s=60, cancel_jobs=True)
    assert done["action"] == "repair" and ["scancel", "--nodelist=gpu01"] in ctld.log


def test_a_node_resumed_by_someone_while_quarantined_is_not_repaired():
    ctld = Slurmctld()
    client = SlurmClient(ctld.run)
    slurm.quarantine(client, "gpu01", "gpufleet: XID_CRITICAL 3")
    ctld.admin_resume()
    clock = Clock()
    with pytest.raises(SlurmError, match="not drained .*drain it before any repair") as err:
        slurm.wait_drained(client, "gpu01", 300, clock, clock.sleep)
    assert err.value.state == "not_drained"
