"""kentino.gpufleet.gpu_burn run as Ansible runs it, against stand-in gpu_burn scripts."""

import os
import time

from helpers.module_runner import run_module

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


def test_healthy_run(standin):
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
    # the report draws each GPU's throughput over the run from this: one [percent, Gflop/s] point per frame
    assert [len(g["gflops_series"]) for g in result["gpus"]] == [10, 10]
    assert result["gpus"][0]["gflops_series"][0] == [10.0, 7100.0]


def test_faulty_gpu_is_fail_not_failed_and_maps_indexes(standin, tmp_path):
    tool = standin("gpu_burn", "gpu_burn", "faulty_errors_reset.log")
    args = {"executable": str(tool.path), "duration": 30, "gpus": [2, 5], "doubles": True, "tensor_cores": True,
            "memory": "80%", "chdir": str(tmp_path)}
    result = run_module("gpu_burn", args, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "fail" and not result.get("failed")
    assert tool.argv == ["-d", "-tc", "-m", "80%", "30"]
    assert tool.env["CUDA_VISIBLE_DEVICES"] == "2,5" and tool.cwd == str(tmp_path)
    faulty = [g for g in result["gpus"] if g["status"] == "faulty"]
    assert [(g["index"], g["cuda_index"]) for g in faulty] == [(5, 1)]
    assert any(r.startswith("GPU 5 (gpu_burn device 1)") for r in result["reasons"])


def test_deprecated_alias_cwd_still_sets_the_directory(standin, tmp_path):
    tool = standin("gpu_burn", "gpu_burn", "healthy_2gpu.log")
    result = run_module("gpu_burn", {"executable": str(tool.path), "duration": 60, "cwd": str(tmp_path)},
                        env={"PATH": SAFE_PATH})
    assert result["verdict"] == "pass", result
    assert tool.cwd == str(tmp_path)


def test_missing_tool_is_error_naming_the_install(tmp_path):
    result = run_module("gpu_burn", {"duration": 5}, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "error" and not result.get("failed")
    assert result["reasons"] == ["gpu_burn not found: install it with the kentino.gpufleet.validation_tools role "
                                 "or pass executable="]
    missing = run_module("gpu_burn", {"executable": str(tmp_path / "nope" / "gpu_burn")}, env={"PATH": SAFE_PATH})
    assert missing["verdict"] == "error" and "not found" in missing["reasons"][0]


def test_timeout_kills_the_whole_process_group(hanging_tool, no_leftovers):
    path = hanging_tool("gpu_burn", "Burning for 600 seconds.", child_ignores_sigterm=True)
    started = time.monotonic()
    result = run_module("gpu_burn", {"executable": str(path), "duration": 600, "timeout": 2}, timeout=60)
    elapsed = time.monotonic() - started
    assert result["verdict"] == "error" and not result.get("failed")
    assert "timed out after 2 s" in result["reasons"][0]
    assert result["tool"]["timed_out"] is True
    # 2 s timeout + 5 s SIGTERM grace (the child ignores SIGTERM) + interpreter start-up.
    assert elapsed < 20, elapsed
    no_leftovers()


def test_garbage_output_is_error_with_evidence(standin):
    tool = standin("gpu_burn", "gpu_burn", "garbage.txt", rc=139)
    result = run_module("gpu_burn", {"executable": str(tool.path), "duration": 5})
    assert result["verdict"] == "error"
    assert "not recognised" in result["reasons"][0] and "rc=139" in result["reasons"][0]
    assert any("Segmentation fault" in line for line in result["evidence"])


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
