"""Rule table: each planted fault -> expected node verdict, finding code, GPU and action words; healthy -> pass."""

import copy
import importlib.util
import json
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import rules
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "report"
_spec = importlib.util.spec_from_file_location("build_fleet", FIXTURES / "build_fleet.py")
fleet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fleet)
PCI = fleet.BASE_PCI


def healthy(model="NVIDIA H200"):
    return fleet.host(model)


def xid_event(code, gpu, time="2026-11-29T09:14:02.000000+00:00", severity="critical", body="..."):
    return {"xid": code, "pci": PCI[gpu], "severity": severity, "time": time,
            "line": fleet.xid_line(PCI[gpu], code, body)}


def set_xid(hv, events=(), lost=()):
    hv["ansible_facts"]["gpufleet_xid"] = fleet.xid(events, lost)


def set_gpu(hv, index, **values):
    hv["ansible_facts"]["gpufleet_gpus"][index].update(values)


def set_samples(hv, mutate, seconds=600, step=30):
    hv["gpufleet_result_samples"] = fleet.samples(seconds=seconds, step=step, mutate=mutate)


# --- the plants ------------------------------------------------------------------------------------------------------

def p_xid79(hv):
    set_xid(hv, [xid_event(79, 3, body="GPU has fallen off the bus.")])


def p_lost_list_only(hv):
    set_xid(hv, lost=[PCI[2]])


def p_lost_smi(hv):
    hv["ansible_facts"]["gpufleet_gpu_problems"] = [
        {"kind": "lost", "pci": None, "message": "Unable to determine the device handle for GPU 00000000:9A:00.0: "
                                                 "GPU is lost. Reboot the system to recover this GPU"}]


def _rail_b(hv, times):
    set_xid(hv, [xid_event(79, i, time=t) for i, t in zip(range(4, 8), times, strict=True)])
    hv["gpufleet_psu_rails"] = {"A": [0, 1, 2, 3], "B": [4, 5, 6, 7]}


def p_psu_window(hv):
    _rail_b(hv, ["2026-11-29T09:20:11.40%d+00:00" % k for k in range(4)])


def p_psu_no_times(hv):
    hv["ansible_facts"]["gpufleet_xid"] = fleet.xid(lost=[PCI[i] for i in range(4, 8)])
    hv["gpufleet_psu_rails"] = {"A": [0, 1, 2, 3], "B": [4, 5, 6, 7]}


def p_two_far_apart(hv):
    set_xid(hv, [xid_event(79, 1, time="2026-11-29T09:00:00+00:00"),
                 xid_event(79, 6, time="2026-11-29T11:00:00+00:00")])
    hv["gpufleet_psu_rails"] = {"A": [0, 1, 2, 3], "B": [4, 5, 6, 7]}


def p_group_no_rails(hv):
    set_xid(hv, [xid_event(79, i, time="2026-11-29T09:20:11.40%d+00:00" % i) for i in range(4, 8)])


def p_xid(code):
    def plant(hv):
        set_xid(hv, [xid_event(code, 6)])
    return plant


