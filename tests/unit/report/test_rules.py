"""The rules layer on observations recorded from real runs of the simulated fleet (tests/fixtures/report/record.py).

Every planted fault of the simulated fleet gives its verdict and finding; faults the simulator does not plant are
made by editing a healthy node's recorded observations the way the tool would have reported them. The report never
reads the node's own verdict, and a result that does not match its schema is an error naming the key.
"""

import copy
import json
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import NODE_VERDICTS
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import reach
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "report"
BURN = json.loads((FIXTURES / "sim_burn_in.json").read_text())["hosts"]
PRE = json.loads((FIXTURES / "sim_preflight.json").read_text())["hosts"]
H100 = "sim-node02"  # healthy 8x H100 SXM
RTX = "sim-node01"  # healthy 8x RTX 5090 on risers


def host(name=H100, source=BURN):
    return copy.deepcopy(source[name])


def judge(hv, name=H100, in_play=None):
    return rules.evaluate_node(name, hv, in_play)


def codes(node):
    return [f["code"] for f in node["findings"]]


def finding(node, code):
    found = [f for f in node["findings"] if f["code"] == code]
    assert found, "no %s in %s" % (code, codes(node))
    return found[0]


def rows(hv):
    """Every GPU row of every sample (gpu_sample's observations)."""
    return [g for s in hv["gpufleet_result_gpu_sample"]["samples"] for g in s["gpus"]]


def loaded(row):
    return (row.get("utilization_gpu_pct") or 0) >= 50


def xid_event(hv, code, gpu=0, body="test", time=None):
    pci = hv["ansible_facts"]["gpufleet_gpus"][gpu]["pci"]
    line = "NVRM: Xid (PCI:%s): %d, pid='<unknown>', name=<unknown>, %s" % (pci, code, body)
    event = {"xid": code, "pci": pci, "line": line, "severity": "critical", "counted": True,
             "time": time or "2026-11-30T08:00:00+00:00", "details": {}, "mnemonic": None, "description": body}
    hv["ansible_facts"]["gpufleet_xid"]["events"].append(event)
    return event


# --- what the simulated fleet plants ------------------------------------------------------------------------------

BURN_EXPECTED = {
    "sim-node01": ("pass", None, None),
    "sim-node02": ("pass", None, None),
    "sim-node03": ("fail", "GPU_LOST", 3),
    "sim-node04": ("fail", "PSU_RAIL_LOSS", None),
    "sim-node05": ("fail", "XID_RMA", 2),
    "sim-node06": ("fail", "PCIE_DEGRADED", 5),
    "sim-node07": ("error", "CHECKS_REFUSED", None),
    "sim-node08": ("fail", "STORAGE_FAIL", None),
}


@pytest.mark.parametrize("name", sorted(BURN_EXPECTED))
def test_recorded_burn_in(name):
    verdict, code, gpu = BURN_EXPECTED[name]
    node = judge(host(name), name)
    assert node["verdict"] == verdict, codes(node)
    if code is None:
        assert node["findings"] == [] and node["reachable"]
        assert all(c["verdict"] in ("pass", "skipped") for c in node["checks"].values())
    else:
        assert node["worst"]["code"] == code and node["worst"]["gpu"] == gpu


def test_recorded_preflight_healthy_nodes_pass_with_their_own_environment():
    for name in ("sim-node01", "sim-node02", "sim-node03", "sim-node04"):
        node = judge(host(name, PRE), name)
        assert node["verdict"] == "pass", (name, codes(node))
        assert node["checks"]["training_env_facts"]["verdict"] == "pass"


def test_riser_finding_names_gpu_pci_and_riser_before_rma():
    f = finding(judge(host("sim-node03"), "sim-node03"), "GPU_LOST")
    assert "sim-node03 GPU 3 (0000:61:00)" in f["message"] and f["pci"] == "0000:61:00"
    assert f["action"].startswith("reseat the riser") and "RMA" in f["action"]
    assert any("Xid (PCI:0000:61:00): 79" in line for line in f["evidence"])


