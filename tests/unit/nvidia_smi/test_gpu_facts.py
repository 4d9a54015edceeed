"""kentino.gpufleet.gpu_facts run as Ansible runs it, against a stand-in nvidia-smi answering from the fixtures."""

import json
from pathlib import Path

from helpers.module_runner import run_module

SCHEMA = Path(__file__).resolve().parents[3] / "plugins" / "plugin_utils" / "schemas" / "gpu_facts.json"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia_smi"


def _contract_gpu_keys():
    """The per-GPU keys of the versioned result schema the controller reads (plugins/plugin_utils/schemas)."""
    return set(json.loads(SCHEMA.read_text())["$defs"]["gpu"]["properties"])


def _facts(standin, scenario, **args):
    stand = standin(scenario)
    result = run_module("gpu_facts", args=args, env=stand.env, path_prepend=[stand.bin_dir])
    assert not result.get("failed"), result
    return result, result["ansible_facts"], stand.calls


def _query_argv(calls):
    return [c for c in calls if any(a.startswith("--query-gpu=") for a in c)]


def test_datacenter_node_all_keys_three_calls(standin):
    result, facts, calls = _facts(standin, "h100")
    assert facts["gpufleet_gpu_count"] == 8
    assert facts["gpufleet_driver_version"] == "570.133.20"
    assert facts["gpufleet_gpu_problems"] == []
    contract = _contract_gpu_keys()
    assert len(contract) == 33
    for gpu in facts["gpufleet_gpus"]:
        assert set(gpu) == contract
    assert len(calls) == 3  # query-gpu, compute-apps, -q
    gpus = {g["pci"]: g for g in facts["gpufleet_gpus"]}
    first = gpus["0000:18:00"]
    assert first["processes"] == [
        {"pid": 48213, "name": "/opt/conda/envs/train env/bin/python3.11", "used_memory_mib": 59012},
        {"pid": 51977, "name": "/home/ml user/jupyter kernels/python", "used_memory_mib": 2210},
    ]
    assert gpus["0000:2a:00"]["processes"] == []
    assert gpus["0000:9a:00"]["pcie_replays"] == 412  # only -q has it
    sick = gpus["0000:5d:00"]
    assert (sick["remapped_rows_correctable"], sick["remapped_rows_uncorrectable"], sick["remapped_rows_pending"]) == (2, 1, True)
    assert sick["ecc_volatile_uncorrected"] == 1 and sick["recovery_action"] == "drain_and_reset"
    assert gpus["0000:ab:00"]["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert first["throttle_reasons"] == []
    assert first["retired_pages_sbe"] is None  # [N/A] on H100
    assert gpus["0000:ba:00"]["persistence_mode"] is False
    assert first["power_w"] == 512.4 and first["pcie_gen_current"] == 5 and first["pcie_width_max"] == 16
    assert result["nvidia_smi"]["rejected_fields"] == [] and result["changed"] is False


def test_consumer_card_values_are_none_not_strings(standin):
    _result, facts, _calls = _facts(standin, "rtx4090")
    assert facts["gpufleet_gpu_count"] == 4
    for gpu in facts["gpufleet_gpus"]:
        for key in ("ecc_mode", "ecc_volatile_corrected", "ecc_aggregate_uncorrected", "remapped_rows_correctable",
                    "remapped_rows_pending", "retired_pages_sbe", "serial"):
            assert gpu[key] is None, key
        assert gpu["processes"] == []
        assert not any(isinstance(v, str) and ("N/A" in v or v.startswith("[")) for v in gpu.values())
    riser = {g["pci"]: g for g in facts["gpufleet_gpus"]}["0000:41:00"]
    assert riser["pcie_width_current"] == 8 and riser["pcie_replays"] == 9071


def test_old_driver_falls_back_to_old_names_after_one_help_probe(standin):
    result, facts, calls = _facts(standin, "v100_r418")
    assert facts["gpufleet_gpu_problems"] == []
    queries = _query_argv(calls)
    assert len(queries) == 2, calls  # rejected once, then the right set
    assert sum(1 for c in calls if "--help-query-gpu" in c) == 1
    final = queries[-1][0].split("=", 1)[1].split(",")
    assert "pcie.link.gen.current" in final and "clocks_throttle_reasons.active" in final
    assert not any(f.startswith(("remapped_rows.", "clocks_event_reasons.")) or f == "gpu_recovery_action" for f in final)
    assert result["nvidia_smi"]["rejected_fields"] == ["pcie.link.gen.gpucurrent"]
    assert set(result["nvidia_smi"]["unsupported_keys"]) == {
        "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure",
        "recovery_action"}
    gpu = {g["pci"]: g for g in facts["gpufleet_gpus"]}["0000:16:00"]
    assert (gpu["retired_pages_sbe"], gpu["retired_pages_dbe"], gpu["retired_pages_pending"]) == (4, 1, True)
    assert gpu["pcie_gen_current"] == 3
    assert gpu["throttle_reasons"] == ["hw_slowdown", "sw_thermal_slowdown"]
    assert gpu["remapped_rows_correctable"] is None and gpu["recovery_action"] is None
    assert len(calls) == 5


def test_lost_gpu_among_eight_is_a_finding(standin):
    _result, facts, _calls = _facts(standin, "lost_gpu")
    assert facts["gpufleet_gpu_count"] == 7
    assert "0000:c1:00" not in [g["pci"] for g in facts["gpufleet_gpus"]]
    assert facts["gpufleet_gpu_problems"] == [{
        "kind": "lost", "pci": "0000:c1:00", "index": None,
        "message": "Unable to determine the device handle for GPU 0000:C1:00.0: GPU is lost. Reboot the system to recover this GPU",
    }]
    # the readable GPUs still got their -q values
    assert all(g["pcie_replays"] is not None for g in facts["gpufleet_gpus"])


def test_driver_not_loaded_one_call_tool_error(standin):
    _result, facts, calls = _facts(standin, "driver_not_loaded")
    assert facts["gpufleet_gpu_count"] == 0 and facts["gpufleet_gpus"] == []
    assert [p["kind"] for p in facts["gpufleet_gpu_problems"]] == ["tool_error"]
    assert "couldn't communicate with the NVIDIA driver" in facts["gpufleet_gpu_problems"][0]["message"]
    assert len(calls) == 1


def test_missing_nvidia_smi_is_a_problem_not_a_crash(empty_path):
    result = run_module("gpu_facts", env=empty_path)
    assert not result.get("failed"), result
    facts = result["ansible_facts"]
    assert facts["gpufleet_gpu_count"] == 0
    assert facts["gpufleet_gpu_problems"] == [
        {"kind": "tool_missing", "pci": None, "index": None,
         "message": "install the NVIDIA driver (nvidia-smi not found on PATH)"}]


def test_minimal_mode_is_one_call(standin):
    _result, facts, calls = _facts(standin, "h100", include_processes=False, include_q=False)
    assert len(calls) == 1
    assert all(g["processes"] is None and g["pcie_replays"] is None for g in facts["gpufleet_gpus"])


def test_check_mode_reads_the_same(standin):
    stand = standin("h100")
    result = run_module("gpu_facts", env=stand.env, path_prepend=[stand.bin_dir], check_mode=True)
    assert result["changed"] is False and result["ansible_facts"]["gpufleet_gpu_count"] == 8


def test_hung_nvidia_smi_times_out(tmp_path):
    hang = tmp_path / "nvidia-smi"
    hang.write_text("#!/bin/sh\nsleep 30\n")
    hang.chmod(0o755)
    result = run_module("gpu_facts", args={"executable": str(hang), "timeout": 1})
    problems = result["ansible_facts"]["gpufleet_gpu_problems"]
    assert [p["kind"] for p in problems] == ["tool_error"] and "timed out after 1s" in problems[0]["message"]
    assert result["nvidia_smi"]["calls"][0]["timed_out"] is True


def test_invalid_timeout_fails():
    result = run_module("gpu_facts", args={"timeout": 0})
    assert result["failed"] and "timeout" in result["msg"]


def _junk_smi(tmp_path, fixture="csv/junk_exit0.txt"):
    """A `nvidia-smi` that prints a fixture of junk for every call and exits 0 (a broken wrapper or stand-in)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncat '%s'\nexit 0\n" % (FIXTURES / fixture))
    smi.chmod(0o755)
    return smi


def test_junk_output_with_exit_0_gives_no_gpus_and_a_problem(tmp_path):
    result = run_module("gpu_facts", args={"executable": str(_junk_smi(tmp_path))})
    assert not result.get("failed"), result
    facts = result["ansible_facts"]
    assert facts["gpufleet_gpus"] == [] and facts["gpufleet_gpu_count"] == 0
    kinds = {p["kind"] for p in facts["gpufleet_gpu_problems"]}
    assert kinds == {"unparsable_output"}
    assert all("nvidia-smi --query-gpu" in p["message"] for p in facts["gpufleet_gpu_problems"])
    assert len(result["nvidia_smi"]["calls"]) == 1  # no GPU: no compute-apps or -q call


def test_lost_gpu_named_by_index_and_pci_reaches_the_facts(tmp_path):
    result = run_module("gpu_facts", args={"executable": str(_junk_smi(tmp_path, "csv/noheader_lost_by_index.csv")),
                                           "include_processes": False, "include_q": False})
    facts = result["ansible_facts"]
    lost = [p for p in facts["gpufleet_gpu_problems"] if p["kind"] == "lost"]
    assert [(p["pci"], p["index"]) for p in lost] == [("0000:c1:00", 0), ("0000:c3:00", None)]
    # the rows between them answer a 4-field query, not gpu_facts' query: not GPUs either
    assert facts["gpufleet_gpus"] == []
