"""The node checks against what the tools printed on a real NVIDIA H200 (tests/fixtures/real_h200/README.md): each
module runs as Ansible runs it, its nvidia-smi and dmesg answering with the recorded output for the same arguments
(tests/helpers/replay_tool.py), and must give the facts it gave on that machine."""

import json
import os
from pathlib import Path

import pytest
from helpers.module_runner import run_module

REPO = Path(__file__).resolve().parents[3]
REAL = REPO / "tests" / "fixtures" / "real_h200"


def _replay(tmp_path, calls):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("nvidia-smi", "dmesg"):
        os.symlink(REPO / "tests" / "helpers" / "replay_tool.py", bin_dir / tool)
    return {"env": {"REPLAY_DIR": str(REAL / calls), "REPLAY_STATE": str(tmp_path)}, "path_prepend": [bin_dir]}


@pytest.fixture
def replay(tmp_path):
    return _replay(tmp_path, "calls")


def _recorded(name):
    return json.loads((REAL / "results" / (name + ".json")).read_text())


def test_gpu_facts_reads_the_h200_as_it_did_there(replay):
    result = run_module("gpu_facts", **replay)
    assert not result.get("failed"), result
    facts, there = result["ansible_facts"], _recorded("gpu_facts")
    assert facts == there
    (gpu,) = facts["gpufleet_gpus"]
    # What the real card says that the shapes did not: no retired pages on a card that remaps rows ([N/A]), no
    # memory used at idle (0, not a few MiB), PCIe gen 5 x16 read at idle.
    assert (gpu["name"], gpu["pci"], gpu["memory_total_mib"], gpu["memory_used_mib"]) == (
        "NVIDIA H200", "0000:00:06", 143771, 0)
    assert (gpu["retired_pages_sbe"], gpu["retired_pages_dbe"], gpu["remapped_rows_correctable"]) == (None, None, 0)
    assert facts["gpufleet_gpu_problems"] == []


def test_nvlink_facts_finds_no_fabric_on_one_passed_through_h200(replay):
    result = run_module("nvlink_facts", **replay)
    assert not result.get("failed"), result
    read, there = result["ansible_facts"]["gpufleet_nvlink"], _recorded("nvlink_facts")["gpufleet_nvlink"]
    for key in ("gpus", "topology", "interconnect", "unparsed", "problems", "driver_version"):
        assert read[key] == there[key], key
    # nvlink --status prints nothing (exit 0) and the fabric section is N/A throughout: no NVLink, nothing down
    assert read["interconnect"] is None and read["topology"]["gpus"] == [0]
    assert all(count == 0 for count in (u["count"] for u in read["unparsed"].values()))


def test_xid_facts_reads_the_boot_log_of_a_clean_h200(replay):
    result = run_module("xid_facts", args={"source": "dmesg"}, **replay)
    assert not result.get("failed"), result
    read, there = result["ansible_facts"]["gpufleet_xid"], _recorded("xid_dmesg")["gpufleet_xid"]
    # The driver's benign boot lines (FBHUB interrupt cleared, persistence mode deprecated) are no XID and no
    # line left unread.
    assert read["events"] == there["events"] == [] and read["highest_severity"] == "none"
    assert read["unparsed"]["count"] == there["unparsed"]["count"] == 0


def test_gpu_sample_judges_the_h200_under_gpu_burn(tmp_path):
    """The 50 samples nvidia-smi gave every 2 s through a 60 s gpu_burn, served in order (as many as the module takes
    in its 3 s): idle (0x1, gpu_idle), the 128 GB allocation (100 W, 0 %), then the load (630 W, 100 %, 54 C)."""
    result = run_module("gpu_sample", args={"duration": 3.0, "interval": 0.05}, **_replay(tmp_path, "samples"))
    assert not result.get("failed"), result
    assert result["problems"] == [] and len(result["samples"]) >= 10, result
    assert result["samples"][0]["gpus"][0]["throttle_reasons"] == ["gpu_idle"]
    (gpu,) = result["per_gpu"]
    assert gpu["pci"] == "0000:00:06" and gpu["loaded_samples"] >= 1
    # Gen 5 x16 under load, as rated; no throttling under load; no finding.
    assert (gpu["pcie_gen_under_load"], gpu["pcie_width_under_load"]) == (5, 16)
    assert gpu["throttle_reasons_seen"] == [] and gpu["max_temperature_c"] >= 52 and gpu["max_power_w"] > 600
    assert result["verdict"] == "pass", result.get("reasons")