def test_psu_rail_names_the_rail_and_every_gpu_points_at_the_psu():
    node = judge(host("sim-node04"), "sim-node04")
    psu = finding(node, "PSU_RAIL_LOSS")
    assert "GPUs 4, 5, 6, 7 (PSU B rail" in psu["message"] and "PSU B" in psu["action"]
    lost = [f for f in node["findings"] if f["code"] == "GPU_LOST"]
    assert sorted(f["gpu"] for f in lost) == [4, 5, 6, 7]
    assert all("PSU B" in f["action"] for f in lost)


def test_the_burn_figures_join_by_pci_and_the_lost_gpu_gets_none():
    """GPU 3 died during the burn: its Gflop/s stay its own; the seven others keep theirs (joined by UUID/PCI)."""
    node = judge(host("sim-node03"), "sim-node03")
    by_index = {g["index"]: g for g in node["gpus"]}
    pcis = {g["index"]: g["pci"] for g in host("sim-node03")["ansible_facts"]["gpufleet_gpus"]}
    for index, gpu in by_index.items():
        assert gpu["pci"] == pcis.get(index, gpu["pci"])
    assert all(by_index[i]["metrics"].get("burn_gflops") for i in (0, 1, 2, 4, 5, 6, 7))
    assert by_index[3]["verdict"] == "fail"
    assert "gflops" in node["series"] and set(node["series"]["gflops"]) == {str(i) for i in range(8)}


def test_samples_continue_after_a_gpu_is_lost():
    """The sampler keeps sampling the seven healthy GPUs after GPU 3 fell off the bus."""
    node = judge(host("sim-node03"), "sim-node03")
    temps = node["series"]["temperature_c"]
    samples = host("sim-node03")["gpufleet_result_gpu_sample"]
    assert samples["problems"][0]["kind"] == "lost" and not samples["stopped_early"]
    assert len(temps["0"]) == len(samples["samples"]) >= 3 and len(temps.get("3", [])) < len(temps["0"])


# --- faults made from a healthy node's observations -------------------------------------------------------------

def plant_hot(hv, temp=91):
    """GPU 1 at `temp` in every sample, with the simulator's compressed times stretched back to real seconds."""
    for s in hv["gpufleet_result_gpu_sample"]["samples"]:
        s["t_s"] = s["t_s"] * 100
        for g in s["gpus"]:
            if g["index"] == 1:
                g["temperature_c"] = temp


def test_sustained_heat_fails_and_a_short_spike_does_not():
    hv = host()
    plant_hot(hv)
    f = finding(judge(hv), "THERMAL_SUSTAINED")
    assert f["gpu"] == 1 and "above 85 C" in f["message"]
    hv = host()
    samples = hv["gpufleet_result_gpu_sample"]["samples"]
    hot = [s for s in samples if any(loaded(g) for g in s["gpus"])][:1]
    for s in hot:
        for g in s["gpus"]:
            g["temperature_c"] = 95
    assert "THERMAL_SUSTAINED" not in codes(judge(hv))


def test_inventory_threshold_changes_the_answer():
    hv = host()
    plant_hot(hv, temp=80)
    assert "THERMAL_SUSTAINED" not in codes(judge(hv))
    hv["gpufleet_temp_max_c"] = 75
    assert "THERMAL_SUSTAINED" in codes(judge(hv))


def test_thermal_throttle_warns():
    hv = host()
    for g in rows(hv):
        if g["index"] == 6 and loaded(g):
            g["throttle_reasons"] = ["sw_thermal_slowdown"]
    f = finding(judge(hv), "THERMAL_THROTTLE")
    assert f["severity"] == "warn" and f["gpu"] == 6


def test_pcie_below_max_under_load_fails_but_idle_downclock_does_not():
    hv = host(RTX)
    for g in rows(hv):
        if g["index"] == 2 and loaded(g):
            g["pcie_gen_current"], g["pcie_width_current"] = 3, 8
    f = finding(judge(hv, RTX), "PCIE_DEGRADED")
    assert f["gpu"] == 2 and "gen 3 x8, max gen 5 x16" in f["message"]
    hv = host(RTX)
    for g in rows(hv):
        if not loaded(g):
            g["pcie_gen_current"] = 1
    assert "PCIE_DEGRADED" not in codes(judge(hv, RTX))