def p_retired_pages(n):
    def plant(hv):
        set_gpu(hv, 1, retired_pages_sbe=n // 2, retired_pages_dbe=n - n // 2)
    return plant


def p_remap_failure(hv):
    set_gpu(hv, 6, remapped_rows_failure=True, remapped_rows_uncorrectable=8)


def p_remap_pending(hv):
    set_gpu(hv, 6, remapped_rows_pending="Yes")


def p_xid92(hv):
    set_xid(hv, [xid_event(92, 2, severity="warning", body="High single-bit ECC error rate")])


def p_ecc_rising(hv):
    def leak(t, i, row):
        row["ecc_volatile_corrected"] = t // 60 if i == 2 else 0
    set_samples(hv, leak)


def p_pcie_load(hv):
    def slow(t, i, row):
        if i == 5:
            row["pcie_gen_current"], row["pcie_width_current"] = 3, 8
    set_samples(hv, slow)


def p_pcie_idle_only(hv):
    def idle_low(t, i, row):
        if t == 0:  # the first sample is idle (3 % util) and downclocked
            row["pcie_gen_current"] = 1
    set_samples(hv, idle_low)
    set_gpu(hv, 5, pcie_gen_current=1)  # facts taken at idle: never a finding


def p_nccl_low(hv):
    hv["gpufleet_result_nccl_test"] = fleet.nccl(251.4)


def p_nccl_low_inventory(hv):
    hv["gpufleet_result_nccl_test"] = fleet.nccl(300.0)
    hv["gpufleet_nccl_min_busbw_gbps"] = 400


def p_nccl_unknown_model(hv):
    for g in hv["ansible_facts"]["gpufleet_gpus"]:
        g["name"] = "NVIDIA Made-Up X9"


def p_hot(seconds_hot):
    def plant(hv):
        def hot(t, i, row):
            if i == 0 and 600 - seconds_hot <= t < 600:
                row["temperature_c"] = 89.5
        set_samples(hv, hot, step=10)
    return plant


def p_throttle(hv):
    def thr(t, i, row):
        if i == 3 and t >= 300:
            row["throttle_reasons"] = ["hw_thermal_slowdown"]
    set_samples(hv, thr)


def p_busy(hv):
    set_gpu(hv, 1, processes=[{"pid": 48213, "name": "/usr/bin/python3", "used_memory_mib": 61234}])


def p_burn_faulty(hv):
    hv["gpufleet_result_gpu_burn"] = fleet.burn(faulty=(2,))


def p_burn_died(hv):
    hv["gpufleet_result_gpu_burn"] = fleet.burn()
    hv["gpufleet_result_gpu_burn"]["gpus"][7]["status"] = "died"
    hv["gpufleet_result_gpu_burn"]["verdict"] = "fail"


def p_dcgm(status):
    def plant(hv):
        hv["gpufleet_result_dcgm_diag"] = fleet.dcgm(verdict=status, per={1: {"status": status,
                                                                                "failed_tests": ["memory"],
                                                                                "warned_tests": ["pcie"]}})
    return plant


def p_storage(verdict):
    def plant(hv):
        hv["gpufleet_result_checkpoint_storage"] = {
            "verdict": verdict, "reasons": ["/mnt/ckpt has 3 GiB free, 42 GiB needed for 3 checkpoints"],
            "evidence": ["statvfs f_bavail=..."]}
    return plant


def p_env(hv):
    hv["gpufleet_result_env"] = {"verdict": "warn", "reasons": ["TORCH_NCCL_ASYNC_ERROR_HANDLING is not set"],
                                 "evidence": [], "missing": ["TORCH_NCCL_ASYNC_ERROR_HANDLING"]}


def p_check_error(hv):
    hv["gpufleet_result_dcgm_diag"] = {"verdict": "error", "reasons": ["dcgmi not found: install DCGM"],
                                       "evidence": [], "tool": {"argv": ["dcgmi", "diag"], "rc": None,
                                                                "timed_out": False, "error": "ENOENT"}}


def p_task_failed(hv):
    hv["gpufleet_result_nccl_test"] = {"failed": True, "msg": "async task did not complete within the requested time"}


def p_unreachable(hv):
    hv["gpufleet_stage"] = "dcgm_diag"
    hv.pop("gpufleet_completed")
    hv["gpufleet_result_dcgm_diag"] = {"unreachable": True, "msg": "ssh: connect to host 10.0.0.7 port 22: No route"}


def p_dropped(hv):
    hv["gpufleet_stage"] = "nccl_test"
    hv.pop("gpufleet_completed")


CASES = [
    # id, plant, in_play, node verdict, code, gpu, words in the action
    ("xid79", p_xid79, None, "fail", "GPU_LOST", 3, "reseat the riser and recable GPU power before any RMA"),
    ("lost-list", p_lost_list_only, None, "fail", "GPU_LOST", 2, "reseat the riser"),
    ("lost-smi", p_lost_smi, None, "fail", "GPU_LOST", 4, "reseat the riser"),
    ("psu-window", p_psu_window, None, "fail", "PSU_RAIL_LOSS", None, "replace/check PSU B"),
    ("psu-whole-rail", p_psu_no_times, None, "fail", "PSU_RAIL_LOSS", None, "split rails are not redundancy"),
    ("group-no-rails", p_group_no_rails, None, "fail", "GPU_GROUP_LOST", None, "PSU"),
    ("xid48", p_xid(48), None, "fail", "XID_RMA", 6, "replace the card (RMA)"),
    ("xid63", p_xid(63), None, "fail", "XID_RMA", 6, "replace the card (RMA)"),
    ("xid64", p_xid(64), None, "fail", "XID_RMA", 6, "replace the card (RMA)"),
    ("retired-pages", p_retired_pages(60), None, "fail", "RETIRED_PAGES_EXHAUSTED", 1, "replace the card (RMA)"),
    ("remap-failure", p_remap_failure, None, "fail", "ROW_REMAP_FAILURE", 6, "replace the card (RMA)"),
    ("remap-pending", p_remap_pending, None, "fail", "ROW_REMAP_PENDING", 6, "RMA"),
    ("xid92", p_xid92, None, "warn", "ECC_LEAK", 2, "slow ECC leak: schedule replacement, watch"),
    ("ecc-rising", p_ecc_rising, None, "warn", "ECC_CORRECTED_RISING", 2, "slow ECC leak"),
    ("pcie-under-load", p_pcie_load, None, "fail", "PCIE_DEGRADED", 5, "riser"),
    ("nccl-low-default", p_nccl_low, None, "fail", "NCCL_BUSBW_LOW", None, "riser"),
    ("nccl-low-inventory", p_nccl_low_inventory, None, "fail", "NCCL_BUSBW_LOW", None, "topology"),
    ("nccl-no-baseline", p_nccl_unknown_model, None, "warn", "NCCL_NO_BASELINE", None, "gpufleet_nccl_min_busbw_gbps"),
    ("hot-sustained", p_hot(400), None, "fail", "THERMAL_SUSTAINED", 0, "airflow"),
    ("thermal-throttle", p_throttle, None, "warn", "THERMAL_THROTTLE", 3, "airflow"),
    ("busy", p_busy, None, "warn", "GPU_BUSY", 1, "PID 48213"),
    ("burn-faulty", p_burn_faulty, None, "fail", "BURN_FAULTY", 2, "RMA"),
    ("burn-died", p_burn_died, None, "fail", "BURN_FAULTY", 7, "gpu-burn"),
    ("dcgm-fail", p_dcgm("fail"), None, "fail", "DCGM_FAIL", 1, "dcgmi diag -r 3"),
    ("dcgm-warn", p_dcgm("warn"), None, "warn", "DCGM_WARN", 1, "dcgmi diag"),
    ("storage-fail", p_storage("fail"), None, "fail", "STORAGE_FAIL", None, "42 GiB needed"),
    ("storage-warn", p_storage("warn"), None, "warn", "STORAGE_WARN", None, "fix the checkpoint storage"),
    ("env-missing", p_env, None, "warn", "ENV_MISSING", None, "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ("check-error", p_check_error, None, "error", "CHECK_ERROR", None, "dcgmi not found"),
    ("task-failed", p_task_failed, None, "error", "CHECK_ERROR", None, "did not complete"),
    ("unreachable", p_unreachable, None, "unreachable", "UNREACHABLE", None, "stage dcgm_diag"),
    ("dropped-out", p_dropped, False, "unreachable", "UNREACHABLE", None, "stage nccl_test"),
]


@pytest.mark.parametrize("case_id,plant,in_play,verdict,code,gpu,words", CASES, ids=[c[0] for c in CASES])
def test_planted_fault(case_id, plant, in_play, verdict, code, gpu, words):
    hv = healthy()
    plant(hv)
    node = rules.evaluate_node("node-x", hv, in_play)
    assert node["verdict"] == verdict, [(f["code"], f["message"]) for f in node["findings"]]
    matching = [f for f in node["findings"] if f["code"] == code and f["gpu"] == gpu]
    assert matching, "expected %s on GPU %s, got %s" % (code, gpu, [(f["code"], f["gpu"]) for f in node["findings"]])
    finding = matching[0]
    assert words in finding["action"] or words in finding["message"], finding
    assert finding["evidence"], "every finding carries evidence"
    assert "node-x" in finding["message"], "messages name the host"
    if gpu is not None:
        assert next(g for g in node["gpus"] if g["index"] == gpu)["verdict"] == verdict
    assert node["worst"] is not None and node["action"]


@pytest.mark.parametrize("model", ["NVIDIA H200", "NVIDIA GeForce RTX 5090", "NVIDIA A100-SXM4-80GB"])
def test_healthy_node_passes_with_no_findings(model):
    hv = healthy(model)
    hv["gpufleet_result_nccl_test"] = fleet.nccl({"NVIDIA H200": 489.3, "NVIDIA GeForce RTX 5090": 52.0,
                                                   "NVIDIA A100-SXM4-80GB": 228.0}[model])
    node = rules.evaluate_node("node-ok", hv)
    assert node["findings"] == [] and node["verdict"] == "pass" and node["action"] is None
    assert all(g["verdict"] == "pass" for g in node["gpus"]) and len(node["gpus"]) == 8
    assert node["checks"]["gpu_burn"]["verdict"] == "pass"


def test_psu_loss_names_the_rail_and_its_gpus_point_at_the_psu():
    hv = healthy()
    p_psu_window(hv)
    node = rules.evaluate_node("node-x", hv)
    psu = [f for f in node["findings"] if f["code"] == "PSU_RAIL_LOSS"]
    assert len(psu) == 1 and "GPUs 4, 5, 6, 7" in psu[0]["message"] and "PSU B" in psu[0]["message"]
    lost = [f for f in node["findings"] if f["code"] == "GPU_LOST"]
    assert sorted(f["gpu"] for f in lost) == [4, 5, 6, 7]
    assert all("PSU B" in f["action"] and "riser" not in f["action"] for f in lost)
    assert node["worst"]["code"] == "PSU_RAIL_LOSS"


def test_gpus_lost_on_different_rails_hours_apart_are_risers_not_psu():
    hv = healthy()
    p_two_far_apart(hv)
    node = rules.evaluate_node("node-x", hv)
    codes = sorted(f["code"] for f in node["findings"])
    assert codes == ["GPU_LOST", "GPU_LOST"]
    assert all("reseat the riser" in f["action"] for f in node["findings"])


def test_idle_downclock_is_not_a_finding():
    hv = healthy()
    p_pcie_idle_only(hv)
    node = rules.evaluate_node("node-x", hv)
    assert node["verdict"] == "pass", node["findings"]


def test_short_heat_spike_is_not_sustained():
    hv = healthy()
    p_hot(60)(hv)
    node = rules.evaluate_node("node-x", hv)
    assert "THERMAL_SUSTAINED" not in [f["code"] for f in node["findings"]]
    assert next(g for g in node["gpus"] if g["index"] == 0)["metrics"]["seconds_above_temp_limit_s"] == 60.0


def test_retired_pages_below_the_threshold_pass():
    hv = healthy()
    p_retired_pages(10)(hv)
    assert rules.evaluate_node("node-x", hv)["verdict"] == "pass"


def test_nccl_shows_figure_threshold_and_source():
    hv = healthy()
    p_nccl_low(hv)
    node = rules.evaluate_node("node-x", hv)
    fig = node["checks"]["nccl_test"]["figures"]
    assert fig["busbw_gbps"] == 251.4 and fig["min_busbw_gbps"] == 336.0
    assert "H200" in fig["threshold_source"] and "0.7" in fig["threshold_source"]
    msg = next(f for f in node["findings"] if f["code"] == "NCCL_BUSBW_LOW")["message"]
    assert "251.4" in msg and "336.0" in msg and "built-in reference for H200" in msg
    hv = healthy()
    p_nccl_low_inventory(hv)
    fig = rules.evaluate_node("node-x", hv)["checks"]["nccl_test"]["figures"]
    assert fig["min_busbw_gbps"] == 400 and fig["threshold_source"] == "inventory gpufleet_nccl_min_busbw_gbps"


def test_skipped_checks_are_shown_skipped_and_refusal_is_never_a_pass():
    hv = healthy()
    p_busy(hv)
    for name in ("gpu_burn", "dcgm_diag", "nccl_test"):
        hv["gpufleet_result_" + name] = {"skipped": True, "skip_reason": "Conditional result was False"}
    hv["gpufleet_refused_reason"] = "GPU 1 busy: invasive checks not run"
    node = rules.evaluate_node("node-x", hv)
    assert node["checks"]["gpu_burn"]["verdict"] == "skipped"
    assert node["verdict"] == "error" and node["worst"]["code"] == "CHECKS_REFUSED"


def test_never_reached_host_is_unreachable():
    node = rules.evaluate_node("ghost", {})
    assert node["verdict"] == "unreachable" and "never reached" in node["findings"][0]["message"]


def test_rule_crash_becomes_an_error_finding(monkeypatch):
    def boom(node, results):
        raise KeyError("surprise")
    monkeypatch.setattr(rules, "rule_samples", boom)
    node = rules.evaluate_node("node-x", healthy())
    assert node["verdict"] == "error" and node["findings"][0]["code"] == "RULE_ERROR"
    assert "surprise" in node["findings"][0]["message"]


_junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                   max_size=4), max_leaves=12)
_KEYS = ["gpufleet_gpus", "gpufleet_xid", "gpufleet_result_gpu_burn", "gpufleet_result_samples",
         "gpufleet_result_nccl_test", "gpufleet_result_dcgm_diag", "gpufleet_stage", "gpufleet_psu_rails",
         "gpufleet_result_env", "gpufleet_gpu_problems"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(_KEYS), _junk, max_size=6))
