"""The per-rail ib_write_bw of a fabric pair: the node side (server and client with a bounded connect retry, a hung
rail killed at its timeout, a missing binary named with its fix, every name checked whole) and the controller side
(which rails a pair runs, and each rail's answer from both sides' results)."""

import time
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import ib_rail_test
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.fabric import pair_test
from helpers.module_runner import run_module

STANDIN = Path(__file__).resolve().parents[3] / "sim" / "bin" / "ib_write_bw"
ROW = ("echo ' #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]'\n"
       "echo ' 65536      5000             392.41             %s\t\t   0.748465'\n")


def tool(tmp_path, body):
    path = tmp_path / "ib_write_bw"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("hca", ["mlx5_0;reboot", "mlx5_0\n", "", "0mlx5", "mlx5 0", "../mlx5_0", None])
def test_a_device_name_that_is_not_clean_is_refused_whole(hca):
    assert ib_rail_test.option_errors([hca], "node02", 18515, 60, 10)


@pytest.mark.parametrize("server", ["node02;id", "-oProxyCommand=x", "node 02", "node02\n"])
def test_a_server_name_that_is_not_clean_is_refused(server):
    assert ib_rail_test.option_errors(["mlx5_0"], server, 18515, 60, 10)


def test_clean_names_and_ports_in_range_pass():
    assert ib_rail_test.option_errors(["mlx5_0", "mlx5_bond_0", "ibp12s0"], "node02.dc1", 18515, 60, 10) == []
    assert ib_rail_test.option_errors(["mlx5_0", "mlx5_1"], None, 65535, 60, 10)  # the second rail's port is over


def test_the_client_retries_a_server_not_listening_yet_then_reads_the_rail(tmp_path):
    seen = tmp_path / "tries"
    exe = tool(tmp_path, "echo x >> %s\nif [ $(wc -l < %s) -lt 3 ]; then echo \"Couldn't connect to $6:$4\" >&2; "
                         "exit 1; fi\n%s" % (seen, seen, ROW % "391.50"))
    rails = ib_rail_test.run_client(exe, ["mlx5_3"], "node02", 18515, 30, 10, "node01")
    assert seen.read_text().count("x") == 3
    assert rails[0]["gbps"] == 391.5 and rails[0]["error"] is None
    assert rails[0]["evidence"][0] == "on node01: %s -d mlx5_3 -p 18515 --report_gbits node02" % exe


def test_the_client_gives_up_on_a_server_that_never_listens_after_its_connect_timeout(tmp_path):
    exe = tool(tmp_path, "echo \"Couldn't connect to $6:$4\" >&2\necho ' Unable to init the socket connection' >&2\n"
                         "exit 1\n")
    started = time.monotonic()
    rails = ib_rail_test.run_client(exe, ["mlx5_0", "mlx5_1"], "node02", 18515, 60, 2, "node01")
    assert time.monotonic() - started < 20
    assert [r["gbps"] for r in rails] == [None, None]
    assert "Couldn't connect to node02:18516" in rails[1]["error"]  # each rail on its own port


def test_a_hung_rail_test_is_killed_at_its_timeout(tmp_path):
    exe = tool(tmp_path, "sleep 600\n")
    started = time.monotonic()
    rails = ib_rail_test.run_client(exe, ["mlx5_0"], "node02", 18515, 1, 1, "node01")
    servers = ib_rail_test.run_server(exe, ["mlx5_0"], 18515, 1, "node02")
    assert time.monotonic() - started < 30
    assert "ib_write_bw on node01 did not finish within" in rails[0]["error"]
    assert "ib_write_bw on node02 did not finish within" in servers[0]["error"]


def test_a_missing_binary_names_the_node_and_the_fix():
    rails = ib_rail_test.run_client(None, ["mlx5_0"], "node02", 18515, 10, 1, "node01")
    servers = ib_rail_test.run_server(None, ["mlx5_0"], 18515, 10, "node02")
    assert rails[0]["error"].startswith("ib_write_bw not found on node01: install perftest")
    assert servers[0]["error"].startswith("ib_write_bw not found on node02: install perftest")


def test_the_server_runs_one_listener_per_rail_on_its_own_port(tmp_path):
    exe = tool(tmp_path, "echo \"$@\" >> %s\n" % (tmp_path / "argv"))
    servers = ib_rail_test.run_server(exe, ["mlx5_0", "mlx5_1"], 18515, 10, "node02")
    assert [s["error"] for s in servers] == [None, None]
    assert sorted((tmp_path / "argv").read_text().splitlines()) == [
        "-d mlx5_0 -p 18515 --report_gbits", "-d mlx5_1 -p 18516 --report_gbits"]


def ib_result(host, hcas, **extra):
    return dict({"item": host, "ports": [{"hca": h, "port": 1} for h in hcas], "not_run": None}, **extra)


def test_the_hcas_of_each_node_from_its_ports_read():
    found = pair_test.hcas_found([
        ib_result("a", ["mlx5_10", "mlx5_2", "mlx5_2"]),
        ib_result("b", [], not_run="no InfiniBand: /sys/class/infiniband has no HCA"),
        ib_result("c", ["mlx5_0"], unreachable=True),
        ib_result("d", ["mlx5_0", "mlx5_1;id"])])
    assert found == {"a": ["mlx5_2", "mlx5_10"], "b": [], "c": [], "d": ["mlx5_0"]}