@pytest.mark.parametrize("field,value,code", [
    ("retired_pages_sbe", 60, "RETIRED_PAGES_EXHAUSTED"),
    ("retired_pages_pending", True, "RETIRED_PAGES_PENDING"),
    ("remapped_rows_failure", True, "ROW_REMAP_FAILURE"),
    ("remapped_rows_uncorrectable", 470, "REMAPPED_ROWS_EXHAUSTED"),
    ("remapped_rows_pending", True, "ROW_REMAP_PENDING"),
    ("ecc_volatile_uncorrected", 2, "ECC_UNCORRECTED"),
])
def test_memory_health_counters(field, value, code):
    hv = host()
    hv["ansible_facts"]["gpufleet_gpus"][4][field] = value
    f = finding(judge(hv), code)
    assert f["severity"] == "fail" and f["gpu"] == 4 and f["pci"] == "0000:9a:00"


def test_counters_just_below_the_limits_pass():
    hv = host()
    hv["ansible_facts"]["gpufleet_gpus"][4].update(retired_pages_sbe=57, remapped_rows_uncorrectable=459)
    assert judge(hv)["verdict"] == "pass"


@pytest.mark.parametrize("code,found,severity", [(48, "XID_RMA", "fail"), (63, "XID_RMA", "fail"),
                                                 (92, "ECC_LEAK", "warn"), (79, "GPU_LOST", "fail"),
                                                 (119, "XID_CRITICAL", "fail"), (999, "XID_WARNING", "warn")])
def test_xid_codes(code, found, severity):
    hv = host()
    xid_event(hv, code, gpu=5)
    f = finding(judge(hv), found)
    assert f["severity"] == severity and f["gpu"] == 5


def test_severity_override_from_the_inventory():
    hv = host()
    xid_event(hv, 119, gpu=1)
    hv["gpufleet_xid_severity_overrides"] = {"119": "info"}
    assert "XID_CRITICAL" not in codes(judge(hv))


def test_correlated_xid_45_is_on_the_timeline_only():
    hv = host()
    event = xid_event(hv, 45, gpu=1)
    event.update(counted=False, correlated_with={"xid": 79, "line": "..."})
    node = judge(hv)
    assert node["findings"] == [] and any(e["xid"] == 45 for e in node["xid_timeline"])


def test_gpus_lost_hours_apart_on_different_rails_are_risers_not_a_psu():
    hv = host(RTX)
    xid_event(hv, 79, gpu=1, time="2026-11-30T01:00:00+00:00")
    xid_event(hv, 79, gpu=6, time="2026-11-30T05:00:00+00:00")
    node = judge(hv, RTX)
    assert "PSU_RAIL_LOSS" not in codes(node) and codes(node).count("GPU_LOST") == 2


def test_lost_gpu_seen_only_by_nvidia_smi_is_lost_with_its_index_from_pci_order():
    hv = host()
    gpus = hv["ansible_facts"]["gpufleet_gpus"]
    gone = gpus.pop(3)
    hv["ansible_facts"]["gpufleet_gpu_count"] = 7
    hv["ansible_facts"]["gpufleet_gpu_problems"].append({
        "kind": "lost", "pci": gone["pci"], "index": None, "reason": "GPU is lost",
        "message": "Unable to determine the device handle for GPU %s: GPU is lost" % gone["pci"]})
    node = judge(hv)
    f = finding(node, "GPU_LOST")
    assert f["gpu"] == 3 and "inferred from PCI bus order" in f["message"]
    assert "GPU_MISSING" not in codes(node), "a lost GPU explains the missing one"


def test_fewer_gpus_than_expected_is_missing():
    hv = host()
    del hv["ansible_facts"]["gpufleet_gpus"][6:]
    hv["ansible_facts"]["gpufleet_gpu_count"] = 6
    f = finding(judge(hv), "GPU_MISSING")
    assert "shows 6 GPU(s)" in f["message"] and "8 expected" in f["message"]


