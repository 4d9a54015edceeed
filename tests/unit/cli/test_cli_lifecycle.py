"""gpufleet quarantine|repair|release NODE: usage errors name the option and exit 2 before any work; a valid command
runs kentino.gpufleet.lifecycle through gpufleet run's runner with the request as variables, the user's -e last."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
for _name in [m for m in sys.modules if m == "gpufleet_cli" or m.startswith("gpufleet_cli.")]:
    del sys.modules[_name]
from gpufleet_cli import main as cli  # noqa: E402


@pytest.mark.parametrize("argv, option", [
    (["quarantine", "gpu01;reboot"], "argument node"),
    (["quarantine", "gpu01", "--reason", "two\nlines"], "argument --reason"),
    (["quarantine", "gpu01", "--code", "xid 79"], "argument --code"),
    (["quarantine", "gpu01", "--gpu", "../0"], "argument --gpu"),
    (["release", "gpu01", "--code", "XID_79"], "unrecognized arguments: --code"),
    (["repair", "gpu01", "--reason", "x"], "unrecognized arguments: --reason"),
    (["repair"], "node"),
])
def test_a_bad_request_is_a_usage_error_naming_the_option(capsys, monkeypatch, argv, option):
    monkeypatch.setattr(cli, "cmd_run", lambda args: pytest.fail("ran the playbook on a bad request"))
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2 and option in capsys.readouterr().err


def test_the_request_reaches_the_lifecycle_playbook(monkeypatch):
    seen = {}

    def fake_run(args):
        seen.update(playbook=args.playbook, limit=args.limit, extra=cli.parse_extra(args.extra_vars))
        return 2

    monkeypatch.setattr(cli, "cmd_run", fake_run)
    rc = cli.main(["quarantine", "gpu01", "--reason", "XID 79 on GPU 3", "--code", "XID_79", "--gpu", "3",
                   "--dry-run", "-e", "lifecycle_dcgm_level=1"])
    assert rc == 2 and seen["playbook"] == "lifecycle" and seen["limit"] is None
    extra = seen["extra"]
    assert extra.pop("lifecycle_actor").startswith("operator:")
    assert extra == {"lifecycle_action": "quarantine", "lifecycle_node": "gpu01", "lifecycle_dry_run": True,
                     "lifecycle_reason": "XID 79 on GPU 3", "lifecycle_code": "XID_79", "lifecycle_gpu": "3",
                     "lifecycle_dcgm_level": 1}
    assert json.dumps(extra)  # plain data, as ansible-runner's extravars
