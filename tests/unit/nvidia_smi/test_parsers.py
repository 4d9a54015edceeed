"""Parsers of nvidia-smi output against the fixture files (formats and traps of docs/signals.md section 2)."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import nvidia_smi as n

QUERY = ["index", "pci.bus_id", "temperature.gpu", "power.draw"]


def _by_index(parsed):
    return {row["values"]["index"]: row["values"] for row in parsed["gpus"]}


# ---------------------------------------------------------------- --query-gpu csv


def test_datacenter_csv_values_are_typed(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("h100/query_gpu.csv"))
    assert len(parsed["gpus"]) == 8
    assert parsed["problems"] == [] and parsed["unparsed"]["count"] == 0
    gpu3 = _by_index(parsed)[3]
    assert gpu3["pci.bus_id"] == "0000:5d:00"
    assert gpu3["power.draw"] == pytest.approx(73.4)
    assert gpu3["ecc.mode.current"] == "enabled"
    assert (gpu3["ecc.errors.corrected.aggregate.total"], gpu3["ecc.errors.uncorrected.aggregate.total"]) == (17, 2)
    assert (gpu3["remapped_rows.correctable"], gpu3["remapped_rows.uncorrectable"]) == (2, 1)
    assert gpu3["remapped_rows.pending"] is True and gpu3["remapped_rows.failure"] is False
    assert gpu3["gpu_recovery_action"] == "drain_and_reset"
    # H100 has no page retirement: [N/A] must become None, not a string
    assert gpu3["retired_pages.sbe"] is None and gpu3["retired_pages.pending"] is None
    assert _by_index(parsed)[5]["clocks_event_reasons.active"] == 0x44
    assert _by_index(parsed)[6]["persistence_mode"] is False


def test_consumer_csv_ecc_and_remapped_rows_are_none(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("rtx4090/query_gpu.csv"))
    assert len(parsed["gpus"]) == 4 and parsed["problems"] == []
    for gpu in _by_index(parsed).values():
        for field in ("ecc.mode.current", "ecc.errors.corrected.volatile.total", "remapped_rows.correctable",
                      "remapped_rows.pending", "serial"):
            assert gpu[field] is None, field
    assert _by_index(parsed)[2]["pcie.link.width.current"] == 8


def test_every_na_spelling_is_none_and_errors_are_reported(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("csv/na_spellings.csv"))
    gpus = _by_index(parsed)
    assert len(gpus) == 7
    for index in (0, 1, 2, 6):  # [N/A], N/A, [Not Supported], empty
        assert all(v is None for k, v in gpus[index].items() if k not in ("index", "pci.bus_id", "name")), gpus[index]
    assert gpus[3]["ecc.errors.uncorrected.volatile.total"] is None  # [Requested functionality has been deprecated]
    assert gpus[3]["temperature.gpu"] == 41
    for row in parsed["gpus"]:
        assert not any(isinstance(v, str) and v.startswith("[") for v in row["values"].values())
    unreadable = {(p["pci"], p["field"]) for p in parsed["problems"] if p["kind"] == "unreadable_field"}
    assert unreadable == {
        ("0000:81:00", "temperature.gpu"), ("0000:81:00", "ecc.errors.uncorrected.volatile.total"),
        ("0000:a1:00", "temperature.gpu"), ("0000:a1:00", "power.draw"), ("0000:a1:00", "clocks_event_reasons.active"),
    }
    assert all(p["kind"] == "unreadable_field" for p in parsed["problems"])


def test_names_with_commas_are_rejoined(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("csv/name_with_comma.csv"))
    gpus = _by_index(parsed)
    assert gpus[1]["name"] == "NVIDIA Graphics Device, rev A1, engineering sample"
    assert gpus[1]["temperature.gpu"] == 36 and gpus[1]["memory.total"] == 49140
    assert parsed["unparsed"]["count"] == 0


def test_noheader_rows_use_requested_fields_and_report_garbage(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("csv/noheader_mixed_garbage.csv"), QUERY)
    assert sorted(_by_index(parsed)) == [0, 3]
    assert parsed["unparsed"]["count"] == 3
    assert "this line is not a row of this query" in parsed["unparsed"]["samples"]
    lost = [p for p in parsed["problems"] if p["kind"] == "lost"]
    assert [p["pci"] for p in lost] == ["0000:3a:00"]


def test_lost_gpu_among_eight_is_a_problem_not_a_row(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("lost_gpu/query_gpu.csv"))
    assert len(parsed["gpus"]) == 7
    assert "0000:c1:00" not in [g["values"]["pci.bus_id"] for g in parsed["gpus"]]
    assert parsed["problems"] == [{
        "kind": "lost", "pci": "0000:c1:00", "index": None,
        "message": "Unable to determine the device handle for GPU 0000:C1:00.0: GPU is lost. Reboot the system to recover this GPU",
        "line": "Unable to determine the device handle for GPU 0000:C1:00.0: GPU is lost. Reboot the system to recover this GPU",
        "reason": "GPU is lost. Reboot the system to recover this GPU",
    }]


def test_rejected_field_is_named(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("csv/rejected_field.txt"), QUERY)
    assert parsed["rejected_fields"] == ["pcie.link.gen.gpucurrent"]
    assert parsed["gpus"] == [] and parsed["problems"] == []
    # the same message on stderr
    assert n.parse_tool_messages(fixture_text("csv/rejected_field.txt"))["rejected_fields"] == ["pcie.link.gen.gpucurrent"]


def test_driver_not_loaded_is_a_tool_error(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("driver_not_loaded/query_gpu.csv"), QUERY)
    assert parsed["gpus"] == []
    assert [p["kind"] for p in parsed["problems"]] == ["tool_error"]
    assert "couldn't communicate with the NVIDIA driver" in parsed["problems"][0]["message"]


@pytest.mark.parametrize("line,pci", [
    ("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error", "0000:3b:00"),
    ("Unable to determine the device handle for GPU 00000000:C1:00.0: GPU is lost. Reboot the system to recover this GPU",
     "0000:c1:00"),
])
def test_device_handle_variants(line, pci):
    problems = n.parse_tool_messages(line)["problems"]
    assert [p["pci"] for p in problems] == [pci]
    # NVML has no handle for this GPU whatever the reason ("Unknown Error" included): nothing can be read from it
    assert problems[0]["kind"] == "lost"


def test_old_driver_csv_with_old_names(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("v100_r418/query_gpu.csv"))
    assert "pcie.link.gen.current" in parsed["fields"] and "clocks_throttle_reasons.active" in parsed["fields"]
    gpu1 = _by_index(parsed)[1]
    assert (gpu1["retired_pages.sbe"], gpu1["retired_pages.dbe"], gpu1["retired_pages.pending"]) == (4, 1, True)
    assert n.decode_throttle_mask(gpu1["clocks_throttle_reasons.active"]) == ["hw_slowdown", "sw_thermal_slowdown"]


def test_convert_value_rejects_nonsense_numbers():
    assert n.convert_value("1.5", "int") == (None, "unreadable")
    assert n.convert_value("abc", "float") == (None, "unreadable")
    assert n.convert_value("16x", "int") == (16, "ok")
    assert n.convert_value("maybe", "bool") == (None, "unreadable")
    assert n.convert_value("0xZZ", "bitmask") == (None, "unreadable")
    assert n.convert_value("[GPU is lost]", "int") == (None, "lost")


@pytest.mark.parametrize("cell", ["1e309", "1.5e3", "12abc", "0x10", "-3", "+3", "-0", "1_000", "5 5", "inf", "nan",
                                  "\u0663", "1.", ".5", "3 MiBs"])
@pytest.mark.parametrize("kind", ["int", "float"])
def test_numbers_are_read_whole_or_not_at_all(cell, kind):
    # A prefix is never a value: "1e309" is not 1, "0x10" not 0, "12abc" not 12; nvidia-smi prints none of these.
    assert n.convert_value(cell, kind) == (None, "unreadable")


@pytest.mark.parametrize("cell,kind,value", [("45", "int", 45), ("45 %", "int", 45), ("250.00 W", "float", 250.0),
                                             ("1024 MiB", "int", 1024), ("16x", "int", 16), ("7.0", "int", 7),
                                             ("98765432109876543210", "int", 98765432109876543210)])
def test_numbers_with_the_units_nvidia_smi_prints(cell, kind, value):
    assert n.convert_value(cell, kind) == (value, "ok")


def test_a_negative_counter_is_an_unreadable_field_not_a_value():
    text = "0, 00000000:01:00.0, -2, 0\n"
    parsed = n.parse_query_gpu(text, ["index", "pci.bus_id", "remapped_rows.uncorrectable",
                                      "ecc.errors.uncorrected.volatile.total"])
    (row,) = parsed["gpus"]
    assert row["values"]["remapped_rows.uncorrectable"] is None
    assert row["values"]["ecc.errors.uncorrected.volatile.total"] == 0
    assert [(p["kind"], p["message"]) for p in parsed["problems"]] == [
        ("unreadable_field", "remapped_rows.uncorrectable: -2")]


def test_throttle_mask_decoding_keeps_unknown_bits():
    assert n.decode_throttle_mask(0) == []
    assert n.decode_throttle_mask(0x1) == ["gpu_idle"]
    assert n.decode_throttle_mask(0x44) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert n.decode_throttle_mask(0x200 | 0x80) == ["hw_power_brake_slowdown", "bit_0x200"]
    assert n.decode_throttle_mask(None) is None


@pytest.mark.parametrize("raw,expected", [
    ("None", "none"), ("Drain and Reset", "drain_and_reset"), ("4", "drain_and_reset"), ("GPU Reset", "gpu_reset"),
    ("Node Reboot", "node_reboot"), ("Drain P2P", "drain_p2p"), ("[N/A]", None), ("Recover IMEX Domain", "recover_imex_domain"),
])
def test_recovery_action_names(raw, expected):
    assert n.normalize_recovery_action(raw) == expected


# ---------------------------------------------------------------- --query-compute-apps


def test_compute_apps_busy_two_pids_with_spaces(fixture_text):
    parsed = n.parse_compute_apps(fixture_text("h100/compute_apps.csv"))
    assert [(p["pid"], p["name"], p["used_memory_mib"], p["pci"]) for p in parsed["processes"]] == [
        (48213, "/opt/conda/envs/train env/bin/python3.11", 59012, "0000:18:00"),
        (51977, "/home/ml user/jupyter kernels/python", 2210, "0000:18:00"),
    ]
    assert parsed["problems"] == [] and parsed["unparsed"]["count"] == 0


def test_compute_apps_idle_header_only_and_empty(fixture_text):
    assert n.parse_compute_apps(fixture_text("rtx4090/compute_apps.csv"))["processes"] == []
    empty = n.parse_compute_apps("")
    assert empty["processes"] == [] and empty["unparsed"]["count"] == 0


def test_compute_apps_noheader_comma_in_name_and_na_memory(fixture_text):
    parsed = n.parse_compute_apps(fixture_text("csv/compute_apps_busy_noheader.csv"))
    assert parsed["processes"][1]["name"] == "/srv/jobs/run 7, resumed/python"
    assert parsed["processes"][1]["used_memory_mib"] is None


def test_compute_apps_lost_gpu_message(fixture_text):
    parsed = n.parse_compute_apps(fixture_text("lost_gpu/compute_apps.csv"))
    assert parsed["processes"] == []
    assert [(p["kind"], p["pci"]) for p in parsed["problems"]] == [("lost", "0000:c1:00")]


# ---------------------------------------------------------------- -q


def test_q_new_generation(fixture_text):
    parsed = n.parse_q(fixture_text("h100/q.txt"))
    assert parsed["driver_version"] == "570.133.20" and parsed["attached_gpus"] == 8
    assert parsed["problems"] == [] and parsed["unparsed"]["count"] == 0
    gpus = {g["pci"]: g for g in parsed["gpus"]}
    assert len(gpus) == 8
    assert gpus["0000:9a:00"]["pcie_replays"] == 412
    assert gpus["0000:18:00"]["pcie_replays"] == 0
    assert gpus["0000:ab:00"]["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert gpus["0000:18:00"]["throttle_reasons"] == []
    assert gpus["0000:5d:00"]["remapped_rows_pending"] is True
    assert gpus["0000:5d:00"]["remapped_rows_correctable"] == 2
    assert gpus["0000:5d:00"]["recovery_action"] == "drain_and_reset"
    assert gpus["0000:18:00"]["power_w"] == pytest.approx(512.4)
    assert gpus["0000:18:00"]["memory_total_mib"] == 81559
    assert gpus["0000:18:00"]["pcie_width_max"] == 16
    assert gpus["0000:18:00"]["entries"]["PCI/Bus Id"] == "00000000:18:00.0"


def test_q_old_generation_throttle_reasons_and_retired_pages(fixture_text):
    parsed = n.parse_q(fixture_text("v100_r418/q.txt"))
    gpus = {g["pci"]: g for g in parsed["gpus"]}
    gpu = gpus["0000:16:00"]
    assert gpu["throttle_reasons"] == ["hw_slowdown", "sw_thermal_slowdown"]
    assert (gpu["retired_pages_sbe"], gpu["retired_pages_dbe"], gpu["retired_pages_pending"]) == (4, 1, True)
    assert gpu["ecc_mode"] == "enabled"  # "Ecc Mode" on old drivers
    assert gpu["remapped_rows_correctable"] is None  # the section does not exist before Ampere
    assert gpus["0000:3b:00"]["pcie_replays"] == 37
    assert gpu["power_limit_w"] == pytest.approx(300.0)


def test_q_consumer_remapped_rows_na(fixture_text):
    parsed = n.parse_q(fixture_text("rtx4090/q.txt"))
    gpu = {g["pci"]: g for g in parsed["gpus"]}["0000:41:00"]
    assert gpu["entries"]["Remapped Rows"] == "N/A"
    for key in ("remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
                "remapped_rows_failure", "ecc_mode", "serial"):
        assert gpu[key] is None, key
    assert gpu["pcie_replays"] == 9071 and gpu["pcie_width_current"] == 8
    # the key after "Remapped Rows : N/A" is not nested under it
    assert gpu["temperature_c"] == 33


def test_q_lost_gpu_still_reads_the_others(fixture_text):
    parsed = n.parse_q(fixture_text("lost_gpu/q.txt"))
    assert len(parsed["gpus"]) == 7
    assert [(p["kind"], p["pci"]) for p in parsed["problems"]] == [("lost", "0000:c1:00")]


def test_help_query_gpu_lists_names_and_aliases(fixture_text):
    new = set(n.parse_help_query_gpu(fixture_text("h100/help_query_gpu.txt"))["fields"])
    old = set(n.parse_help_query_gpu(fixture_text("v100_r418/help_query_gpu.txt"))["fields"])
    assert {"pcie.link.gen.gpucurrent", "clocks_event_reasons.active", "gpu_bus_id", "remapped_rows.pending"} <= new
    assert "pcie.link.gen.gpucurrent" not in old and "clocks_event_reasons.active" not in old
    assert {"pcie.link.gen.current", "clocks_throttle_reasons.active", "retired_pages.single_bit_ecc.count"} <= old
    # prose lines that contain quotes are not field names
    assert "YYYY/MM/DD HH:MM:SS.msec" not in new


# ---------------------------------------------------------------- lost-GPU wordings (index + PCI, lowercase, split lines)

LOST_FORMS = [  # (kind, pci, index) per message of csv/lost_device_handle_forms.txt, in order
    ("lost", "0000:c1:00", 0),
    ("lost", "0000:41:00", 1),
    ("lost", "0000:23:00", None),
    ("lost", "0000:4f:00", None),
    ("lost", "0000:9a:00", None),
    ("lost", "0000:ba:00", None),
    ("lost", "0000:07:00", None),
    ("lost", "0000:02:00", None),
    ("lost", "0000:01:00", None),
    ("lost", None, 3),
    ("lost", "0000:b1:00", None),
    ("tool_error", None, None),
]


def test_every_device_handle_wording_names_the_gpu(fixture_text):
    problems = n.parse_tool_messages(fixture_text("csv/lost_device_handle_forms.txt"))["problems"]
    assert [(p["kind"], p["pci"], p["index"]) for p in problems] == LOST_FORMS


def test_device_handle_message_split_over_lines_is_one_problem(fixture_text):
    problems = n.parse_tool_messages(fixture_text("csv/lost_device_handle_forms.txt"))["problems"]
    power = problems[7]
    assert "insufficiently powered" in power["message"] and power["message"].endswith("not seated properly.")
    assert "insufficiently powered" in power["reason"]
    split = problems[8]
    assert split["message"] == ("Unable to determine the device handle for gpu 0000:01:00.0: GPU is lost. "
                                "Reboot the system to recover this GPU")
    assert split["reason"].startswith("GPU is lost")
    assert problems[0]["reason"] == "Unknown Error"


def test_lost_gpu_by_index_among_noheader_rows(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("csv/noheader_lost_by_index.csv"), QUERY)
    assert sorted(_by_index(parsed)) == [1, 3]
    assert [(p["kind"], p["pci"], p["index"]) for p in parsed["problems"]] == [
        ("lost", "0000:c1:00", 0), ("lost", "0000:c3:00", None)]
    assert parsed["unparsed"]["count"] == 0


# ---------------------------------------------------------------- junk: rows that are not GPUs


def test_junk_with_exit_0_is_no_gpu_and_says_why(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("csv/junk_exit0.txt"), QUERY)
    assert parsed["gpus"] == []
    assert parsed["problems"] and all(p["kind"] == "unparsable_output" for p in parsed["problems"])
    assert parsed["unparsed"]["count"] == 6
    messages = " | ".join(p["message"] for p in parsed["problems"])
    assert "nvidia-smi --query-gpu" in messages
    assert "expected 4 comma-separated fields, got 1" in messages  # "hello from a broken wrapper script"
    assert "no valid GPU index ('x')" in messages
    assert "no valid PCI bus id ('not-a-bus-id')" in messages
    assert "1 more" in parsed["problems"][-1]["message"]  # bounded: 5 lines named, the rest counted
    assert len(parsed["problems"]) == 6


def test_every_gpu_entry_has_index_and_pci(fixture_text):
    for name, fields in (("h100/query_gpu.csv", None), ("csv/noheader_mixed_garbage.csv", QUERY),
                         ("csv/na_spellings.csv", None), ("lost_gpu/query_gpu.csv", None)):
        for gpu in n.parse_query_gpu(fixture_text(name), fields)["gpus"]:
            assert isinstance(gpu["index"], int) and gpu["index"] >= 0, name
            assert gpu["pci"] and gpu["pci"] == gpu["values"]["pci.bus_id"], name


def test_output_cut_short_is_fewer_gpus_not_invented_ones(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("csv/truncated_rows.csv"), QUERY)
    assert sorted(_by_index(parsed)) == [0, 1]
    assert [p["kind"] for p in parsed["problems"]] == ["unparsable_output"]
    assert "2, 00000000:3A:0" in parsed["problems"][0]["line"]


def test_query_without_index_or_pci_cannot_name_gpus():
    parsed = n.parse_query_gpu("31, 69.50\n", ["temperature.gpu", "power.draw"])
    assert parsed["gpus"] == []
    assert [p["kind"] for p in parsed["problems"]] == ["unparsable_output"]
    assert "index" in parsed["problems"][0]["message"]


def test_headerless_output_without_fields_is_a_problem():
    parsed = n.parse_query_gpu("0, 00000000:18:00.0, 31\n")
    assert parsed["gpus"] == [] and [p["kind"] for p in parsed["problems"]] == ["unparsable_output"]


# ---------------------------------------------------------------- camelCase header names


def test_camelcase_header_is_read(fixture_text):
    parsed = n.parse_query_gpu(fixture_text("csv/camelcase_header.csv"))
    assert parsed["unparsed"]["count"] == 0 and parsed["problems"] == []
    assert "pci.baseClass" in parsed["fields"]
    gpus = _by_index(parsed)
    assert sorted(gpus) == [0, 1]
    assert gpus[1]["pci.bus_id"] == "0000:84:00" and gpus[1]["temperature.gpu"] == 33
    assert gpus[0]["pci.baseClass"] == 3 and gpus[0]["pci.subClass"] == 2
    assert gpus[0]["ecc.errors.uncorrected.aggregate.sram.thresholdExceeded"] is False
    assert gpus[1]["ecc.errors.uncorrected.aggregate.sram.thresholdExceeded"] is True
    assert gpus[0]["dramEncryption.mode.current"] is None


def test_header_matches_requested_fields_case_insensitively(fixture_text):
    requested = ["index", "pci.bus_id", "pci.baseclass", "pci.subclass", "name", "encoder.stats.sessioncount",
                 "dramencryption.mode.current", "ecc.errors.uncorrected.aggregate.sram.thresholdexceeded",
                 "temperature.gpu", "memory.used"]
    parsed = n.parse_query_gpu(fixture_text("csv/camelcase_header.csv"), requested)
    assert parsed["problems"] == [] and parsed["unparsed"]["count"] == 0
    gpus = _by_index(parsed)
    assert sorted(gpus) == [0, 1]  # the header line is not taken for a GPU row
    assert gpus[0]["pci.baseclass"] == 3  # values keyed by the names the caller asked for


def test_help_query_gpu_keeps_camelcase_names():
    text = '"pci.baseClass"\nPCI Base Classcode, in hex.\n\n"ecc.errors.uncorrected.aggregate.sram.thresholdExceeded"\nx\n'
    assert n.parse_help_query_gpu(text)["fields"] == ["ecc.errors.uncorrected.aggregate.sram.thresholdExceeded",
                                                      "pci.baseClass"]
