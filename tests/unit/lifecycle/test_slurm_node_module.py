"""The slurm_node module as Ansible runs it, with stand-in scontrol and sinfo that print Slurm's formats
(tests/fixtures/slurm) and log the argv they were given: the dry run changes nothing, a foreign drain is never
resumed, a dead controller is a named failure."""

from pathlib import Path

from helpers.module_runner import run_module

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
STANDIN = """#!/bin/sh
echo "$(basename "$0") $*" >> "$SLURM_LOG"
case "$(basename "$0") $1" in
  "scontrol show") cat "$SLURM_SHOW"; exit "${SLURM_RC:-0}" ;;
  "sinfo -h") echo "${SLURM_SINFO:-drained}" ;;
  *) exit 0 ;;
esac
"""


def _bin(tmp_path):
    for tool in ("scontrol", "sinfo", "scancel"):
        path = tmp_path / tool
        path.write_text(STANDIN)
        path.chmod(0o755)
    return tmp_path


def _run(tmp_path, show, args, check_mode=False, rc=0, to_stderr=False):
    log = tmp_path / "log"
    log.write_text("")
    shown = tmp_path / "shown"
    shown.write_text((FIXTURES / show).read_text())
    env = {"SLURM_LOG": log, "SLURM_SHOW": shown, "SLURM_RC": rc}
    result = run_module("slurm_node", dict(args, bin_dir=str(_bin(tmp_path))), env=env, check_mode=check_mode)
    return result, log.read_text().splitlines()


def test_the_dry_run_drains_nothing_and_says_what_it_would_run(tmp_path):
    result, log = _run(tmp_path, "idle.txt", {"name": "gpu01", "state": "drained", "code": "XID_CRITICAL",
                                             "gpu": "0000:3b:00", "detail": "XID 79"}, check_mode=True)
    assert not result.get("failed") and result["changed"] is False and result["action"] == "drain"
    assert result["steps"][-1] == {"argv": [str(tmp_path / "scontrol"), "update", "nodename=gpu01", "state=drain",
                                            "reason=gpufleet: XID_CRITICAL 0000:3b:00 XID 79"], "run": False}
    assert log == ["scontrol show node -o gpu01"]
    result, log = _run(tmp_path, "idle.txt", {"name": "gpu01", "state": "drained", "code": "XID_CRITICAL"})
    assert result["changed"] is True and log[-1] == "scontrol update nodename=gpu01 state=drain " \
                                                    "reason=gpufleet: XID_CRITICAL"


def test_a_foreign_drain_is_not_resumed_and_a_dead_controller_is_named(tmp_path):
    result, log = _run(tmp_path, "allocated_drain_foreign.txt", {"name": "gpu01", "state": "resumed"})
    assert result["failed"] and result["slurm_state"] == "foreign_drain" and "bad dimm" in result["msg"]
    assert not any("update" in line for line in log)
    result, log = _run(tmp_path, "err_controller_down.txt", {"name": "gpu01", "state": "resumed"}, rc=1)
    assert result["failed"] and result["slurm_state"] == "controller_down" and "start slurmctld" in result["msg"]
    result, _log = _run(tmp_path, "idle_drain_owned.txt", {"name": "gpu01", "state": "resumed"})
    assert result["action"] == "resume" and result["changed"] is True
