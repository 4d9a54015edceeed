"""The checks made before a run touches any node (plugins/plugin_utils/run_guard.py)."""

import json
import os
import subprocess

from ansible_collections.kentino.gpufleet.plugins.plugin_utils import run_guard


def test_a_typo_is_named_with_the_closest_known_names():
    errors = run_guard.unknown_variables("n1", {"gpufleet_burn_duraton_s": 60, "gpufleet_burn_duration_s": 60})
    assert len(errors) == 1 and "did you mean gpufleet_burn_duration_s" in errors[0] and "host n1" in errors[0]


def test_runtime_names_simulator_names_and_a_sites_own_names_are_accepted():
    values = {"gpufleet_result_gpu_burn": {}, "gpufleet_sim_scenario": "x", "gpufleet_stages": {"n1": "burn"},
              "gpufleet_rack": "r12"}
    assert run_guard.unknown_variables("n1", values)[0].startswith("host n1: unknown variable gpufleet_rack")
    assert run_guard.unknown_variables("n1", values, run_guard.known_names() | {"gpufleet_rack"}) == []


def test_types_from_the_role_spec_and_the_thresholds():
    errors = run_guard.type_errors("n1", {"gpufleet_burn_enabled": "maybe", "gpufleet_temp_max_c": "85C",
                                          "gpufleet_force": "no", "gpufleet_burn_duration_s": "600"})
    assert len(errors) == 2, errors
    assert any("gpufleet_burn_enabled" in e for e in errors) and any("gpufleet_temp_max_c" in e for e in errors)


def test_run_ids_are_unique_within_one_second():
    ids = {run_guard.new_run_id() for _ in range(200)}
    assert len(ids) == 200


def test_the_reports_directory_must_be_writable(tmp_path):
    assert run_guard.check_report_dir(str(tmp_path / "new" / "reports")) is None
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "cannot create" in run_guard.check_report_dir(str(blocker / "reports"))


def test_a_live_runs_lock_refuses_and_a_stale_one_is_replaced(tmp_path):
    live = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / run_guard.LOCK_NAME).write_text(json.dumps({"pid": live.pid, "run_id": "other", "playbook": "x"}))
        # A live process that is not ansible is not a run: its lock is stale.
        path, held = run_guard.take_lock(str(tmp_path), "mine", os.getpid(), "burn_in")
        assert held is None and json.loads((tmp_path / run_guard.LOCK_NAME).read_text())["run_id"] == "mine"
    finally:
        live.kill()
        live.wait()
    # Our own process tree runs pytest (not ansible): simulate an ansible-playbook holder by the lock's pid check.
    (tmp_path / run_guard.LOCK_NAME).write_text(json.dumps({"pid": 999999, "run_id": "gone"}))
    path, held = run_guard.take_lock(str(tmp_path), "mine2", os.getpid(), "burn_in")
    assert held is None
    run_guard.release_lock(str(tmp_path), "someone-else")
    assert (tmp_path / run_guard.LOCK_NAME).exists()
    run_guard.release_lock(str(tmp_path), "mine2")
    assert not (tmp_path / run_guard.LOCK_NAME).exists()


def test_one_list_wrong_choices_and_ranges_are_refused():
    """The role's argument spec is the one list (names, types, choices, ranges): on main gpufleet_fail_on=sometimes
    ran the whole burn-in and then wrote no report, and a burn of -5 s or a lease of 0 s reached the nodes."""
    cases = {"gpufleet_fail_on": "sometimes", "gpufleet_burn_duration_s": -5, "gpufleet_sample_interval_s": -1,
             "gpufleet_lease_timeout_s": 0, "gpufleet_history_days": 0}
    for name, value in cases.items():
        errors = run_guard.type_errors("n1", {name: value})
        assert len(errors) == 1 and name in errors[0] and "host n1" in errors[0], (name, errors)
    assert "must be at least 1" in run_guard.type_errors("n1", {"gpufleet_burn_duration_s": 0})[0]
    assert run_guard.type_errors("n1", {"gpufleet_burn_duration_s": "600", "gpufleet_fail_on": "warn",
                                        "gpufleet_lease_timeout_s": 10}) == []
    # A threshold of a valid kind is held to its spec's range too (an int threshold's kind only says >= 0).
    for name, value in {"gpufleet_fabric_accuse_partners": 1, "gpufleet_ib_expected_width": 0}.items():
        errors = run_guard.type_errors("n1", {name: value})
        assert len(errors) == 1 and "%s is %s, must be at least" % (name, value) in errors[0], (name, errors)
    assert run_guard.type_errors("n1", {"gpufleet_fabric_accuse_partners": "3"}) == []
    from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import GATE_VERDICTS

    assert run_guard.role_spec()["gpufleet_fail_on"]["choices"] == list(GATE_VERDICTS), "the gate's one table"


def test_a_message_size_is_checked_whole_before_the_run():
    """A typo in gpufleet_nccl_max_bytes used to surface only at the NCCL stage, after the burn: the spec's "Format:"
    line makes the run guard refuse it first, with the pattern the node's check and the fabric pair tests use."""
    names = ("gpufleet_nccl_min_bytes", "gpufleet_nccl_max_bytes", "gpufleet_preflight_nccl_max_bytes",
             "gpufleet_fabric_min_bytes", "gpufleet_fabric_max_bytes")
    assert set(names) <= set(run_guard.formats())
    for name in names:
        for bad in ("lots", "1G\n", "1 G", "-8", "1T", ""):
            errors = run_guard.type_errors("n1", {name: bad})
            assert len(errors) == 1 and "host n1: %s=%r is not a byte count" % (name, bad) in errors[0], (name, errors)
        assert run_guard.type_errors("n1", {name: "128M"}) == []
    assert run_guard.type_errors("n1", {"gpufleet_nccl_max_bytes": 1024}) == []  # a number is a byte count too