def test_unreadable_nvidia_smi_is_an_error_never_a_pass():
    hv = host()
    hv["ansible_facts"].update(gpufleet_gpus=[], gpufleet_gpu_count=0, gpufleet_gpu_problems=[
        {"kind": "unparsable_output", "pci": None, "index": None,
         "message": "nvidia-smi --query-gpu printed a line that is not a row of the query", "line": "garbage"}])
    node = judge(hv)
    # The tool failed, not the hardware: one headline naming nvidia-smi and its fix; the GPUs it could not read are
    # unknown (the burn saw them: error, never pass); "0 of 8 GPUs" is its evidence, not a reason to reseat risers.
    assert node["verdict"] == "error" and node["worst"]["code"] == "GPU_FACTS_UNREADABLE"
    assert "fix nvidia-smi on" in node["action"] and "reseat" not in node["action"]
    assert codes(node) == ["GPU_FACTS_UNREADABLE"], codes(node)
    assert any("GPU_MISSING" in e for e in node["worst"]["evidence"])
    assert node["gpus"] and all(g["verdict"] == "error" for g in node["gpus"])
    assert node["checks"]["gpu_facts"]["verdict"] == "error"
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import history as history_rules

    history_rules.add_findings(node, "trend", [])  # the history's checks, added after: the GPUs stay unknown
    assert all(g["verdict"] == "error" for g in node["gpus"]) and node["verdict"] == "error"


def test_nccl_busbw_below_the_inventory_floor_fails_with_figure_threshold_and_source():
    hv = host()
    hv["gpufleet_nccl_min_busbw_gbps"] = 400
    node = judge(hv)
    f = finding(node, "NCCL_BUSBW_LOW")
    assert "< 400.0 GB/s" in f["message"]
    figures = node["checks"]["nccl_test"]["figures"]
    assert figures["min_busbw_gbps"] == 400 and "inventory" in figures["threshold_source"]


def test_nccl_unknown_model_has_no_baseline():
    hv = host()
    for g in hv["ansible_facts"]["gpufleet_gpus"]:
        g["name"] = "NVIDIA Mystery 9000"
    for g in hv["gpufleet_result_nccl_test"]["gpus"]:
        g["name"] = "NVIDIA Mystery 9000"
    assert finding(judge(hv), "NCCL_NO_BASELINE")["severity"] == "warn"


def test_the_node_verdict_is_never_trusted():
    """A result that says pass with failing figures is a fail in the report."""
    hv = host()
    nccl = hv["gpufleet_result_nccl_test"]
    assert nccl["verdict"] == "pass"
    for row in nccl["rows"]:
        row["oop_busbw_gbps"] = row["ip_busbw_gbps"] = 0.0
    nccl["peak_busbw_gbps"] = 0.0
    node = judge(hv)
    assert node["verdict"] == "fail" and finding(node, "NCCL_BUSBW_LOW")
    assert nccl["verdict"] == "pass"


def test_a_key_outside_the_schema_is_an_error_naming_it():
    hv = host()
    hv["gpufleet_result_nccl_test"]["busbw_gbps"] = 377.0  # the alias an older reader guessed
    node = judge(hv)
    f = finding(node, "RESULT_INVALID")
    assert "busbw_gbps" in f["message"] and f["check"] == "nccl_test"
    assert node["checks"]["nccl_test"]["verdict"] == "error"


def test_a_wrong_type_is_an_error_naming_the_key():
    hv = host()
    hv["gpufleet_result_gpu_burn"]["gpus"][2]["status"] = "great"
    f = finding(judge(hv), "RESULT_INVALID")
    assert "gpus[2].status" in f["message"]


def test_an_unknown_result_name_is_an_error():
    hv = host()
    hv["gpufleet_result_samples"] = hv.pop("gpufleet_result_gpu_sample")
    assert "gpufleet_result_samples" in finding(judge(hv), "RESULT_INVALID")["message"]


def test_busy_gpu_and_the_ignore_list():
    hv = host("sim-node07", PRE)
    node = judge(hv, "sim-node07")
    busy = finding(node, "GPU_BUSY")
    assert busy["gpu"] == 4 and "PID" in busy["message"]
    hv["gpufleet_busy_ignore_processes"] = [p["name"].rsplit("/", 1)[-1]
                                            for g in hv["ansible_facts"]["gpufleet_gpus"] for p in g["processes"]]
    hv.pop("gpufleet_refused_reason")
    assert "GPU_BUSY" not in codes(judge(hv, "sim-node07"))


