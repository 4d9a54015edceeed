"""The lifecycle loop on the simulated fleet (kentino.gpufleet.lifecycle, the simulator's Slurm), as an operator runs
it: a node with a pending row remap is quarantined (RMA bundle, history, Slurm drained with gpufleet's reason, once
for two triggers at once), repaired (the GPU reset rung), validated by the burn-in stages the ladder names and
returned to Slurm; a node an admin drained is never resumed; a node quarantined twice in 7 days goes to rma; a dry
run changes nothing; a preflight with gpufleet_quarantine=critical quarantines the node its report fails. Four nodes,
each with its own reports and history, run side by side."""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, default_path
from helpers.lifecycle_runs import play, rows, slurm

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
NODES = {"lc01": "row_remap_pending", "lc02": "healthy_h100", "lc03": "healthy_h100", "lc04": "row_remap_pending"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("lifecycle")
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(root / "inv"), "--nodes",
                    str(len(NODES)), "--scenario", ",".join(NODES.values()), "--prefix", "lc"], check=True)
    return root


def admin_drain(root, node):
    env = dict(os.environ, GPUFLEET_SIM_STATE=str(root / "state" / node), GPUFLEET_SIM_NODE=node, LOGNAME="ana",
               USER="ana")
    subprocess.run([str(REPO / "sim" / "bin" / "scontrol"), "update", "nodename=%s" % node, "state=drain",
                    "reason=bad dimm, see INC-4711"], env=env, check=True)