def test_junk_input_never_raises_and_never_passes_silently(hv):
    node = rules.evaluate_node("junk", copy.deepcopy(hv))
    assert node["verdict"] in rules.SEVERITY_ORDER
    assert not any(f["code"] == "RULE_ERROR" for f in node["findings"]), node["findings"]
    json.dumps(node, allow_nan=False)


def test_lost_gpus_absent_from_facts_get_their_index_from_pci_order():
    """Preflight after a PSU loss: nvidia-smi no longer lists GPUs 4-7 (contracts), xid_facts names their PCI."""
    hv = healthy("NVIDIA GeForce RTX 5090")
    hv["ansible_facts"]["gpufleet_gpus"] = hv["ansible_facts"]["gpufleet_gpus"][:4]
    hv["ansible_facts"]["gpufleet_gpu_count"] = 4
    hv["ansible_facts"]["gpufleet_xid"] = fleet.xid(lost=[PCI[i] for i in (7, 5, 4, 6)])
    hv["gpufleet_psu_rails"] = {"A": [0, 1, 2, 3], "B": [4, 5, 6, 7]}
    node = rules.evaluate_node("node-x", hv)
    assert node["worst"]["code"] == "PSU_RAIL_LOSS" and "PSU B" in node["worst"]["action"]
    lost = {f["gpu"]: f["pci"] for f in node["findings"] if f["code"] == "GPU_LOST"}
    assert lost == {4: PCI[4], 5: PCI[5], 6: PCI[6], 7: PCI[7]}
    assert "inferred from PCI bus order" in node["findings"][1]["message"]


