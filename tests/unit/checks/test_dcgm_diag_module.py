"""kentino.gpufleet.dcgm_diag run as Ansible runs it, against stand-in dcgmi / nvidia-smi scripts."""

import time

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_dcgm
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import node_name
from helpers.module_runner import run_module

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
HOST = node_name()


def _names_file(tmp_path, text):
    path = tmp_path / "names.txt"
    path.write_text(text)
    return path


def test_auto_level_3_on_datacentre_gpus(standin, tmp_path, contract):
    dcgmi = standin("dcgmi", "dcgm", "dcgm4_l3_pass.json")
    smi = standin("nvidia-smi")
    smi.path.write_text('#!/bin/sh\nprintf "NVIDIA H100 80GB HBM3\\nNVIDIA H100 80GB HBM3\\n"\n')
    result = run_module("dcgm_diag", {}, env={"PATH": "%s:%s" % (dcgmi.dir, SAFE_PATH)})
    assert result["verdict"] == "pass", result["reasons"]
    assert dcgmi.argv == ["diag", "-r", "3", "-j"]
    assert result["level_requested"] == 3 and result["level_run"] == 3
    assert "NVIDIA H100 80GB HBM3" in result["level_reason"] and "nvidia-smi" in result["level_reason"]
    assert result["dcgm_version"] == "4.2.3" and len(result["gpus"]) == 2
    assert contract("dcgm_diag", result, judge_dcgm.judge, {}) == []


def test_auto_level_1_on_geforce_from_gpu_names(standin):
    dcgmi = standin("dcgmi", "dcgm", "dcgm4_l1_consumer.json")
    result = run_module("dcgm_diag", {"executable": str(dcgmi.path), "gpus": [0, 1],
                                      "gpu_names": ["NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090"]},
                        env={"PATH": SAFE_PATH})
    assert dcgmi.argv == ["diag", "-r", "1", "-j", "-i", "0,1"]
    assert result["verdict"] == "pass" and result["level_requested"] == 1
    assert "GeForce" in result["level_reason"]


def test_auto_without_names_or_nvidia_smi_is_error(standin, contract):
    dcgmi = standin("dcgmi", "dcgm", "dcgm4_l3_pass.json")
    result = run_module("dcgm_diag", {"executable": str(dcgmi.path)}, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "error" and "nvidia-smi not found" in result["reasons"][0]
    assert not dcgmi.ran
    findings = contract("dcgm_diag", result, judge_dcgm.judge, {})
    assert [f["code"] for f in findings] == ["DCGM_NOT_RUN"] and "gpufleet_dcgm_level" in findings[0]["action"]


def test_failing_gpu_is_fail_not_failed(standin, contract):
    dcgmi = standin("dcgmi", "dcgm", "dcgm4_l3_gpu1_fail.json", rc=226)
    result = run_module("dcgm_diag", {"executable": str(dcgmi.path), "level": "3"})
    assert result["verdict"] == "fail" and not result.get("failed")
    assert result["tool"]["rc"] == 226
    assert [g["status"] for g in result["gpus"]] == ["pass", "fail"]
    assert any("double bit ECC" in line for line in result["evidence"])
    findings = contract("dcgm_diag", result, judge_dcgm.judge, {})
    assert [(f["code"], f["gpu"], f["pci"]) for f in findings] == [("DCGM_FAIL", 1, None)]
    # The report knows the PCI addresses (gpu_facts) and names the GPU by both.
    named = judge_dcgm.judge(result, {}, "node01", pci_of={1: "0000:2a:00"})
    assert named[0]["pci"] == "0000:2a:00" and named[0]["message"].startswith("node01 GPU 1 (0000:2a:00): ")


def test_host_engine_down_is_error_with_the_fix(standin, contract):
    dcgmi = standin("dcgmi", "dcgm", "hostengine_down.txt", rc=255)
    result = run_module("dcgm_diag", {"executable": str(dcgmi.path), "level": "1"})
    # The module's reasons are the findings' messages; the fix is the finding's action, which the report shows.
    assert result["verdict"] == "error" and "cannot reach the DCGM host engine" in result["reasons"][0]
    findings = contract("dcgm_diag", result, judge_dcgm.judge, {})
    assert "start nvidia-dcgm (nv-hostengine)" in findings[0]["action"]


def test_missing_dcgmi(tmp_path):
    result = run_module("dcgm_diag", {"level": "2"}, env={"PATH": SAFE_PATH})
    assert result["verdict"] == "error" and not result.get("failed")
    assert result["reasons"][0].startswith("%s: dcgm_diag could not run: dcgmi not found: install DCGM" % HOST)
    assert result["tool"]["argv"] == ["dcgmi", "diag", "-r", "2", "-j"]


def test_timeout_leaves_no_process(hanging_tool, no_leftovers):
    path = hanging_tool("dcgmi", "Running level 3")
    started = time.monotonic()
    result = run_module("dcgm_diag", {"executable": str(path), "level": "3", "timeout": 1}, timeout=60)
    assert time.monotonic() - started < 20
    assert result["verdict"] == "error" and "dcgm_diag timed out" in result["reasons"][0]
    assert result["tool"]["timed_out"] is True and any("Running level 3" in e for e in result["evidence"])
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
