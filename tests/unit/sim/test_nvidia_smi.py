"""nvidia-smi stand-in: shapes of docs/signals.md section 2 for every scenario, generations, lost GPU, load effects."""

import re
import time

import pytest
from simlib import SCENARIOS, gpu_count

FIELDS = ("index,name,serial,uuid,pci.bus_id,driver_version,temperature.gpu,temperature.memory,power.draw,power.limit,"
          "memory.total,memory.used,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
          "pcie.link.width.max,ecc.errors.corrected.volatile.total,retired_pages.sbe,remapped_rows.correctable,"
          "clocks_throttle_reasons.active,persistence_mode")
NO_VALUE = {"[N/A]", "N/A", "[Not Supported]"}
CELL = {
    "index": r"\d", "name": r"NVIDIA .+|Tesla .+", "serial": r"\d{13}|\[N/A\]",
    "uuid": r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "pci.bus_id": r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", "driver_version": r"\d+\.\d+\.\d+",
    "temperature.gpu": r"\d{2}", "temperature.memory": r"\d{2}|N/A", "power.draw": r"\d+\.\d\d",
    "power.limit": r"\d+\.\d\d", "memory.total": r"\d+", "memory.used": r"\d+", "pcie.link.gen.current": r"[1-6]",
    "pcie.link.gen.max": r"[3-6]", "pcie.link.width.current": r"\d{1,2}", "pcie.link.width.max": r"16",
    "ecc.errors.corrected.volatile.total": r"\d+|\[N/A\]", "retired_pages.sbe": r"\d+|\[N/A\]",
    "remapped_rows.correctable": r"\d+|\[N/A\]", "clocks_throttle_reasons.active": r"0x[0-9A-F]{16}",
    "persistence_mode": r"Enabled|Disabled",
}


# Scenarios whose nvidia-smi is broken on purpose (garbage, output cut short) are tested where that matters.
BROKEN_ON_PURPOSE = ("nvidia_smi_junk", "nvidia_smi_two_rows")


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s not in BROKEN_ON_PURPOSE])
def test_query_gpu_rows_match_the_real_shape(sim, scenario):
    res = sim.run(scenario, "nvidia-smi", "--query-gpu=" + FIELDS, "--format=csv,noheader,nounits")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split(", ") for line in res.stdout.splitlines()]
    names = FIELDS.split(",")
    count = gpu_count(scenario)
    assert len(rows) == count
    for row in rows:
        assert len(row) == len(names), row
        for name, cell in zip(names, row, strict=True):
            assert re.fullmatch(CELL[name], cell), (scenario, name, cell)
    buses = [r[names.index("pci.bus_id")] for r in rows]
    assert len(set(buses)) == count
    assert [int(r[0]) for r in rows] == list(range(count))


def test_csv_header_carries_units_and_values_carry_units(sim):
    res = sim.run("healthy_h100", "nvidia-smi", "--query-gpu=index,power.draw,memory.used,temperature.gpu",
                  "--format=csv")
    lines = res.stdout.splitlines()
    assert lines[0] == "index, power.draw [W], memory.used [MiB], temperature.gpu"
    assert re.fullmatch(r"\d, \d+\.\d\d W, \d+ MiB, \d+", lines[1])


def test_unknown_field_aborts_the_whole_query(sim):
    res = sim.run("healthy_h100", "nvidia-smi", "--query-gpu=index,bogus.field", "--format=csv,noheader,nounits")
    assert res.returncode == 2
    assert res.stdout.strip() == 'Field "bogus.field" is not a valid field to query.'


def test_legacy_driver_knows_only_the_old_field_names(sim):
    for new in ("pcie.link.gen.gpucurrent", "clocks_event_reasons.active", "gpu_recovery_action"):
        res = sim.run("ecc_leak", "nvidia-smi", "--query-gpu=index," + new, "--format=csv,noheader")
        assert res.returncode == 2 and new in res.stdout
    ok = sim.run("ecc_leak", "nvidia-smi", "--query-gpu=pcie.link.gen.current,clocks_throttle_reasons.hw_slowdown",
                 "--format=csv,noheader")
    assert ok.returncode == 0 and ok.stdout.splitlines()[0] == "4, Not Active"
    legacy_help = sim.run("ecc_leak", "nvidia-smi", "--help-query-gpu").stdout
    current_help = sim.run("healthy_h100", "nvidia-smi", "--help-query-gpu").stdout
    assert '"pcie.link.gen.current"' in legacy_help and '"pcie.link.gen.gpucurrent"' not in legacy_help
    assert '"pcie.link.gen.gpucurrent"' in current_help and '"clocks_event_reasons.active"' in current_help
    assert '"pci.bus_id" or "gpu_bus_id"' in current_help
    q = sim.run("ecc_leak", "nvidia-smi", "-q").stdout
    assert "Clocks Throttle Reasons" in q and "Clocks Event Reasons" not in q
    assert "Clocks Event Reasons" in sim.run("healthy_h100", "nvidia-smi", "-q").stdout