def test_quarantine_repair_validate_and_return(fleet):
    def remap_node():
        # Two triggers at once (the alert and the audit) for the node's pending row remap.
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda actor: play(fleet, "lc01", "quarantine", "lifecycle_code=ROW_REMAP_PENDING",
                                                    "lifecycle_gpu=2", "lifecycle_actor=%s" % actor),
                                 ["alert", "audit"]))
        quarantined = rows(fleet, "lc01")
        drained = slurm(fleet, "lc01")
        repaired = play(fleet, "lc01", "repair")
        returned = (rows(fleet, "lc01"), slurm(fleet, "lc01"))
        # Alertmanager repeats the XID alert that fired before the return (still firing: its hour), first as it was,
        # then after a second XID on the same GPU (the rules' last_event_epoch moved past the return).
        back = returned[0][-1]["ts"]
        alert = {"labels": {"alertname": "GpuXidCritical", "instance": "lc01:9100", "xid": "79", "gpu": "2"},
                 "annotations": {"summary": "lc01:9100: XID 79 on GPU 2", "last_event_epoch": "%.3f" % (back - 30)},
                 "startsAt": time.strftime("%Y-%m-%dT%H:%M:%S.5Z", time.gmtime(back - 60))}
        repeat = play(fleet, "lc01", "quarantine", "lifecycle_actor=alert", json.dumps({"lifecycle_alerts": [alert]}))
        repeat_state = (rows(fleet, "lc01"), slurm(fleet, "lc01"))
        alert["annotations"]["last_event_epoch"] = "%.3f" % (back + 1)
        again = play(fleet, "lc01", "quarantine", "lifecycle_actor=alert", json.dumps({"lifecycle_alerts": [alert]}))
        return both, quarantined, drained, repaired, returned, (repeat, repeat_state), again

    def admin_node():
        # A typo in a variable is refused before anything runs (the rung could reboot the node).
        typo = play(fleet, "lc02", "quarantine", "gpufleet_reboot_timout_s=5")
        admin_drain(fleet, "lc02")
        return typo, play(fleet, "lc02", "release")

    def lemon_node():
        dry = play(fleet, "lc03", "quarantine", "lifecycle_dry_run=true")
        dry_state = (slurm(fleet, "lc03"), (fleet / "lc03" / "history").exists(), (fleet / "lc03" / "rma").exists())
        # The node's earlier fault, 2 days ago, repaired and returned: the new one makes it a lemon.
        with History(default_path(fleet / "lc03" / "history")) as history:
            then = time.time() - 2 * 86400
            for i, (state, actor) in enumerate((("quarantined", "audit"), ("validating", "operator:test"),
                                                ("healthy", "operator:test"))):
                lifecycle.transition(history, "lc03", state, "earlier fault", actor, code="XID_79", gpu="3",
                                     now=then + i)
        quarantine = play(fleet, "lc03", "quarantine", "lifecycle_code=XID_48", "lifecycle_gpu=0")
        return dry, dry_state, quarantine, play(fleet, "lc03", "repair"), play(fleet, "lc03", "release")

    def audited_node():
        # The preflight fails the node's pending remap; gpufleet_quarantine=critical quarantines it at the run's end.
        return play(fleet, "lc04", "-", "gpufleet_quarantine=critical", playbook="preflight")

    with ThreadPoolExecutor(4) as pool:
        remap, admin, lemon, audited = (f.result() for f in [pool.submit(remap_node), pool.submit(admin_node),
                                                             pool.submit(lemon_node), pool.submit(audited_node)])

    # lc01: one quarantine for two triggers, the bundle first, the drain with gpufleet's reason.
    both, quarantined, drained, (rc, out), returned, (repeat, repeat_state), again = remap
    assert [r[0] for r in both] == [0, 0], both[0][1][-3000:] + both[1][1][-3000:]
    assert [r["to_state"] for r in quarantined] == ["quarantined"], quarantined
    assert quarantined[0]["code"] == "ROW_REMAP_PENDING" and quarantined[0]["gpu"] == "2"
    bundles = list((fleet / "lc01" / "rma" / "lc01").glob("gpufleet-rma-*"))
    assert bundles and all((b / "manifest.json").exists() and (b / "history.json").exists() for b in bundles)
    assert drained["drain"] and drained["reason"] == "gpufleet: ROW_REMAP_PENDING 2", drained
    # The repair: the reset rung, the burn-in stages it names, healthy, resumed in Slurm.
    assert rc == 0, out[-5000:]
    after, after_slurm = returned
    assert [r["to_state"] for r in after] == ["quarantined", "repairing", "validating", "healthy"], after
    assert after[1]["evidence"][0] == "rung: gpu_reset" and after[3]["actor"] == "burn_in"
    assert json.loads((fleet / "state" / "lc01" / "resets.json").read_text()).get("2")
    assert after_slurm["drain"] is False
    # The repeat of the alert handled before the return changes nothing; a second XID after it quarantines again.
    (rc, out), (repeat_rows, repeat_slurm) = repeat, repeat_state
    assert rc == 0 and "not quarantined" in out and "its fault is already handled" in out, out[-3000:]
    assert repeat_rows == after and repeat_slurm["drain"] is False
    assert again[0] == 0, again[1][-3000:]
    new = rows(fleet, "lc01")[len(after):]  # its second quarantine in 7 days: a lemon, out for RMA
    assert [r["to_state"] for r in new] == ["quarantined", "lemon", "rma"], new
    assert (new[0]["actor"], new[0]["code"], new[0]["gpu"]) == ("alert", "XID_79", "2")
    assert slurm(fleet, "lc01")["reason"] == "gpufleet: XID_79 2"
    report = json.loads((fleet / "lc01" / "latest" / "report.json").read_text())
    assert report["playbook"] == "burn_in" and [n["verdict"] for n in report["nodes"]] == ["pass"]

    # lc02: the typo refused before anything was recorded; drained by an admin; release refuses and leaves their
    # drain as it is.
    (typo_rc, typo_out), (rc, out) = admin
    assert typo_rc == 2 and "did you mean gpufleet_reboot_timeout_s" in typo_out, typo_out[-3000:]
    assert "refusing to start" in typo_out and "RMA evidence bundle" not in typo_out
    assert rc != 0 and "gpufleet resumes only its own drains" in out, out[-3000:]
    admin_drained = slurm(fleet, "lc02")
    assert admin_drained["drain"] and admin_drained["reason"] == "bad dimm, see INC-4711", admin_drained
    assert admin_drained["reason_user"] == "ana"

    # lc03: the dry run changed nothing; the second quarantine in 7 days is a lemon, out for RMA.
    (rc, out), dry_state, quarantine, repair, release = lemon
    assert rc == 0 and "DRY RUN" in out and "state=drain" in out, out[-3000:]
    assert dry_state == (None, False, False)
    assert quarantine[0] == 0 and "LEMON" in quarantine[1], quarantine[1][-3000:]
    assert [r["to_state"] for r in rows(fleet, "lc03")][-3:] == ["quarantined", "lemon", "rma"]
    # drained for the new fault, not the earlier one it was returned from
    assert slurm(fleet, "lc03")["reason"] == "gpufleet: XID_48 0", slurm(fleet, "lc03")
    assert repair[0] != 0 and "out for RMA" in repair[1]
    assert release[0] != 0 and "no preflight or burn-in passed since it was quarantined" in release[1]
    assert slurm(fleet, "lc03")["drain"] is True

    # lc04: the preflight's report failed it with a finding the ladder knows: quarantined by the run, drained.
    rc, out = audited
    assert rc != 0 and "healthy -> quarantined" in out, out[-3000:]
    report = json.loads((fleet / "lc04" / "latest" / "report.json").read_text())
    assert [(n["host"], n["verdict"]) for n in report["nodes"]] == [("lc04", "fail")]
    [row] = rows(fleet, "lc04")
    assert (row["to_state"], row["actor"], row["code"], row["gpu"]) == ("quarantined", "preflight",
                                                                        "ROW_REMAP_PENDING", "2")
    assert report["run_id"] in row["reason"] and slurm(fleet, "lc04")["reason"] == "gpufleet: ROW_REMAP_PENDING 2"
