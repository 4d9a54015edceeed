"""kentino.gpufleet.gpu_burn run as Ansible runs it, against stand-in gpu_burn scripts."""

import os
import shutil
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_gpu_burn, judge_ib, judge_samples
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import node_name
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULTS
from helpers.module_runner import REPO, run_module

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
HOST = node_name()
# nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader,nounits of a 4-GPU node whose GPU 0000:3A:00.0
# is lost: the tool prints the error in place of its row and exits 15.
SMI_MAP = (
    "0, 00000000:18:00.0, GPU-aaaaaaaa-0000-0000-0000-000000000000\n"
    "1, 00000000:2A:00.0, GPU-aaaaaaaa-0000-0000-0000-000000000001\n"
    "Unable to determine the device handle for GPU 0000:3A:00.0: GPU is lost. Reboot the system to recover this GPU\n"
    "3, 00000000:5D:00.0, GPU-aaaaaaaa-0000-0000-0000-000000000003\n"
)


def _burn_judge(result):
    return judge_gpu_burn.judge, {}, {"expected_gpus": result["expected_gpus"]}


def test_healthy_run(standin, contract):
    tool = standin("gpu_burn", "gpu_burn", "healthy_2gpu.log")
    result = run_module("gpu_burn", {"duration": 60, "expected_gpus": 2}, path_prepend=[tool.dir])
    assert result["verdict"] == "pass", result
    assert not result.get("failed")
    assert result["changed"] is False
    assert tool.argv == ["60"]
    assert tool.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "CUDA_VISIBLE_DEVICES" not in tool.env
    assert tool.cwd == str(tool.dir), "default cwd is the executable's directory (compare.ptx lives there)"
    assert result["tool"]["argv"] == [str(tool.path), "60"] and result["tool"]["rc"] == 0
    assert [g["status"] for g in result["gpus"]] == ["ok", "ok"]
    assert result["initialised_gpus"] == 2 and result["frames"] == 10
    assert result["expected_gpus"] == 2 and result["burn_s"] == 60
    # the report draws each GPU's throughput over the run from this: one [percent, Gflop/s] point per frame
    assert [len(g["gflops_series"]) for g in result["gpus"]] == [10, 10]
    assert result["gpus"][0]["gflops_series"][0] == [10.0, 7100.0]
    judge, t, kwargs = _burn_judge(result)
    assert contract("gpu_burn", result, judge, t, **kwargs) == []


