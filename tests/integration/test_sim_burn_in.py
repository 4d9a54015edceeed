"""The burn-in on the simulated fleet finds every planted fault with the right action, and nothing on healthy nodes."""

import jsonschema
import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.report import load_schema
from helpers.playbook_runner import codes, nodes_by_host

# host -> (scenario, expected node verdict, codes that must be found, words the node's action must contain)
PLANTED = {
    "sim-node03": ("riser_xid79", "fail", {"GPU_LOST"}, "reseat the riser"),
    "sim-node04": ("psu_rail_b", "fail", {"PSU_RAIL_LOSS"}, "PSU B"),
    "sim-node05": ("ecc_leak", "fail", {"ECC_LEAK", "XID_RMA"}, "replace the card"),
    "sim-node06": ("pcie_degraded", "fail", {"PCIE_DEGRADED", "NCCL_BUSBW_LOW"}, "riser"),
    "sim-node07": ("neighbour_process", "error", {"GPU_BUSY", "CHECKS_REFUSED"}, "stop the process"),
    "sim-node08": ("checkpoint_readonly", "fail", {"STORAGE_FAIL"}, "read-only"),
    "sim-node09": ("hgx_nvlink_down", "fail", {"NVLINK_LINK_DOWN"}, "reseat GPU 5's SXM module"),
}
HEALTHY = ("sim-node01", "sim-node02")


@pytest.fixture(scope="module")
def report(burn_in_run):
    rc, output, report = burn_in_run
    assert report is not None, output[-4000:]
    return report


def test_gate_fails_the_run_and_prints_the_summary(burn_in_run):
    rc, output, _ = burn_in_run
    assert rc == 2, output[-3000:]
    assert "| node | verdict |" in output and "HTML report:" in output


def test_the_end_of_a_failing_run_reads_well(burn_in_run):
    """The summary table once, then the gate's short message; no very long line; no colour codes in a pipe."""
    rc, output, report = burn_in_run
    end = output[output.index("PLAY [Write the fleet report]"):]
    assert output.count("| node | verdict |") == 1 and output.count("HTML report:") == 1, end
    assert end.index("| node | verdict |") < end.index("TASK [Gate on the verdicts") < end.index("PLAY RECAP")
    gate = end[end.index("TASK [Gate on the verdicts"):end.index("PLAY RECAP")]
    assert "gate fail_on=fail: %d of %d node(s) failed it" % (len(report["summary"]["gate"]["nodes"]),
                                                              len(report["nodes"])) in gate
    assert "| node |" not in gate and "summary_md" not in gate and "gpu_verdicts" not in gate
    longest = max(output.splitlines(), key=len)
    assert len(longest) < 1000, longest[:300]
    assert "\x1b[" not in output


def test_report_is_valid_against_its_schema(report):
    jsonschema.validate(report, load_schema())
    assert len(report["nodes"]) == 9
    assert sum(len(n["gpus"]) for n in report["nodes"]) >= 64


@pytest.mark.parametrize("host", HEALTHY)
def test_healthy_nodes_pass_with_no_findings(report, host):
    node = nodes_by_host(report)[host]
    assert node["verdict"] == "pass" and node["findings"] == [], node["findings"]
    assert node["stage"] == "done"
    assert all(g["verdict"] == "pass" for g in node["gpus"])
    assert {"gpu_burn", "dcgm_diag", "nccl_test", "gpu_sample", "xid_facts", "nvlink"} <= set(node["checks"])
    # The demo's nodes have no InfiniBand (no fabric): that check is skipped with the reason, never a pass, and it is
    # not a check the node left out (its summary lists none).
    assert node["checks"]["ib_ports"]["verdict"] == "skipped"
    assert node["checks"]["ib_ports"]["reasons"][0].startswith("no InfiniBand on this node: ")
    assert node["skipped"] == []


