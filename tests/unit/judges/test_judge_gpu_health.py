"""judge_gpu_health: unreadable nvidia-smi, missing GPUs, and the memory-health counters that end in an RMA."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_gpu_health
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import schema_errors
from hypothesis import given, settings
from judgelib import BAD_TOP, GARBAGE, HOST, check_shape, codes, door, only, set_path, thresholds

PCI = ["0000:18:00", "0000:2a:00", "0000:3a:00", "0000:5d:00"]


def _gpu(index, **change):
    gpu = {"index": index, "pci": PCI[index], "name": "NVIDIA H100 80GB HBM3", "ecc_volatile_corrected": 0,
           "ecc_volatile_uncorrected": 0, "retired_pages_sbe": None, "retired_pages_dbe": None,
           "retired_pages_pending": None, "remapped_rows_correctable": 0, "remapped_rows_uncorrectable": 0,
           "remapped_rows_pending": False, "remapped_rows_failure": False}
    gpu.update(change)
    return gpu


def healthy(count=4):
    return {"gpufleet_gpus": [_gpu(i) for i in range(count)], "gpufleet_gpu_count": count,
            "gpufleet_gpu_problems": [], "gpufleet_pci_gpus": PCI[:count]}


def judge(facts, lost_pcis=(), **t):
    return judge_gpu_health.judge(facts, thresholds(**t), HOST, lost_pcis)


def test_healthy_gpus_have_no_finding_and_match_the_schema():
    facts = healthy()
    assert judge(facts) == []
    assert schema_errors("gpu_facts", facts) == []


@pytest.mark.parametrize("pages, expected", [(57, []), (58, [("RETIRED_PAGES_EXHAUSTED", 2)])])
def test_retired_pages_near_the_64_page_limit(pages, expected):
    facts = set_path(healthy(), ("gpufleet_gpus", 2), _gpu(2, retired_pages_sbe=pages - 1, retired_pages_dbe=1))
    findings = judge(facts)
    assert codes(findings) == expected
    if findings:
        assert findings[0]["pci"] == "0000:3a:00" and "RMA" in findings[0]["action"]
    assert judge(facts, gpufleet_retired_pages_rma=59) == []


def test_retirement_pending():
    facts = set_path(healthy(), ("gpufleet_gpus", 1), _gpu(1, retired_pages_pending=True))
    f = only(judge(facts), "RETIRED_PAGES_PENDING")
    assert f["gpu"] == 1 and "reset the GPU" in f["action"]
    assert judge(set_path(facts, ("gpufleet_gpus", 1, "retired_pages_pending"), False)) == []


@pytest.mark.parametrize("rows, expected", [(459, []), (460, [("REMAPPED_ROWS_EXHAUSTED", 0)])])
def test_uncorrectable_remapped_rows_near_the_512_limit(rows, expected):
    facts = set_path(healthy(), ("gpufleet_gpus", 0, "remapped_rows_uncorrectable"), rows)
    assert codes(judge(facts)) == expected
    assert judge(facts, gpufleet_remapped_rows_rma=500) == []


def test_remap_failure_and_pending():
    f = only(judge(set_path(healthy(), ("gpufleet_gpus", 3, "remapped_rows_failure"), True)), "ROW_REMAP_FAILURE")
    assert f["gpu"] == 3 and f["pci"] == "0000:5d:00"
    f = only(judge(set_path(healthy(), ("gpufleet_gpus", 3, "remapped_rows_pending"), True)), "ROW_REMAP_PENDING")
    assert "reset the GPU to apply the remap" in f["action"]


@pytest.mark.parametrize("dbe, expected", [(0, []), (1, [("ECC_UNCORRECTED", 1)])])
def test_uncorrected_ecc_since_boot(dbe, expected):
    assert codes(judge(set_path(healthy(), ("gpufleet_gpus", 1, "ecc_volatile_uncorrected"), dbe))) == expected


def test_missing_gpu_against_the_bus_and_the_inventory():
    # nvidia-smi shows 3 of the 4 GPUs on the PCI bus: the 4th is named
    facts = healthy()
    facts["gpufleet_gpus"].pop(2)
    f = only(judge(facts), "GPU_MISSING")
    assert "shows 3 GPU(s), 4 expected (NVIDIA GPUs on the PCI bus)" in f["message"]
    assert "0000:3a:00" in f["message"] and "riser" in f["action"]
    # the inventory's count is the threshold
    assert judge(facts, gpufleet_expected_gpus=3) == []
    assert codes(judge(healthy(), gpufleet_expected_gpus=8)) == [("GPU_MISSING", None)]
    # a GPU already known lost is judged as GPU_LOST (with the XIDs), not counted missing again
    assert judge(facts, lost_pcis=["0000:3a:00"]) == []


def test_unreadable_nvidia_smi_is_an_error_not_healthy():
    facts = healthy(count=0)
    facts["gpufleet_gpu_problems"] = [{"kind": "driver_not_loaded", "message": "NVIDIA-SMI has failed",
                                       "pci": None, "index": None, "line": None}]
    facts["gpufleet_pci_gpus"] = []
    f = only(judge(facts), "GPU_FACTS_UNREADABLE")
    assert f["severity"] == "error" and "driver_not_loaded" in f["message"]
    # a lost GPU is not "unreadable": it is judged with the XIDs
    facts["gpufleet_gpu_problems"][0]["kind"] = "lost"
    assert judge(facts) == []


@pytest.mark.parametrize("bad", BAD_TOP)
def test_bad_input_is_refused_at_the_door(bad):
    door("gpu_facts", bad, lambda data: check_shape(judge_gpu_health.judge(data, {}, HOST)))


@pytest.mark.parametrize("path, value", [
    (("gpufleet_gpus", 0), None), (("gpufleet_gpus", 0, "index"), None), (("gpufleet_gpus", 0, "pci"), None),
    (("gpufleet_gpus", 0, "retired_pages_sbe"), "60"), (("gpufleet_gpus",), "x"), (("gpufleet_pci_gpus",), 4),
    (("gpufleet_gpu_problems",), [{"kind": "tool_error"}]), (("gpufleet_gpus", 1, "remapped_rows_uncorrectable"), []),
])
def test_values_of_the_wrong_type_are_refused_or_judged(path, value):
    door("gpu_facts", set_path(healthy(), path, value), lambda data: check_shape(judge(data)))


@settings(max_examples=200, deadline=None)
@given(GARBAGE)
def test_fuzz_is_refused_or_judged(data):
    door("gpu_facts", data, lambda d: check_shape(judge_gpu_health.judge(d, thresholds(), HOST, ["0000:3a:00"])))