def test_faulty_gpu_is_fail_not_failed_and_maps_indexes(standin, tmp_path, contract):
    # No nvidia-smi: CUDA_VISIBLE_DEVICES=2,5 in PCI bus order makes gpu_burn's device 1 nvidia-smi's GPU 5.
    tool = standin("gpu_burn", "gpu_burn", "faulty_errors_reset.log")
    args = {"executable": str(tool.path), "duration": 30, "gpus": [2, 5], "doubles": True, "tensor_cores": True,
            "memory": "80%", "chdir": str(tmp_path)}
    result = run_module("gpu_burn", args, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "fail" and not result.get("failed")
    assert tool.argv == ["-d", "-tc", "-m", "80%", "30"]
    assert tool.env["CUDA_VISIBLE_DEVICES"] == "2,5" and tool.cwd == str(tmp_path)
    assert result["gpu_map"] is None and "nvidia-smi not found" in result["gpu_map_problem"]
    faulty = [g for g in result["gpus"] if g["status"] == "faulty"]
    assert [(g["index"], g["cuda_index"]) for g in faulty] == [(5, 1)]
    assert [g["index"] for g in result["gpus"]] == [2, 5]
    assert any(r.startswith("%s GPU 5 (gpu_burn device 1) produced wrong results" % HOST) for r in result["reasons"])
    judge, t, kwargs = _burn_judge(result)
    findings = contract("gpu_burn", result, judge, t, **kwargs)
    assert [(f["code"], f["gpu"]) for f in findings] == [("BURN_FAULTY", 5)]


def test_devices_are_mapped_by_uuid_past_a_lost_gpu(standin, tmp_path, contract):
    # nvidia-smi shows GPUs 0, 1 and 3 (GPU 2 is lost). gpu_burn gets GPUs 1 and 3 by UUID: its device 1 is GPU 3,
    # never the lost GPU 2 that a count of positions would name.
    tool = standin("gpu_burn", "gpu_burn", "faulty_errors_reset.log")
    smi = standin("nvidia-smi")
    smi.path.write_text('#!/bin/sh\nprintf "%s"\nexit 15\n' % SMI_MAP)
    result = run_module("gpu_burn", {"executable": str(tool.path), "duration": 30, "gpus": [1, 3]},
                        path_prepend=[tool.dir])
    assert tool.env["CUDA_VISIBLE_DEVICES"] == ("GPU-aaaaaaaa-0000-0000-0000-000000000001,"
                                                "GPU-aaaaaaaa-0000-0000-0000-000000000003")
    assert [(m["cuda_index"], m["index"], m["pci"]) for m in result["gpu_map"]] == [(0, 1, "0000:2a:00"),
                                                                                 (1, 3, "0000:5d:00")]
    assert [(g["cuda_index"], g["index"], g["pci"], g["uuid"][-4:]) for g in result["gpus"]] == [
        (0, 1, "0000:2a:00", "0001"), (1, 3, "0000:5d:00", "0003")]
    assert result["expected_gpus"] == 2, "the map's length when expected_gpus is not given"
    judge, t, kwargs = _burn_judge(result)
    findings = contract("gpu_burn", result, judge, t, **kwargs)
    assert [(f["code"], f["gpu"], f["pci"]) for f in findings] == [("BURN_FAULTY", 3, "0000:5d:00")]
    assert findings[0]["message"].startswith("%s GPU 3 (0000:5d:00) (gpu_burn device 1)" % HOST)


def test_deprecated_alias_cwd_still_sets_the_directory(standin, tmp_path):
    tool = standin("gpu_burn", "gpu_burn", "healthy_2gpu.log")
    result = run_module("gpu_burn", {"executable": str(tool.path), "duration": 60, "cwd": str(tmp_path)},
                        env={"PATH": SAFE_PATH})
    assert result["verdict"] == "pass", result
    assert tool.cwd == str(tmp_path)


def test_missing_tool_is_error_naming_the_install(tmp_path):
    result = run_module("gpu_burn", {"duration": 5}, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "error" and not result.get("failed")
    assert result["reasons"] == ["%s: gpu_burn could not run: gpu_burn not found: install it with the "
                                 "kentino.gpufleet.validation_tools role or pass executable=" % HOST]
    missing = run_module("gpu_burn", {"executable": str(tmp_path / "nope" / "gpu_burn")}, env={"PATH": SAFE_PATH})
    assert missing["verdict"] == "error" and "not found" in missing["reasons"][0]


def test_timeout_kills_the_whole_process_group(hanging_tool, no_leftovers):
    path = hanging_tool("gpu_burn", "Burning for 600 seconds.", child_ignores_sigterm=True)
    started = time.monotonic()
    result = run_module("gpu_burn", {"executable": str(path), "duration": 600, "timeout": 2}, timeout=60)
    elapsed = time.monotonic() - started
    assert result["verdict"] == "error" and not result.get("failed")
    assert "gpu_burn timed out" in result["reasons"][0] and "process group" in result["reasons"][0]
    assert result["tool"]["timed_out"] is True and result["tool"]["duration_s"] >= 2
    assert any("Burning for 600 seconds." in line for line in result["output_tail"]), "where it hung"
    assert any("Burning for 600 seconds." in line for line in result["evidence"])
    # 2 s timeout + 5 s SIGTERM grace (the child ignores SIGTERM) + interpreter start-up.
    assert elapsed < 20, elapsed
    no_leftovers()


def test_workers_killed_by_cuda_802_are_the_fabric_not_a_missing_progress(standin, contract):
    tool = standin("gpu_burn", "gpu_burn", "terminate_802_loop.log", rc=134)
    result = run_module("gpu_burn", {"executable": str(tool.path), "duration": 60, "expected_gpus": 2},
                        env={"PATH": SAFE_PATH})
    assert result["verdict"] == "fail" and not result.get("failed")
    assert [(e["code"], e["count"]) for e in result["cuda_errors"]] == [(802, 1), (304, 3)]
    judge, t, kwargs = _burn_judge(result)
    assert [f["code"] for f in contract("gpu_burn", result, judge, t, **kwargs)] == ["BURN_FABRIC_NOT_READY"]
    assert "error 802" in result["reasons"][0]


def test_a_burn_hung_after_cuda_802_is_killed_and_names_the_fabric(hanging_tool):
    path = hanging_tool("gpu_burn", "  what():  Error (gpu_burn-drv.cpp:298): system not yet initialized")
    result = run_module("gpu_burn", {"executable": str(path), "duration": 600, "timeout": 2}, timeout=60)
    assert result["tool"]["timed_out"] is True and result["verdict"] == "fail"
    assert [e["code"] for e in result["cuda_errors"]] == [802]
    assert "error 802" in result["reasons"][0] and "killed at its timeout" in result["reasons"][0]


def test_garbage_output_is_error_with_evidence(standin, contract):
    tool = standin("gpu_burn", "gpu_burn", "garbage.txt", rc=139)
    result = run_module("gpu_burn", {"executable": str(tool.path), "duration": 5})
    assert result["verdict"] == "error"
    assert "not recognised" in result["reasons"][0] and "rc=139" in result["reasons"][0]
    assert any("Segmentation fault" in line for line in result["evidence"])
    judge, t, kwargs = _burn_judge(result)
    assert [f["code"] for f in contract("gpu_burn", result, judge, t, **kwargs)] == ["BURN_NOT_RUN"]


def test_check_mode_does_not_burn(standin):
    tool = standin("gpu_burn", "gpu_burn", "healthy_2gpu.log")
    result = run_module("gpu_burn", {"executable": str(tool.path), "duration": 60}, check_mode=True)
    assert result["verdict"] == "skipped" and "check mode" in result["reasons"][0]
    assert not tool.ran
    assert result["tool"]["argv"] == [str(tool.path), "60"] and result["tool"]["rc"] is None


def test_shell_metacharacters_never_reach_a_shell(standin, tmp_path):
    tool = standin("gpu_burn", "gpu_burn", "healthy_2gpu.log")
    pwned = tmp_path / "pwned"
    result = run_module("gpu_burn", {"executable": str(tool.path), "memory": "90%%; touch %s" % pwned})
    assert result.get("failed") and "memory must be" in result["msg"]
    assert not tool.ran and not pwned.exists()


def test_relative_path_entry_still_runs_from_the_tool_directory(standin):
    # gpu_burn runs with cwd = its directory; a tool found through a relative PATH entry must still resolve.
    tool = standin("gpu_burn", "gpu_burn", "healthy_2gpu.log")
    relative = os.path.relpath(tool.dir)
    result = run_module("gpu_burn", {"duration": 60}, env={"PATH": "%s:%s" % (relative, SAFE_PATH)})
    assert result["verdict"] == "pass", result["reasons"]
    assert os.path.isabs(result["tool"]["argv"][0]) and tool.cwd == str(tool.dir)


def _sim_env(tmp_path, scenario):
    sim = REPO / "sim"
    return {"GPUFLEET_SIM_SCENARIO": scenario, "GPUFLEET_SIM_STATE": str(tmp_path / "node"),
            "GPUFLEET_SIM_NODE": "sim-node01", "GPUFLEET_SIM_TIME_SCALE": "0.01",
            "PATH": "%s:%s" % (sim / "bin", SAFE_PATH)}


def test_sampling_beside_the_burn_covers_exactly_the_load(tmp_path, contract):
    """One job: the samples start before the burn (an idle reference) and end with it, whatever the controller does."""
    result = run_module("gpu_burn", {"duration": 300, "sample": {"interval": 0.3}},
                        env=_sim_env(tmp_path, "pcie_degraded"))
    assert result["verdict"] == "pass", result["reasons"]
    judge, t, kwargs = _burn_judge(result)
    assert contract("gpu_burn", result, judge, t, **kwargs) == []
    sampling = result["sampling"]
    assert contract("gpu_sample", sampling, judge_samples.judge, dict(DEFAULTS)) != []
    assert sampling["stopped_early"] is False and sampling["stop_reason"] is None
    # Ended by the burn's end, not by a duration: the sampler ran as long as the burn, give or take one interval.
    assert abs(sampling["duration_s"] - result["tool"]["duration_s"]) < 1.5, (sampling["duration_s"], result["tool"])
    loaded = {g["pci"]: g["loaded_samples"] for g in sampling["per_gpu"]}
    assert len(loaded) == 8 and min(loaded.values()) >= 3, loaded
    assert sampling["verdict"] == "fail" and any("PCIe link under load is gen 1 x4" in r for r in sampling["reasons"])


def test_sampling_without_nvidia_smi_says_so(standin, tmp_path):
    tool = standin("gpu_burn", "gpu_burn", "healthy_2gpu.log")
    result = run_module("gpu_burn", {"executable": str(tool.path), "duration": 60, "expected_gpus": 2,
                                     "sample": {"interval": 1}}, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "pass"
    assert result["sampling"]["verdict"] == "error" and result["sampling"]["stop_reason"] == "nvidia-smi not found"


def test_sampling_interval_must_be_positive(standin):
    tool = standin("gpu_burn", "gpu_burn", "healthy_2gpu.log")
    result = run_module("gpu_burn", {"executable": str(tool.path), "duration": 60, "sample": {"interval": 0}})
    assert result.get("failed") and "sample.interval must be a positive number" in result["msg"]


IB = REPO / "tests" / "fixtures" / "ib" / "sysfs"
IB_T = {"gpufleet_ib_expected_rate_gbps": 400, "gpufleet_ib_expected_width": 4}


def test_infiniband_ports_read_around_the_load_in_the_same_job(tmp_path, contract):
    """Option ib_ports: the first read before gpu_burn starts, the second after it ends (here the load itself moves the
    counters: a stand-in that swaps in the after-load tree), judged as kentino.gpufleet.ib_ports judges them."""
    root = tmp_path / "infiniband"
    shutil.copytree(IB / "ndr_ok", root)
    log = REPO / "tests" / "fixtures" / "gpu_burn" / "healthy_2gpu.log"
    burn = tmp_path / "gpu_burn"
    burn.write_text('#!/bin/sh\nrm -rf "%s" && cp -r "%s" "%s"\ncat "%s"\n' % (root, IB / "ndr_after_load", root, log))
    burn.chmod(0o755)
    result = run_module("gpu_burn", {"executable": str(burn), "duration": 60, "expected_gpus": 2,
                                     "ib_ports": {"root": str(root), "thresholds": IB_T}}, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "pass", result["reasons"]
    ports = result["ib_ports"]
    findings = contract("ib_ports", ports, judge_ib.judge, IB_T)
    assert [f["code"] for f in findings] == ["IB_LINK_FLAPPED", "IB_ERRORS_RISING"]
    assert ports["verdict"] == "fail" and sorted(ports["baseline"]) == ["mlx5_0/1", "mlx5_1/1"]
    judge, t, kwargs = _burn_judge(result)
    assert contract("gpu_burn", result, judge, t, **kwargs) == []


def test_infiniband_ports_are_read_when_gpu_burn_cannot_run(tmp_path):
    """A missing gpu_burn still gets the ports judged (a port that is down shows), and a node without InfiniBand gets
    the check skipped with the reason; a relative root is refused naming the option."""
    missing = run_module("gpu_burn", {"duration": 60, "ib_ports": {"root": str(IB / "ndr_ok")}},
                         env={"PATH": SAFE_PATH})
    assert missing["tool"]["error"] and missing["ib_ports"]["verdict"] == "pass"
    none = run_module("gpu_burn", {"duration": 60, "ib_ports": {"root": str(tmp_path / "absent")}},
                      env={"PATH": SAFE_PATH})
    assert none["ib_ports"]["verdict"] == "skipped" and "no InfiniBand" in none["ib_ports"]["not_run"]
    relative = run_module("gpu_burn", {"duration": 60, "ib_ports": {"root": "sys/class/infiniband"}},
                          env={"PATH": SAFE_PATH})
    assert relative.get("failed") and relative["msg"].startswith("ib_ports.root: 'sys/class/infiniband' is not")