def test_a_pair_runs_the_rails_both_nodes_have_and_none_without_infiniband():
    hosts = {"a": "a", "b": "b.dc", "c": "c"}
    hcas = {"a": ["mlx5_0", "mlx5_1"], "b": ["mlx5_1", "mlx5_0"], "c": []}
    plan = pair_test.rail_plan(("a", "b"), hosts, hcas, {})
    assert plan == {"client": "a", "server": "b", "server_host": "b.dc", "hcas": ["mlx5_0", "mlx5_1"],
                    "base_port": 18515, "timeout_s": pair_test.DEFAULT_RAIL_TIMEOUT_S,
                    "connect_timeout_s": pair_test.RAIL_CONNECT_S}
    assert pair_test.rail_plan(("a", "c"), hosts, hcas, {}) is None
    assert pair_test.rail_plan(("a", "b"), hosts, hcas, {"a": 10})["connect_timeout_s"] == 5


def launched(item, job=True):
    return {"item": item, "ansible_job_id": "j1", "started": 1, "finished": 0} if job else {"item": item}


def finished(item, rails=None, **extra):
    return dict({"item": launched(item), "finished": 1, "rails": rails}, **extra)


ITEM = {"nodes": ["a", "b"], "rails": {"client": "a", "server": "b", "hcas": ["mlx5_0", "mlx5_1"]}}


def test_each_rail_answers_with_the_client_s_figure_and_both_command_lines():
    servers = [launched(ITEM), finished(ITEM, [
        {"hca": h, "error": None, "evidence": ["on b: ib_write_bw -d %s" % h]} for h in ("mlx5_0", "mlx5_1")])]
    clients = [launched(ITEM), finished(ITEM, [
        {"hca": "mlx5_0", "gbps": 391.0, "error": None, "evidence": ["on a: ib_write_bw -d mlx5_0 b", "row"]},
        {"hca": "mlx5_1", "gbps": None, "error": "Completion with error at client", "evidence": ["on a: x"]}])]
    rails = pair_test.rail_answers([ITEM], servers, clients)[("a", "b")]
    assert rails[0] == {"hca": "mlx5_0", "gbps": 391.0, "error": None,
                        "evidence": ["on b: ib_write_bw -d mlx5_0", "on a: ib_write_bw -d mlx5_0 b", "row"]}
    assert rails[1]["gbps"] is None and rails[1]["error"] == "Completion with error at client"


def test_a_server_without_the_binary_is_the_cause_named_first():
    servers = [finished(ITEM, [{"hca": h, "error": "ib_write_bw not found on b: install perftest", "evidence": []}
                               for h in ("mlx5_0", "mlx5_1")])]
    clients = [finished(ITEM, [{"hca": h, "gbps": None, "error": "Couldn't connect to b:18515", "evidence": []}
                               for h in ("mlx5_0", "mlx5_1")])]
    rails = pair_test.rail_answers([ITEM], servers, clients)[("a", "b")]
    assert all(r["error"].startswith("ib_write_bw not found on b: install perftest; Couldn't") for r in rails)


def test_a_side_that_never_answered_is_every_rail_s_error():
    servers = [launched(ITEM, job=False) | {"unreachable": True, "msg": "ssh: connect to host b: No route"}]
    rails = pair_test.rail_answers([ITEM], servers, [])[("a", "b")]
    assert [r["gbps"] for r in rails] == [None, None]
    assert rails[0]["error"].startswith("b is unreachable: ssh: connect to host b")
    assert "the rail test gave no answer" in rails[0]["error"]
    assert pair_test.rail_answers([{"nodes": ["a", "c"], "rails": None}], [], []) == {}


def test_the_module_refuses_a_bad_device_name_before_running_anything(tmp_path):
    seen = tmp_path / "ran"
    exe = tool(tmp_path, "touch %s\n" % seen)
    result = run_module("ib_write_bw", {"role": "client", "hcas": ["mlx5_0", "mlx5_1;reboot"], "server": "node02",
                                        "executable": exe})
    assert result["failed"] and "'mlx5_1;reboot' is not an InfiniBand device name" in result["msg"]
    assert not seen.exists()


def test_the_module_measures_each_rail_with_the_sim_stand_in(tmp_path):
    fabric = tmp_path / "fabric.json"
    fabric.write_text('{"seed": 1, "noise": 0.0, "leaves": {"L1": ["n1", "n2"]}, '
                      '"faults": [{"kind": "slow_nic", "node": "n2", "rail": 1, "factor": 0.5}]}')
    env = {"GPUFLEET_SIM_STATE": str(tmp_path / "n1"), "GPUFLEET_SIM_NODE": "n1",
           "GPUFLEET_SIM_SCENARIO": "healthy_h100", "GPUFLEET_SIM_FABRIC": str(fabric)}
    result = run_module("ib_write_bw", {"role": "client", "hcas": ["mlx5_0", "mlx5_1"], "server": "n2", "node": "n1",
                                        "timeout": 30, "executable": str(STANDIN)}, env=env)
    assert [(r["hca"], r["gbps"], r["error"]) for r in result["rails"]] == [("mlx5_0", 392.0, None),
                                                                            ("mlx5_1", 196.0, None)]
    assert result["rails"][1]["evidence"][0] == "on n1: %s -d mlx5_1 -p 18516 --report_gbits n2" % STANDIN
