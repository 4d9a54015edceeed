"""A pair test's answer from its task result: a figure only from a test that ran to its end; every other outcome
(unreachable, a hang killed by the timeout, mpirun unable to reach the partner) an error naming what happened."""

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.fabric import pair_test

NODES = ["n1", "n2"]
TOOL = {"argv": ["mpirun", "-np", "16", "-H", "n1:8,n2:8", "all_reduce_perf"], "rc": 0, "timed_out": False,
        "duration_s": 3.0, "error": None}


def test_a_test_that_ran_gives_its_figure():
    got = pair_test.answer(NODES, {"tool": TOOL, "peak_busbw_gbps": 45.2, "failures": [], "evidence": ["row"]})
    assert got["busbw_gbps"] == 45.2 and got["error"] is None


def test_an_unreachable_launching_node_is_an_error_naming_it():
    got = pair_test.answer(NODES, {"unreachable": True, "msg": "Failed to connect to the host via ssh: No route"})
    assert got["busbw_gbps"] is None
    assert got["error"].startswith("n1, the node that launches the test, is unreachable: Failed to connect")


def test_a_hung_test_killed_at_its_timeout_is_an_error():
    got = pair_test.answer(NODES, {"tool": dict(TOOL, timed_out=True, rc=None, duration_s=10.0),
                                   "output_tail": ["#  size  count"]})
    assert got["busbw_gbps"] is None and "did not finish within its timeout (10.0s)" in got["error"]


def test_mpirun_unable_to_reach_the_partner_is_an_error_with_its_own_words():
    got = pair_test.answer(NODES, {"tool": dict(TOOL, rc=1), "failures": [], "reasons": ["no result rows"],
                                   "unparsed": {"count": 3, "samples": [
                                       "ssh: connect to host n2 port 22: No route to host", "-" * 74,
                                       "ORTE was unable to reliably start one or more daemons."]}})
    assert got["error"] == "rc=1: ssh: connect to host n2 port 22: No route to host"
    assert "ORTE was unable to reliably start one or more daemons." in got["evidence"]


def test_a_figure_with_a_failure_line_is_no_figure():
    got = pair_test.answer(NODES, {"tool": dict(TOOL, rc=1), "peak_busbw_gbps": 45.0,
                                   "failures": ["n1: Test NCCL failure common.cu:1006 'remote process exited'"]})
    assert got["busbw_gbps"] is None and "Test NCCL failure" in got["error"]


def test_answers_join_launches_and_polls_by_the_pair_never_by_position():
    plan = [{"nodes": ["n1", "n2"], "launch_from": "n1"}, {"nodes": ["n3", "n4"], "launch_from": "n3"}]
    launched = [{"item": plan[0], "ansible_job_id": "j1"}, {"item": plan[1], "unreachable": True, "msg": "gone"}]
    finished = [{"item": launched[0], "tool": TOOL, "peak_busbw_gbps": 44.0, "failures": []}]
    got = dict((tuple(a["nodes"]), a) for a in pair_test.answers(launched, finished))
    assert got[("n1", "n2")]["busbw_gbps"] == 44.0 and "unreachable" in got[("n3", "n4")]["error"]


def test_bad_mpirun_names_ranks_and_timeouts_are_refused_naming_the_host():
    errors = pair_test.host_errors({"n1": "n1", "n2": "n2;reboot"}, {"n1": 8, "n2": 0}, {"n1": 5, "n2": 60})
    assert [e.split(":")[0] for e in errors] == ["host n2", "host n2", "host n1"]
    assert "gpufleet_fabric_mpi_host='n2;reboot'" in errors[0]


def test_mpirun_arguments_environment_and_sizes_are_checked_whole_naming_the_host():
    rsh = "-i /root/.ssh/id_fabric -o StrictHostKeyChecking=no -o ConnectTimeout=5"
    good = {"n1": ["--mca", "plm_rsh_args", rsh, "--mca", "btl_tcp_if_include", "eth0"]}
    assert pair_test.host_errors({"n1": "n1"}, {"n1": 8}, {"n1": 60}, good, {"n1": {"NCCL_IB_HCA": "mlx5_0:1"}},
                                 {"n1": ("8M", "1G")}) == []
    bad = pair_test.host_errors(
        {"n1": "n1", "n2": "n2"}, {"n1": 8, "n2": 8}, {"n1": 60, "n2": 60},
        {"n1": ["--mca", "plm_rsh_args", "-o ProxyCommand=$(reboot)"], "n2": "--allow-run-as-root"},
        {"n1": {"NCCL_DEBUG": "WARN\nX=1"}, "n2": {"1BAD": "x"}}, {"n1": ("8M", "1G;"), "n2": ("8M", "1G")})
    assert [e.split(":")[0] for e in bad] == ["host n1", "host n2", "host n1", "host n2", "host n1"]
    assert "gpufleet_fabric_mpirun_args item '-o ProxyCommand=$(reboot)'" in bad[0]
    assert "must be a list" in bad[1] and "'NCCL_DEBUG'" in bad[2] and "'1BAD'" in bad[3]
    assert "gpufleet_fabric_max_bytes='1G;'" in bad[4]


def test_a_launch_carries_the_launching_nodes_settings_and_runs_as_root_under_open_mpi():
    got = pair_test.launch(("n1", "n2"), {"n1": "10.0.0.1", "n2": "n2"}, {"n1": 1, "n2": 1}, {"n1": 60, "n2": 90},
                           {"n1": ["--mca", "btl", "tcp,self"], "n2": ["--never-used"]}, {"n1": {"A": 1}},
                           {"n1": ("1M", "8M"), "n2": ("8", "8")})
    assert got["launcher_args"] == ["--allow-run-as-root", "-H", "10.0.0.1:1,n2:1", "--mca", "btl", "tcp,self"]
    assert (got["np"], got["timeout_s"], got["env"], got["min_bytes"], got["max_bytes"]) == (2, 60, {"A": "1"},
                                                                                              "1M", "8M")


def test_a_test_that_could_not_start_names_the_launching_node_and_the_fix():
    tool = {"argv": ["mpirun", "-np", "2"], "rc": None, "timed_out": False, "duration_s": None,
            "error": "mpirun not found: install Open MPI (openmpi-bin) or use launcher=none"}
    got = pair_test.answer(NODES, {"tool": tool, "verdict": "error", "reasons": ["mpirun not found"]})
    assert got["busbw_gbps"] is None
    assert got["error"] == ("on n1, the node that launches the test: mpirun not found: install Open MPI "
                            "(openmpi-bin) or use launcher=none")


def test_an_open_mpi_warning_is_evidence_never_the_headline_of_the_error():
    # What Debian's Open MPI 4.1 printed when the partner was killed during the test (tests/fleet/test_fabric_mpirun.py).
    said = ["[node3:00146] plm:rsh: Warning: setpgid(150,150) failed in parent with errno=Permission denied(13)",
            "Connection to node1 closed by remote host.", "-" * 74,
            "ORTE was unable to reliably start one or more daemons."]
    got = pair_test.answer(NODES, {"tool": dict(TOOL, rc=255), "failures": [], "reasons": ["no result rows"],
                                   "unparsed": {"count": 4, "samples": said}})
    assert got["error"] == "rc=255: Connection to node1 closed by remote host."
    assert said[0] in got["evidence"] and said[3] in got["evidence"]