def test_refused_checks_are_skipped_with_the_reason_and_the_node_is_error():
    node = judge(host("sim-node07"), "sim-node07")
    assert node["verdict"] == "error"
    burn = node["checks"]["gpu_burn"]
    assert burn["verdict"] == "skipped" and "GPU 4 busy" in burn["reasons"][0]


def test_disabled_check_says_so():
    hv = host()
    hv["gpufleet_result_dcgm_diag"] = {"changed": False, "skipped": True,
                                       "skip_reason": "disabled: gpufleet_dcgm_enabled is false"}
    check = judge(hv)["checks"]["dcgm_diag"]
    assert check["verdict"] == "skipped" and check["reasons"] == ["not run: disabled: gpufleet_dcgm_enabled is false"]


def test_a_tool_that_could_not_run_is_an_error_with_its_reason():
    hv = host()
    hv["gpufleet_result_dcgm_diag"] = dict(
        verdict="pass", reasons=[], evidence=[], not_run=None, level_requested=3, level_reason="requested",
        tool={"argv": ["dcgmi", "diag", "-r", "3", "-j"], "rc": None, "timed_out": False, "duration_s": 0.0,
              "error": "dcgmi not found: install DCGM (datacenter-gpu-manager) or pass executable="})
    node = judge(hv)
    f = finding(node, "CHECK_ERROR")
    assert "dcgmi not found" in f["message"] and node["verdict"] == "error"


def test_a_failed_stage_keeps_the_node_reachable_and_its_findings():
    hv = host("sim-node06")
    hv["gpufleet_result_dcgm_diag"] = {"failed": True, "stage": "dcgm", "msg": "stage dcgm failed: boom"}
    node = judge(hv, "sim-node06")
    assert node["reachable"] and node["verdict"] == "fail"
    assert "PCIE_DEGRADED" in codes(node) and "CHECK_ERROR" in codes(node)
    # A task after the module (the burn's stop mark) failed: the module's result and findings stay.
    hv = host("sim-node06")
    hv["gpufleet_stage_failures"] = [{"stage": "burn", "result": "gpu_sample", "msg": "stage burn failed: disk"}]
    node = judge(hv, "sim-node06")
    assert "PCIE_DEGRADED" in codes(node) and "STAGE_ERROR" in codes(node) and node["reachable"]


def test_a_stopped_node_is_run_stopped_not_unreachable():
    hv = host()
    hv.pop("gpufleet_completed")
    hv["gpufleet_stage"] = "burn"
    hv["gpufleet_result_run"] = {"stage": "burn", "msg": "an unexpected failure", "evidence": []}
    node = judge(hv)
    assert node["reachable"] and node["verdict"] == "error" and "RUN_STOPPED" in codes(node)


@pytest.mark.parametrize("msg,words", [
    ("Failed to connect to the host via ssh: ssh: Could not resolve hostname node9: Name or service not known",
     "hostname does not resolve"),
    ("Failed to connect to the host via ssh: ssh: connect to host 10.0.0.9 port 22: Connection refused",
     "connection refused"),
    ("Failed to connect to the host via ssh: root@10.0.0.9: Permission denied (publickey).", "permission denied"),
    ("Failed to connect to the host via ssh: ssh: connect to host 10.0.0.9 port 22: No route to host",
     "no route to host"),
])
def test_unreachable_says_the_real_ssh_error(msg, words):
    hv = host()
    hv.pop("gpufleet_completed")
    hv["gpufleet_stage"] = "facts"
    hv["gpufleet_result_gpu_facts"] = {"unreachable": True, "msg": msg, "changed": False}
    node = judge(hv, in_play=False)
    f = finding(node, "UNREACHABLE")
    assert node["verdict"] == "unreachable" and words in f["message"] and msg in f["evidence"]


def test_never_reached_host_is_unreachable():
    node = judge({}, "ghost")
    assert node["verdict"] == "unreachable"