def test_q_tree_is_indented_by_four_and_has_replays(sim):
    out = sim.run("healthy_rtx5090", "nvidia-smi", "-q").stdout
    assert out.count("Replays Since Reset") == 8
    gpu_headers = re.findall(r"^GPU ([0-9A-F]{8}:[0-9A-F]{2}:00\.0)$", out, re.M)
    assert len(gpu_headers) == 8
    for line in out.splitlines():
        if line.strip() and line.startswith(" "):
            indent = len(line) - len(line.lstrip(" "))
            assert indent % 4 == 0, line
            if ":" in line:
                assert re.match(r"^ +\S.*? +: \S?", line), line
    assert re.search(r"^    Remapped Rows +: N/A$", out, re.M)  # consumer card: a key with a value, no children
    assert re.search(r"^        Memory Current Temp +: N/A$", out, re.M)


def test_list_gpus_and_compute_apps(sim):
    listing = sim.run("healthy_h100", "nvidia-smi", "-L").stdout.splitlines()
    assert len(listing) == 8
    assert all(re.fullmatch(r"GPU \d: NVIDIA H100 80GB HBM3 \(UUID: GPU-[0-9a-f-]{36}\)", line) for line in listing)
    fields = "gpu_bus_id,gpu_uuid,pid,process_name,used_gpu_memory"
    idle = sim.run("healthy_h100", "nvidia-smi", "--query-compute-apps=" + fields, "--format=csv")
    assert idle.stdout == "gpu_bus_id, gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"  # header only
    busy = sim.run("neighbour_process", "nvidia-smi", "--query-compute-apps=" + fields, "--format=csv,noheader,nounits")
    assert re.fullmatch(r"00000000:9B:00\.0, GPU-[0-9a-f-]{36}, 48213, /usr/bin/python3\.11, 30412\n", busy.stdout)
    mem = sim.run("neighbour_process", "nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits")
    assert mem.stdout.splitlines()[4] == "30412" and mem.stdout.splitlines()[0] == "0"


def test_topo_and_plain_table(sim):
    topo = sim.run("pcie_degraded", "nvidia-smi", "topo", "-m").stdout
    assert "\x1b[4mGPU0\x1b[0m" in topo.splitlines()[0]  # ANSI underline even when piped
    assert topo.splitlines()[1].startswith("GPU0\t X \t")
    table = sim.run("healthy_h100", "nvidia-smi").stdout
    assert "Driver Version: 570.133.20" in table and "No running processes found" in table


def _query(sim, scenario, fields, node="node"):
    res = sim.run(scenario, "nvidia-smi", "--query-gpu=" + fields, "--format=csv,noheader,nounits", node=node)
    return [line.split(", ") for line in res.stdout.splitlines()]


def _during_burn(sim, scenario, check, seconds=3000):
    """Run check() while gpu_burn holds the node under load (3000 s at scale 0.001 = 3 s)."""
    proc = sim.popen(scenario, "gpu_burn", seconds)
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            loads = list((sim.state() / "load").glob("*.json")) if (sim.state() / "load").exists() else []
            if loads:
                break
            time.sleep(0.05)
        time.sleep(0.6)
        return check()
    finally:
        proc.kill()
        proc.communicate()


def test_degraded_link_reads_full_at_idle_and_gen1_x4_under_load(sim):
    fields = "index,pcie.link.gen.gpucurrent,pcie.link.width.current"
    idle = _query(sim, "pcie_degraded", fields)
    assert idle[5] == ["5", "4", "16"]
    assert idle[0] == ["0", "1", "16"]  # healthy L40S drops to Gen1 at idle: judge under load
    loaded = _during_burn(sim, "pcie_degraded", lambda: _query(sim, "pcie_degraded", fields))
    assert loaded[5] == ["5", "1", "4"]
    assert loaded[0] == ["0", "4", "16"]


def test_temperature_and_power_rise_under_load(sim):
    idle = _query(sim, "healthy_h100", "temperature.gpu,power.draw,utilization.gpu")
    loaded = _during_burn(sim, "healthy_h100", lambda: _query(sim, "healthy_h100",
                                                              "temperature.gpu,power.draw,utilization.gpu"))
    for before, after in zip(idle, loaded, strict=True):
        assert int(after[0]) >= int(before[0]) + 20
        assert float(after[1]) > 600 > float(before[1])
        assert after[2] == "100" and before[2] == "0"


def test_ecc_corrected_count_rises_with_simulated_time(sim):
    first = _query(sim, "ecc_leak", "ecc.errors.corrected.volatile.total,remapped_rows.pending,remapped_rows.correctable",
                   node="ecc")
    time.sleep(0.5)  # 500 simulated seconds at scale 0.001
    second = _query(sim, "ecc_leak", "ecc.errors.corrected.volatile.total", node="ecc")
    assert int(second[2][0]) > int(first[2][0]) >= 1452
    assert first[2][1:] == ["Yes", "508"]
    assert first[0][0] == "0" and second[0][0] == "0"


def test_broken_on_purpose_scenarios_are_broken_as_described(sim):
    junk = sim.run("nvidia_smi_junk", "nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader")
    assert junk.returncode == 0 and "unexpected condition" in junk.stdout and "00000000:" not in junk.stdout
    cut = sim.run("nvidia_smi_two_rows", "nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader")
    assert cut.returncode == 0 and len(cut.stdout.splitlines()) == 2
