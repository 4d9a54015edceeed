"""kentino.gpufleet.nccl_test run as Ansible runs it, against stand-in all_reduce_perf / mpirun / nvidia-smi."""

import time

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_nccl
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import node_name
from helpers.module_runner import run_module

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
HOST = node_name()


def _fake_smi(standin, count):
    smi = standin("nvidia-smi")
    smi.path.write_text("#!/bin/sh\n" + "".join("echo %d\n" % i for i in range(count)))
    return smi


def test_defaults_use_every_visible_gpu(standin, contract):
    tool = standin("all_reduce_perf", "nccl", "h100_8gpu_ok.txt")
    _fake_smi(standin, 8)
    result = run_module("nccl_test", {}, env={"PATH": "%s:%s" % (tool.dir, SAFE_PATH)})
    assert result["verdict"] == "pass", result["reasons"]
    assert tool.argv == ["-b", "8", "-e", "1G", "-f", "2", "-g", "8"]
    assert result["peak_busbw_gbps"] == 377.71 and result["largest_size_bytes"] == 1 << 30
    assert len(result["rows"]) == 28 and result["wrong_values"] == 0 and len(result["gpus"]) == 8
    assert "_lines" not in result
    # No floor given: the H100 reference (370 GB/s) x 0.7 = 259 GB/s is the default, and 377.71 passes it.
    t = {"gpufleet_nccl_min_busbw_fraction": 0.7}
    assert contract("nccl_test", result, judge_nccl.judge, t) == []
    assert judge_nccl.figures(result, t)["min_busbw_gbps"] == 259.0


def test_env_reaches_the_tool_and_sets_the_gpu_count(standin):
    tool = standin("all_reduce_perf", "nccl", "h100_8gpu_ok.txt")
    args = {"executable": str(tool.path), "env": {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "WARN"},
            "max_bytes": "128M", "iterations": 5, "min_busbw_gbps": 100.0}
    result = run_module("nccl_test", args, env={"PATH": SAFE_PATH})
    assert tool.argv == ["-b", "8", "-e", "128M", "-f", "2", "-g", "2", "-n", "5"]
    assert tool.env["NCCL_DEBUG"] == "WARN" and tool.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert result["verdict"] == "pass"


def test_mpirun_launcher_and_bandwidth_floor(standin, contract):
    perf = standin("all_reduce_perf")
    mpirun = standin("mpirun", "nccl", "rtx5090_pcie_mpirun.txt")
    _fake_smi(standin, 8)
    args = {"launcher": "mpirun", "launcher_args": ["--allow-run-as-root"], "env": {"NCCL_P2P_LEVEL": "SYS"},
            "min_busbw_gbps": 50.0, "max_bytes": "4G"}
    result = run_module("nccl_test", args, env={"PATH": "%s:%s" % (perf.dir, SAFE_PATH)})
    assert mpirun.argv == ["-np", "8", "-x", "NCCL_P2P_LEVEL", "--allow-run-as-root", str(perf.path),
                           "-b", "8", "-e", "4G", "-f", "2", "-g", "1"]
    assert result["verdict"] == "fail" and not result.get("failed")
    assert "NCCL busbw 28.0 GB/s < 50.0 GB/s at 4 GiB" in result["reasons"][0]
    assert result["foreign_lines_in_table"] == 4 and result["avg_busbw_gbps"] == 12.1727
    findings = contract("nccl_test", result, judge_nccl.judge, {"gpufleet_nccl_min_busbw_gbps": 50.0})
    assert [f["code"] for f in findings] == ["NCCL_BUSBW_LOW"]


def test_floor_options_reach_the_judge(standin, contract):
    tool = standin("all_reduce_perf", "nccl", "h100_8gpu_ok.txt")
    base = {"executable": str(tool.path), "gpus": 8}
    # The H100 reference x 0.9 = 333 GB/s still passes; a site reference of 500 GB/s x 0.9 = 450 does not.
    result = run_module("nccl_test", dict(base, min_busbw_fraction=0.9))
    assert result["verdict"] == "pass", result["reasons"]
    result = run_module("nccl_test", dict(base, min_busbw_fraction=0.9, reference_busbw_gbps={"H100": 500}))
    assert result["verdict"] == "fail" and "< 450.0 GB/s" in result["reasons"][0]
    t = {"gpufleet_nccl_min_busbw_fraction": 0.9, "gpufleet_nccl_reference_busbw_gbps": {"H100": 500.0}}
    assert [f["code"] for f in contract("nccl_test", result, judge_nccl.judge, t)] == ["NCCL_BUSBW_LOW"]
    bad = run_module("nccl_test", dict(base, min_busbw_fraction=1.5))
    assert bad.get("failed") and "min_busbw_fraction" in bad["msg"] and tool.ran


def test_failure_lines_and_exit_code(standin):
    tool = standin("all_reduce_perf", "nccl", "cuda_failure.txt", rc=1)
    result = run_module("nccl_test", {"executable": str(tool.path), "gpus_per_process": 8})
    assert result["verdict"] == "fail" and "Test CUDA failure" in result["reasons"][0]
    assert result["failures"] and result["tool"]["rc"] == 1


def test_deprecated_alias_gpus_still_sets_gpus_per_process(standin):
    tool = standin("all_reduce_perf", "nccl", "h100_8gpu_ok.txt")
    result = run_module("nccl_test", {"executable": str(tool.path), "gpus": 4})
    assert result["verdict"] == "pass", result
    assert tool.argv[tool.argv.index("-g") + 1] == "4"


