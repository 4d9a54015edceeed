"""kentino.gpufleet.dcgm_diag run as Ansible runs it, against stand-in dcgmi / nvidia-smi scripts."""

import time

from helpers.module_runner import run_module

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


def _names_file(tmp_path, text):
    path = tmp_path / "names.txt"
    path.write_text(text)
    return path


def test_auto_level_3_on_datacentre_gpus(standin, tmp_path):
    dcgmi = standin("dcgmi", "dcgm", "dcgm4_l3_pass.json")
    smi = standin("nvidia-smi")
    smi.path.write_text('#!/bin/sh\nprintf "NVIDIA H100 80GB HBM3\\nNVIDIA H100 80GB HBM3\\n"\n')
    result = run_module("dcgm_diag", {}, env={"PATH": "%s:%s" % (dcgmi.dir, SAFE_PATH)})
    assert result["verdict"] == "pass", result["reasons"]
    assert dcgmi.argv == ["diag", "-r", "3", "-j"]
    assert result["level_requested"] == 3 and result["level_run"] == 3
    assert "NVIDIA H100 80GB HBM3" in result["level_reason"] and "nvidia-smi" in result["level_reason"]
    assert result["dcgm_version"] == "4.2.3" and len(result["gpus"]) == 2


def test_auto_level_1_on_geforce_from_gpu_names(standin):
    dcgmi = standin("dcgmi", "dcgm", "dcgm4_l1_consumer.json")
    result = run_module("dcgm_diag", {"executable": str(dcgmi.path), "gpus": [0, 1],
                                      "gpu_names": ["NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090"]},
                        env={"PATH": SAFE_PATH})
    assert dcgmi.argv == ["diag", "-r", "1", "-j", "-i", "0,1"]
    assert result["verdict"] == "pass" and result["level_requested"] == 1
    assert "GeForce" in result["level_reason"]


def test_auto_without_names_or_nvidia_smi_is_error(standin):
    dcgmi = standin("dcgmi", "dcgm", "dcgm4_l3_pass.json")
    result = run_module("dcgm_diag", {"executable": str(dcgmi.path)}, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "error" and "nvidia-smi not found" in result["reasons"][0]
    assert not dcgmi.ran


def test_failing_gpu_is_fail_not_failed(standin):
    dcgmi = standin("dcgmi", "dcgm", "dcgm4_l3_gpu1_fail.json", rc=226)
    result = run_module("dcgm_diag", {"executable": str(dcgmi.path), "level": "3"})
    assert result["verdict"] == "fail" and not result.get("failed")
    assert result["tool"]["rc"] == 226
    assert [g["status"] for g in result["gpus"]] == ["pass", "fail"]
    assert any("double bit ECC" in line for line in result["evidence"])


def test_host_engine_down_is_error_with_the_fix(standin):
    dcgmi = standin("dcgmi", "dcgm", "hostengine_down.txt", rc=255)
    result = run_module("dcgm_diag", {"executable": str(dcgmi.path), "level": "1"})
    assert result["verdict"] == "error" and "start nvidia-dcgm (nv-hostengine)" in result["reasons"][0]


def test_missing_dcgmi(tmp_path):
    result = run_module("dcgm_diag", {"level": "2"}, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "error" and not result.get("failed")
    assert result["reasons"][0].startswith("dcgmi not found: install DCGM")
    assert result["tool"]["argv"] == ["dcgmi", "diag", "-r", "2", "-j"]


def test_timeout_leaves_no_process(hanging_tool, no_leftovers):
    path = hanging_tool("dcgmi", "Running level 3")
    started = time.monotonic()
    result = run_module("dcgm_diag", {"executable": str(path), "level": "3", "timeout": 1}, timeout=60)
    assert time.monotonic() - started < 20
    assert result["verdict"] == "error" and "timed out after 1 s" in result["reasons"][0]
    no_leftovers()


def test_garbage_output_is_error(standin):
    dcgmi = standin("dcgmi", "dcgm", "garbage.txt", rc=127)
    result = run_module("dcgm_diag", {"executable": str(dcgmi.path), "level": "1"})
    assert result["verdict"] == "error" and any("symbol lookup error" in e for e in result["evidence"])


def test_check_mode_runs_nothing(standin):
    dcgmi = standin("dcgmi", "dcgm", "dcgm4_l3_pass.json")
    result = run_module("dcgm_diag", {"executable": str(dcgmi.path), "level": "3"}, check_mode=True)
    assert result["verdict"] == "skipped" and "check mode" in result["reasons"][0]
    assert not dcgmi.ran and result["tool"]["argv"][1:] == ["diag", "-r", "3", "-j"]
