"""The slurm_node module (module_utils/slurm.py) against a real slurmctld with real slurmd (tests/helpers/real_slurm.py),
scontrol and sinfo from Debian's Slurm 22.05 on the PATH: gpufleet drains with its own reason and reads it back, never
resumes an administrator's drain, waits for a running job and says so rather than repair, resumes its own drains, and
names Slurm's failures (controller down, a wrong munge key, an unknown node) with what to do."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import slurm as slurm_utils
from helpers.module_runner import run_module

pytestmark = pytest.mark.xdist_group("real_slurm")


@pytest.fixture
def slurm(real_slurm):
    yield real_slurm
    for node in real_slurm.nodes:
        real_slurm.reset(node)


def module(slurm, conf=None, **args):
    return run_module("slurm_node", args, env={"SLURM_CONF": conf or slurm.conf}, timeout=120)


def test_a_quarantine_drains_with_gpufleets_reason_reads_it_back_and_resumes_it(slurm):
    result = module(slurm, name="gf1", state="drained", code="XID_CRITICAL", gpu="0000:3b:00", detail="XID 79")
    assert not result.get("failed") and result["changed"] is True and result["action"] == "drain", result
    shown = module(slurm, name="gf1")["node"]
    assert shown["reason"] == "gpufleet: XID_CRITICAL 0000:3b:00 XID 79" and shown["reason_user"] == "root"
    assert (shown["state"], shown["owned"], shown["drained"]) == ("IDLE+DRAIN", True, True)
    assert slurm.check("sinfo", "-h", "-N", "-n", "gf1", "-o", "%T").strip() == "drained"
    again = module(slurm, name="gf1", state="drained", code="ECC_DBE")
    assert (again["action"], again["changed"]) == ("keep", False)  # its first reason stays
    ready = module(slurm, name="gf1", state="ready", wait=5, poll=1)
    assert ready["action"] == "repair", ready
    resumed = module(slurm, name="gf1", state="resumed")
    assert (resumed["action"], resumed["changed"]) == ("resume", True), resumed
    # slurmctld marks a node it resumes NOT_RESPONDING until the node answers its ping (the model does the same)
    assert slurm.node_state("gf1") in ("IDLE", "IDLE+NOT_RESPONDING")
    assert slurm.node_state("gf1", slurm.settled("gf1")) == "IDLE"


def test_an_administrators_drain_is_never_resumed_nor_overwritten(slurm):
    slurm.check("scontrol", "update", "nodename=gf2", "state=drain", "reason=bad dimm, see INC-4711")
    result = module(slurm, name="gf2", state="resumed")
    assert result["failed"] and result["slurm_state"] == "foreign_drain", result
    assert "bad dimm, see INC-4711" in result["msg"] and "gpufleet resumes only its own drains" in result["msg"]
    kept = module(slurm, name="gf2", state="drained", code="XID_CRITICAL")
    assert (kept["action"], kept["changed"]) == ("keep", False), kept
    assert not any(step["argv"][1:2] == ["update"] for step in result["steps"] + kept["steps"])
    node = module(slurm, name="gf2")["node"]
    assert (node["state"], node["reason"], node["owned"]) == ("IDLE+DRAIN", "bad dimm, see INC-4711", False)


def test_a_running_job_holds_the_node_the_wait_gives_up_and_no_job_is_cancelled(slurm):
    job = slurm.sbatch_sleep("gf3")
    drained = module(slurm, name="gf3", state="drained", code="XID_CRITICAL", gpu="3")
    assert drained["action"] == "drain" and slurm.node_state("gf3") == "MIXED+DRAIN"
    waited = module(slurm, name="gf3", state="ready", wait=2, poll=1)
    assert not waited.get("failed") and waited["action"] == "give_up", waited
    assert waited["waited_s"] >= 2 and "a job still runs on it, so no repair" in waited["why"]
    assert waited["node"]["draining"] is True and waited["changed"] is False
    assert job in slurm.jobs("gf3") and slurm.node_state("gf3") == "MIXED+DRAIN"  # the job runs on, still drained
    assert not any(step["argv"][0].endswith("scancel") for step in waited["steps"])
    slurm.end(job)
    slurm.settled("gf3")
    assert module(slurm, name="gf3", state="ready", wait=5, poll=1)["action"] == "repair"


def test_a_node_that_is_not_drained_is_never_repaired(slurm):
    result = module(slurm, name="gf1", state="ready", wait=2, poll=1)
    assert result["failed"] and result["slurm_state"] == "not_drained" and "drain it before" in result["msg"]


def test_an_unknown_node_is_named(slurm):
    result = module(slurm, name="gf9", state="drained", code="XID_CRITICAL")
    assert result["failed"] and result["slurm_state"] == "unknown_node", result
    assert "Node gf9 not found" in result["msg"] and "NodeName=" in result["msg"]


def test_a_wrong_munge_key_is_named(slurm):
    # a client whose munged has another key, as on a host whose /etc/munge/munge.key differs from the controller's
    conf = slurm.client_conf("other-key", munged="munge-other-key")
    result = module(slurm, conf=conf, name="gf1", state="drained", code="XID_CRITICAL")
    assert result["failed"] and result["slurm_state"] == "auth_failed", result
    assert "same /etc/munge/munge.key" in result["msg"]
    assert "DRAIN" not in slurm.node_state("gf1")


def test_a_stopped_slurmctld_is_named_and_nothing_changes(slurm):
    # MessageTimeout=2: scontrol tries to connect for about MessageTimeout seconds before it gives up
    conf = slurm.client_conf("quick", MessageTimeout=2)
    slurm.check("scontrol", "update", "nodename=gf2", "state=drain", "reason=gpufleet: XID_CRITICAL 3")
    slurm.stop_controller()
    try:
        result = module(slurm, conf=conf, name="gf2", state="resumed")
    finally:
        slurm.start_controller()
    assert result["failed"] and result["slurm_state"] == "controller_down", result
    assert "Unable to contact slurm controller" in result["msg"] and "start slurmctld" in result["msg"]
    assert slurm.node_state("gf2") == "IDLE+DRAIN"  # nothing resumed on a guess


def test_cancel_jobs_ends_the_nodes_jobs_only_when_asked_then_repairs(slurm):
    job, other = slurm.sbatch_sleep("gf3"), slurm.sbatch_sleep("gf2")
    module(slurm, name="gf3", state="drained", code="XID_CRITICAL")
    result = module(slurm, name="gf3", state="ready", wait=1, poll=1, cancel_jobs=True)
    assert not result.get("failed") and result["action"] == "repair" and result["changed"] is True, result
    assert [s["argv"][1:] for s in result["steps"] if s["argv"][0].endswith("scancel")] == [["--nodelist=gf3"]]
    assert job not in slurm.jobs() and slurm.jobs("gf2") == [other]  # another node's job runs on


def test_a_user_without_slurm_privileges_is_named(slurm):
    """Slurm 22.05 refuses a node update from a user who is neither root, SlurmUser nor AdminLevel=Admin with
    "slurm_update error: Invalid user id"; reading needs no privilege."""
    client = slurm_utils.SlurmClient(lambda argv, timeout_s: slurm.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"] + argv, timeout_s))
    with pytest.raises(slurm_utils.SlurmError) as refused:
        slurm_utils.quarantine(client, "gf1", slurm_utils.drain_reason("XID_CRITICAL"))
    assert refused.value.state == "permission_denied", str(refused.value)
    assert "Invalid user id" in str(refused.value) and "adminlevel=admin" in str(refused.value)
    assert "DRAIN" not in slurm.node_state("gf1")