def test_shell_metacharacters_are_one_argv_element(standin, tmp_path):
    tool = standin("all_reduce_perf", "nccl", "h100_8gpu_ok.txt")
    pwned = tmp_path / "pwned"
    evil = "; touch %s" % pwned
    result = run_module("nccl_test", {"executable": str(tool.path), "gpus_per_process": 8, "extra_args": ["-c", "1", evil],
                                      "env": {"NCCL_DEBUG": "WARN" + evil}})
    assert result["verdict"] == "pass"
    assert tool.argv[-3:] == ["-c", "1", evil]
    assert tool.env["NCCL_DEBUG"] == "WARN" + evil
    assert not pwned.exists()


def test_invalid_size_is_refused_before_anything_runs(standin, tmp_path):
    tool = standin("all_reduce_perf", "nccl", "h100_8gpu_ok.txt")
    result = run_module("nccl_test", {"executable": str(tool.path), "gpus_per_process": 1, "max_bytes": "1G; reboot"})
    assert result.get("failed") and "max_bytes must be" in result["msg"] and not tool.ran


def test_missing_tool(tmp_path):
    result = run_module("nccl_test", {"gpus_per_process": 2}, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "error" and not result.get("failed")
    assert result["reasons"] == ["%s: nccl_test could not run: all_reduce_perf not found: install it with the "
                                 "kentino.gpufleet.validation_tools role or pass executable=" % HOST]


def test_no_gpu_count_without_nvidia_smi(standin):
    tool = standin("all_reduce_perf", "nccl", "h100_8gpu_ok.txt")
    result = run_module("nccl_test", {"executable": str(tool.path)}, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "error" and "pass gpus_per_process=" in result["reasons"][0] and not tool.ran


def test_timeout_kills_every_process(hanging_tool, no_leftovers):
    path = hanging_tool("all_reduce_perf", "# nThread 1 nGpus 8 minBytes 8 maxBytes 1073741824")
    started = time.monotonic()
    result = run_module("nccl_test", {"executable": str(path), "gpus_per_process": 8, "timeout": 1}, timeout=60)
    assert time.monotonic() - started < 20
    assert result["verdict"] == "error" and "nccl_test timed out" in result["reasons"][0]
    assert any("nThread" in line for line in result["evidence"]), "the last output shows where it hung"
    no_leftovers()


def test_garbage_output(standin):
    tool = standin("all_reduce_perf", "nccl", "garbage.txt", rc=126)
    result = run_module("nccl_test", {"executable": str(tool.path), "gpus": 1})
    assert result["verdict"] == "error" and "no result rows" in result["reasons"][0]


def test_check_mode(standin):
    tool = standin("all_reduce_perf", "nccl", "h100_8gpu_ok.txt")
    result = run_module("nccl_test", {"executable": str(tool.path)}, check_mode=True, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "skipped" and "check mode" in result["reasons"][0] and not tool.ran
    assert result["tool"]["argv"][-2:] == ["-g", "<all visible GPUs>"]


def test_the_node_s_verdict_is_the_report_s_with_the_same_thresholds_and_interconnect(standin):
    """The stage gives the module every threshold the report judges NCCL with and the node's interconnect: an H100
    node whose GPUs talk over PCIe has no built-in floor (the 370 GB/s reference is an NVSwitch figure), so both say
    warn (on main the module got one threshold of three and no interconnect: fail on the node, warn in the report)."""
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.node_verdict import thresholds_for

    tool = standin("all_reduce_perf", "nccl", "h100_8gpu_ok.txt")
    inventory = {"gpufleet_nccl_min_busbw_fraction": 0.95}
    t, errors = thresholds_for("nccl_test", inventory)
    assert not errors and set(t) == set(judge_nccl.THRESHOLDS)
    names = ["NVIDIA H100 PCIe"] * 8
    for interconnect, verdict in (("pcie", "warn"), ("nvswitch", "pass")):
        result = run_module("nccl_test", {"executable": str(tool.path), "gpus_per_process": 8, "thresholds": t,
                                          "interconnect": interconnect, "gpu_names": names})
        report = judge_nccl.judge(result, t, HOST, gpu_names=names, topology=interconnect)
        assert result["verdict"] == verdict == (max((f["severity"] for f in report), default="pass")), result
    # a site reference given only to the filter reaches the module: 377.71 GB/s < 420 x 0.95 = 399 GB/s
    t["gpufleet_nccl_reference_busbw_gbps"] = {"H100": 420.0}
    result = run_module("nccl_test", {"executable": str(tool.path), "gpus_per_process": 8, "thresholds": t,
                                      "interconnect": "nvswitch", "gpu_names": names})
    assert result["verdict"] == "fail" and "< 399.0 GB/s" in result["reasons"][0]
    bad = run_module("nccl_test", {"executable": str(tool.path), "thresholds": {"gpufleet_nccl_min_busbw_fraction": 3}})
    assert bad.get("failed") and "gpufleet_nccl_min_busbw_fraction" in bad["msg"]
    bad = run_module("nccl_test", {"executable": str(tool.path), "thresholds": {"gpufleet_nccl_floor": 3}})
    assert bad.get("failed") and "gpufleet_nccl_floor" in bad["msg"]