def test_index_is_not_guessed_when_the_known_order_disagrees():
    hv = healthy()
    gpus = hv["ansible_facts"]["gpufleet_gpus"][:2]
    gpus[0]["index"], gpus[1]["index"] = 1, 0  # not in PCI order: no inference
    hv["ansible_facts"]["gpufleet_gpus"] = gpus
    hv["ansible_facts"]["gpufleet_xid"] = fleet.xid(lost=[PCI[5]])
    node = rules.evaluate_node("node-x", hv)
    lost = [f for f in node["findings"] if f["code"] == "GPU_LOST"]
    assert len(lost) == 1 and lost[0]["gpu"] is None and lost[0]["pci"] == PCI[5]
    assert PCI[5] in lost[0]["message"]


def test_correlated_xid_is_on_the_timeline_but_not_a_finding():
    hv = healthy()
    event = xid_event(45, 2, severity="warning")
    event["counted"] = False
    set_xid(hv, [event])
    node = rules.evaluate_node("node-x", hv)
    assert node["verdict"] == "pass" and [e["xid"] for e in node["xid_timeline"]] == [45]


def test_env_names_the_variables_from_training_env_facts():
    hv = healthy()
    hv["gpufleet_result_env"] = {"verdict": "fail", "reasons": ["TORCH_NCCL_ASYNC_ERROR_HANDLING missing in systemd"],
                                 "evidence": ["(absent) TORCH_NCCL_ASYNC_ERROR_HANDLING"],
                                 "variables": [{"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "status": "systemd_missing"},
                                               {"name": "TORCH_NCCL_TRACE_BUFFER_SIZE", "status": "ok"}]}
    node = rules.evaluate_node("node-x", hv)
    finding = node["worst"]
    assert node["verdict"] == "fail" and finding["code"] == "ENV_MISSING"
    assert "set TORCH_NCCL_ASYNC_ERROR_HANDLING for" in finding["action"] and "TRACE_BUFFER" not in finding["action"]


def test_skipped_check_says_why_it_did_not_run():
    hv = healthy()
    skip = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False",
            "false_condition": "gpufleet_burn_enabled and not __gpufleet_refused"}
    hv["gpufleet_result_gpu_burn"] = dict(skip)
    hv["gpufleet_refused_reason"] = "GPU 4 busy: invasive checks not run (stop the process or set gpufleet_force=true)"
    node = rules.evaluate_node("node-x", hv)
    assert node["checks"]["gpu_burn"] == {"verdict": "skipped", "figures": {},
                                          "reasons": ["not run: " + hv["gpufleet_refused_reason"]]}
    hv.pop("gpufleet_refused_reason")
    hv["gpufleet_result_gpu_burn"] = dict(skip, false_condition="gpufleet_checkpoint_path | length > 0")
    node = rules.evaluate_node("node-x", hv)
    assert node["checks"]["gpu_burn"]["reasons"] == ["not run: disabled (gpufleet_checkpoint_path | length > 0)"]


def test_a_node_stopped_by_the_playbook_rescue_is_an_error_naming_the_variable():
    hv = healthy()
    hv["gpufleet_result_run"] = {
        "verdict": "error",
        "reasons": ["stopped at stage start: Validation of arguments failed: argument 'gpufleet_burn_duration_s' "
                    "is of type str and we were unable to convert to int"],
        "evidence": ["argument 'gpufleet_burn_duration_s' is of type str and we were unable to convert to int"]}
    node = rules.evaluate_node("node-x", hv)
    stopped = [f for f in node["findings"] if f["code"] == "RUN_STOPPED"]
    assert node["verdict"] == "error" and len(stopped) == 1
    assert "gpufleet_burn_duration_s" in stopped[0]["message"] and "argument_specs" in stopped[0]["action"]