@pytest.mark.parametrize("host", sorted(PLANTED))
def test_planted_fault_found_with_its_action(report, host):
    scenario, verdict, expected, action_words = PLANTED[host]
    node = nodes_by_host(report)[host]
    assert node["verdict"] == verdict, (scenario, node["findings"])
    assert expected <= codes(node), (scenario, codes(node))
    actions = " ".join(f["action"] for f in node["findings"])
    assert action_words.lower() in actions.lower(), (scenario, actions)
    assert all(f["evidence"] for f in node["findings"] if f["severity"] in ("fail", "warn")), scenario


def test_riser_fault_is_one_gpu_with_the_kernel_line(report):
    node = nodes_by_host(report)["sim-node03"]
    lost = [f for f in node["findings"] if f["code"] == "GPU_LOST"]
    assert [f["gpu"] for f in lost] == [3]
    assert any("Xid" in line and ": 79," in line for line in lost[0]["evidence"]), lost[0]["evidence"]
    assert "PSU_RAIL_LOSS" not in codes(node)


def test_psu_rail_names_all_four_gpus(report):
    node = nodes_by_host(report)["sim-node04"]
    rail = [f for f in node["findings"] if f["code"] == "PSU_RAIL_LOSS"][0]
    assert all(str(i) in rail["message"] for i in (4, 5, 6, 7))
    assert {f["gpu"] for f in node["findings"] if f["code"] == "GPU_LOST"} == {4, 5, 6, 7}


def test_busy_gpu_names_the_pid(report):
    node = nodes_by_host(report)["sim-node07"]
    busy = [f for f in node["findings"] if f["code"] == "GPU_BUSY"][0]
    assert "PID" in busy["message"] or "pid" in busy["message"]
    for check in ("gpu_burn", "dcgm_diag", "nccl_test"):  # invasive checks must not run on a busy node
        assert node["checks"][check]["verdict"] == "skipped"
        assert node["checks"][check]["reasons"] == ["not run: refused: " + node_refusal(node)]


def node_refusal(node):
    return [f for f in node["findings"] if f["code"] == "CHECKS_REFUSED"][0]["message"].split(": ", 1)[1]


def test_degraded_link_is_judged_under_load(report):
    node = nodes_by_host(report)["sim-node06"]
    pcie = [f for f in node["findings"] if f["code"] == "PCIE_DEGRADED"]
    assert [f["gpu"] for f in pcie] == [5]
    busbw = [f for f in node["findings"] if f["code"] == "NCCL_BUSBW_LOW"][0]
    assert "GB/s" in busbw["message"]


def test_report_files_are_all_written(burn_in_run, tmp_path):
    rc, output, report = burn_in_run
    run_dir = [line.split("HTML report: ")[1].strip() for line in output.splitlines() if "HTML report: " in line][-1]
    from pathlib import Path

    html = Path(run_dir)
    for name in ("report.json", "report.md", "report.html", "junit.xml"):
        assert (html.parent / name).stat().st_size > 0, name


def test_the_hgx_link_down_names_gpu_link_and_pairs_while_nccl_still_passes(report):
    node = nodes_by_host(report)["sim-node09"]
    assert node["worst"]["code"] == "NVLINK_LINK_DOWN" and node["worst"]["gpu"] == 5
    assert "NVLink 11 down (17 of 18 up)" in node["worst"]["message"]
    assert "every pair GPU 5-GPU x (x = 0,1,2,3,4,6,7)" in node["worst"]["message"]
    # The degraded link only shows as slower collectives: NCCL alone passes its floor.
    assert node["checks"]["nccl_test"]["verdict"] == "pass"
    assert node["checks"]["nvlink"]["figures"]["links_up"] == 143
    assert node["gpus"][5]["metrics"]["nvlink_links_up"] == 17
    # The PCIe consumer build has no NVLink: the check says so instead of passing.
    rtx = nodes_by_host(report)["sim-node01"]["checks"]["nvlink"]
    assert rtx["verdict"] == "skipped" and "no NVLink" in rtx["reasons"][0]