def test_a_format_line_the_guard_does_not_know_is_an_error():
    spec = {"gpufleet_x": {"type": "str", "description": ["X.", "Format: a colour."]}}
    try:
        run_guard.formats(spec)
    except ValueError as exc:
        assert "gpufleet_x" in str(exc) and "a byte count" in str(exc)
    else:
        raise AssertionError("an unknown Format: line was accepted")


def test_every_variable_the_playbooks_and_the_role_read_is_in_the_one_list():
    """Every gpufleet_* name a playbook or the role's tasks read is known (the spec, or set by the run itself, which
    run_guard reads from the tasks and the modules' documentation): nothing is listed twice by hand."""
    import re
    from pathlib import Path

    repo = Path(run_guard.COLLECTION)
    # roles and inventory groups are named gpufleet_* too: they are not variables
    known = run_guard.known_names() | {p.name for p in repo.glob("roles/*")} | {"gpufleet_nodes", "gpufleet_sim"}
    used = set()
    for path in list(repo.glob("playbooks/*.yml")) + list(repo.glob("roles/gpufleet/**/*.yml")):
        used.update(re.findall(r"\b(gpufleet_[a-z0-9_]+)\b", path.read_text()))
    unknown = sorted(n for n in used if n not in known and not n.startswith(run_guard.RUNTIME_PREFIXES)
                     and not n.endswith("_"))
    assert not unknown, unknown
    assert not hasattr(run_guard, "PLAYBOOK_VARS") and not hasattr(run_guard, "RUNTIME_VARS")


def test_what_the_controllers_configuration_lacks_is_named_with_its_fix():
    assert run_guard.controller_config_warnings(["kentino.gpufleet.run_record"], 64, 9) == []
    missing = run_guard.controller_config_warnings([], 5, 9)
    assert len(missing) == 2
    assert "kentino.gpufleet.run_record is not enabled" in missing[0] and "callbacks_enabled =" in missing[0]
    assert "forks is 5 for 9 nodes" in missing[1] and "2 rounds" in missing[1] and "forks = 9" in missing[1]
    assert all("inventories/example/ansible.cfg" in m for m in missing)
    assert run_guard.controller_config_warnings(["kentino.gpufleet.run_record"], 9, 9) == []


def test_ssh_connections_that_close_before_the_next_poll_are_named_with_the_fix():
    assert [run_guard.control_persist_s(a) for a in (
        "-C -o ControlMaster=auto -o ControlPersist=60s", "-o ControlPersist=300", "-oControlPersist=1m30s",
        "-o ControlPersist yes", "-o ControlPersist=0", "-o ControlPersist=no", "-F ssh_config", "", None,
        "-o ControlPersist=5x")] == [60, 300, 90, None, None, 0, None, None, None, None]
    nodes = [("n%d" % i, "-C -o ControlMaster=auto -o ControlPersist=60s", 120) for i in range(7)]
    nodes += [("slow", "-o ControlPersist=300s", 600), ("ok", "-o ControlPersist=300s", 120),
              ("own", "-F ssh_config", 120)]
    warnings = run_guard.ssh_persist_warnings(nodes)
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("SSH connections close 60 s after their last use") and "120 s later on n0, n1, " \
        "n2, n3, n4 and 2 more" in warnings[0] and "ControlPersist=300s" in warnings[0]
    assert "300 s after" in warnings[1] and "600 s later on slow:" in warnings[1] and "ControlPersist=660s" in \
        warnings[1] and "inventories/example/ansible.cfg" in warnings[1]
    assert run_guard.ssh_persist_warnings(nodes[-2:]) == []
    # The same line whatever order the hosts came in (forks finish in any order; warnings and refusals alike).
    assert run_guard.ssh_persist_warnings(nodes[6::-1]) == warnings[:1]


def test_many_hosts_are_named_in_order_and_counted_past_five():
    assert run_guard.hosts_text(["n3", "n1", "n2"]) == "n1, n2, n3"
    assert run_guard.hosts_text(["g", "f", "e", "d", "c", "b", "a"]) == "a, b, c, d, e and 2 more"


def test_a_new_relative_reports_directory_is_said_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    note = run_guard.new_reports_note("reports")
    assert note and str(tmp_path / "reports") in note and "absolute path" in note
    assert run_guard.new_reports_note(str(tmp_path / "reports")) is None  # an absolute directory was chosen
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "latest").symlink_to("20261201T000000Z-abcdef")  # an earlier run's
    assert run_guard.new_reports_note("reports") is None


def test_controller_paths_may_be_relative_node_paths_may_not():
    """The example inventory's gpufleet_report_dir: reports is relative to where the run starts; a node's path is not."""
    assert run_guard.type_errors("n1", {"gpufleet_report_dir": "reports", "gpufleet_history_dir": "reports/history"}) == []
    for value in ("../reports", "reports/", "reports//x", "rep\norts"):
        errors = run_guard.type_errors("n1", {"gpufleet_report_dir": value})
        assert len(errors) == 1 and "not a normalised path" in errors[0], (value, errors)
    errors = run_guard.type_errors("n1", {"gpufleet_checkpoint_path": "ckpt"})
    assert len(errors) == 1 and "not an absolute, normalised path" in errors[0]