def test_config_error_names_host_variable_and_type_and_keeps_the_default():
    hv = host()
    hv["gpufleet_temp_max_c"] = "85C"
    node = judge(hv)
    f = finding(node, "CONFIG_INVALID")
    assert "gpufleet_temp_max_c" in f["message"] and "sim-node02" in f["message"] and "'85C'" in f["message"]
    assert node["thresholds"]["gpufleet_temp_max_c"] == 85.0


def test_a_rule_crash_becomes_an_error_naming_the_rule(monkeypatch):
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import nccl

    def boom(node, data):
        raise KeyError("surprise")

    monkeypatch.setattr(nccl, "apply", boom)
    node = judge(host())
    f = finding(node, "RULE_ERROR")
    assert "nccl_test" in f["message"] and node["verdict"] == "error"


def test_environment_missing_names_the_variable_and_never_the_deprecated_one():
    hv = host("sim-node02", PRE)
    for var in hv["gpufleet_result_training_env_facts"]["variables"]:
        if var["name"] == "TORCH_NCCL_ASYNC_ERROR_HANDLING":
            var["login_shell"] = None
    f = finding(judge(hv), "ENV_MISSING")
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in f["message"]
    assert "NCCL_ASYNC_ERROR_HANDLING=" not in f["action"].replace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["gpufleet_result_nccl_test", "gpufleet_result_gpu_burn", "ansible_facts",
                                        "gpufleet_result_gpu_sample", "gpufleet_stage", "gpufleet_temp_max_c",
                                        "gpufleet_result_run", "gpufleet_xid_before"]),
                       st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c,
                                                                                        max_size=3),
                                    max_leaves=8)))
def test_junk_never_raises_and_never_passes_silently(hv):
    node = rules.evaluate_node("junk", hv)
    assert node["verdict"] in NODE_VERDICTS
    if any(k.startswith("gpufleet_result_") for k in hv) and node["verdict"] == "pass":
        assert all(c["verdict"] in ("pass", "skipped") for c in node["checks"].values())


def test_the_rules_are_a_declared_pipeline_whose_order_follows_what_they_read():
    """Each rule says what it reads and writes; the order follows (on main the NCCL rule silently depended on the
    NVLink rule having set the node's interconnect first, by its place in the code)."""
    names = [r.name for r in rules.ORDER]
    assert names.index("nvlink") < names.index("nccl_test") and names.index("gpu_table") < names.index("gpu_burn")
    assert names[-1] == "consequences", "a tool's failure folds what follows from it after every rule has judged"
    shuffled = list(reversed(rules.PIPELINE))
    order = [r.name for r in rules.ordered(shuffled)]
    assert order.index("nvlink") < order.index("nccl_test") and order[-1] == "consequences"
    nccl = next(r for r in rules.PIPELINE if r.name == "nccl_test")
    assert "interconnect" in nccl.reads
    with pytest.raises(ValueError, match="reads interconnect, which no rule writes"):
        rules.ordered([r for r in rules.PIPELINE if r.name != "nvlink"])
    loop = [rules.Rule("a", ("x",), ("y",), None), rules.Rule("b", ("y",), ("x",), None)]
    with pytest.raises(ValueError, match="wait on each other"):
        rules.ordered(loop)


def test_a_node_that_entered_the_stage_done_finished_and_one_short_of_it_did_not():
    # The stage `done` is entered by every node still in the play after the run's last check (stage_enter.yml): that is
    # the mark of a finished node, in the report and in an interrupted run's record (reach.completed).
    hv = host()
    hv.pop("gpufleet_completed")
    hv.pop("gpufleet_stage", None)
    hv["gpufleet_stages"] = {H100: "done", "sim-node01": "storage"}
    assert reach.completed(H100, hv) and not reach.completed("sim-node01", hv)
    node = judge(hv, in_play=False)
    assert node["reachable"] and "UNREACHABLE" not in codes(node)
    hv["gpufleet_stages"][H100] = "storage"
    node = judge(hv, in_play=False)
    assert not node["reachable"] and "left the play at stage storage" in finding(node, "UNREACHABLE")["message"]
