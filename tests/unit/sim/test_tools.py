"""dcgmi, all_reduce_perf (+ mpirun), nvme/smartctl and torchrun stand-ins against the shapes of docs/signals.md sections 3, 4, 6, 7."""

import json
import re
import stat

from simlib import REPO


def _diag(sim, scenario, level, *extra, node="node"):
    res = sim.run(scenario, "dcgmi", "diag", "-r", level, "-j", *extra, node=node)
    return res, json.loads(res.stdout)


def _tests(doc):
    return {t["name"]: t for c in doc["DCGM Diagnostic"]["test_categories"] for t in c["tests"]}


def test_dcgm_4x_json_shape_and_levels(sim):
    res, doc = _diag(sim, "healthy_h100", "1")
    assert res.returncode == 0 and set(doc) == {"DCGM Diagnostic", "entity_groups", "metadata"}
    assert doc["metadata"]["version"].startswith("4.") and doc["metadata"]["Driver Version Detected"] == "570.133.20"
    assert list(_tests(doc)) == ["software"]
    r = _tests(doc)["software"]["results"][0]
    assert r["entity_group"] == "GPU" and r["entity_id"] == 0 and r["status"] == "Pass"
    res3, doc3 = _diag(sim, "healthy_h100", "long")
    assert res3.returncode == 0
    assert set(_tests(doc3)) >= {"software", "pcie", "memory", "diagnostic", "targeted_stress", "memory_bandwidth"}
    assert all(t["test_summary"]["status"] == "Pass" for t in _tests(doc3).values())


def test_dcgm_failures_warnings_and_skips(sim):
    res, doc = _diag(sim, "pcie_degraded", "2")
    assert res.returncode == 226
    pcie = _tests(doc)["pcie"]
    bad = [r for r in pcie["results"] if r["status"] == "Fail"]
    assert [r["entity_id"] for r in bad] == [5] and bad[0]["warnings"][0]["error_severity"] == 2
    res, doc = _diag(sim, "ecc_leak", "2")
    mem = [r for r in _tests(doc)["memory"]["results"] if r["status"] == "Fail"]
    assert res.returncode == 0 and [r["entity_id"] for r in mem] == [2]
    assert mem[0]["warnings"][0]["error_severity"] == 1  # a WARN serialised as "Fail"
    res, doc = _diag(sim, "healthy_rtx5090", "3")
    assert res.returncode == 0  # GeForce: level 1 only, the rest comes back Skip and exit 0
    assert _tests(doc)["targeted_stress"]["test_summary"]["status"] == "Skip"
    disc = sim.run("healthy_h100", "dcgmi", "discovery", "-l").stdout
    assert disc.startswith("8 GPUs found.\n") and disc.count("Device UUID: GPU-") == 8
    assert re.fullmatch(r"dcgmi  version: 4\.\d+\.\d+\n", sim.run("healthy_h100", "dcgmi", "--version").stdout)


def test_dcgm_3x_shape_and_runtime_error(sim, tmp_path):
    scen = json.loads((REPO / "sim" / "scenarios" / "healthy_h100.json").read_text())
    scen["dcgm"] = {"version": "3.3.5"}
    (tmp_path / "old.json").write_text(json.dumps(scen))
    _res, doc = _diag(sim, str(tmp_path / "old.json"), "2", node="old")
    tests = {t["name"]: t for c in doc["DCGM GPU Diagnostic"]["test_categories"] for t in c["tests"]}
    assert tests["PCIe"]["results"][0] == {"gpu_id": "0", "status": "PASS", "info": tests["PCIe"]["results"][0]["info"]}
    scen["dcgm"] = {"runtime_error": "Error: DCGM host engine is not running"}
    (tmp_path / "dead.json").write_text(json.dumps(scen))
    res, doc = _diag(sim, str(tmp_path / "dead.json"), "3", node="dead")
    assert res.returncode == 226 and doc["DCGM Diagnostic"]["runtime_error"].startswith("Error:")


ROW = re.compile(r"^ *(\d+) +(\d+) +(\w+) +(\w+) +(-?\d+) +([\d.]+) +([\d.]+) +([\d.]+) +(\S+) +([\d.]+) +([\d.]+) +"
                 r"([\d.]+) +(\S+)$")


def _rows(text):
    return [ROW.match(line) for line in text.splitlines() if ROW.match(line)]


def test_all_reduce_perf_format_and_busbw(sim):
    res = sim.run("healthy_h100", "all_reduce_perf", "-b", "8", "-e", "128M", "-f", "2", "-g", "8")
    lines = res.stdout.splitlines()
    assert res.returncode == 0
    assert lines[2].startswith("# nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5")
    assert sum(1 for line in lines if re.match(r"^#  Rank +\d Group +0 Pid +\d+ on +\S+ device +\d \[0000:[0-9a-f]{2}:00\] ",
                                                line)) == 8
    titles = [line for line in lines if line.startswith("#       size")]
    assert titles == ["#       size         count      type   redop    root     time   algbw   busbw  #wrong     time"
                      "   algbw   busbw  #wrong"]
    rows = _rows(res.stdout)
    assert [int(r.group(1)) for r in rows] == [8 * 2 ** i for i in range(25)]
    for r in rows:
        assert int(r.group(2)) == int(r.group(1)) // 4 and r.group(5) == "-1"
        assert abs(float(r.group(8)) - float(r.group(7)) * 2 * 7 / 8) < 0.02 + float(r.group(8)) * 0.01
    assert float(rows[-1].group(8)) > 300
    assert re.search(r"^# Out of bounds values : 0 OK\n# Avg bus bandwidth    : [\d.]+ \n#\n# Collective test concluded: "
                     r"all_reduce_perf$", res.stdout, re.M)


def test_degraded_link_gives_low_busbw_under_mpirun_with_foreign_lines(sim):
    res = sim.run("pcie_degraded", "mpirun", "-np", "8", "--allow-run-as-root", "-x", "NCCL_DEBUG=WARN",
                  "all_reduce_perf", "-b", "1M", "-e", "256M", "-f", "4", "-g", "1")
    assert res.returncode == 0, res.stderr
    assert "nThread 1 nGpus 1 minBytes 1048576" in res.stdout
    rows = _rows(res.stdout)
    assert len(rows) == 5 and float(rows[-1].group(8)) < 2.0  # Gen1 x4 under load: ~0.8 GB/s busbw
    assert any("help-mpi-btl-openib.txt" in line for line in res.stdout.splitlines())  # foreign line inside the table
    healthy = _rows(sim.run("healthy_rtx5090", "all_reduce_perf", "-b", "256M", "-e", "256M", "-g", "8").stdout)
    assert 30 < float(healthy[0].group(8)) < 40
    short = sim.run("healthy_h100", "all_reduce_perf", "-g", "9")
    assert short.returncode != 0 and "Test CUDA failure" in short.stderr


def test_nvme_and_smartctl(sim):
    res = sim.run("checkpoint_readonly", "nvme", "smart-log", "/dev/nvme1", "-o", "json")
    log = json.loads(res.stdout)
    assert log["critical_warning"] & 0x08 and log["percent_used"] == 112 and log["temperature"] > 273
    for key in ("avail_spare", "spare_thresh", "data_units_written", "media_errors", "num_err_log_entries",
                "unsafe_shutdowns"):
        assert isinstance(log[key], int)
    healthy = json.loads(sim.run("healthy_h100", "nvme", "smart-log", "/dev/nvme1n1", "-o", "json").stdout)
    assert healthy["critical_warning"] == 0
    old = sim.run("pcie_degraded", "nvme", "smart-log", "/dev/nvme0", "--output-format=json").stdout
    assert re.search(r'"data_units_written" : \d+\.000000', old)  # nvme-cli 1.x floats
    smart = sim.run("checkpoint_readonly", "smartctl", "-j", "-a", "/dev/nvme1")
    doc = json.loads(smart.stdout)
    assert smart.returncode == 8 | 64 and doc["smartctl"]["exit_status"] == 72
    assert doc["smart_status"]["passed"] is False
    assert doc["nvme_smart_health_information_log"]["percentage_used"] == 112
    listing = json.loads(sim.run("healthy_h100", "nvme", "list", "-o", "json").stdout)
    assert [d["DevicePath"] for d in listing["Devices"]] == ["/dev/nvme0n1", "/dev/nvme1n1"]
    missing = sim.run("healthy_h100", "nvme", "smart-log", "/dev/nvme7", "-o", "json")
    assert missing.returncode != 0 and "nvme7" in missing.stderr


def test_checkpoint_mount_table_and_directory(sim):
    info = json.loads(sim.run("checkpoint_readonly", "gpufleet-sim", "init").stdout)
    ckpt = info["checkpoint_dir"]
    lines = open(info["mounts_file"]).read().splitlines()
    assert lines[-1] == "/dev/nvme1n1p1 %s ext4 ro,relatime 0 0" % ckpt
    assert not stat.S_IMODE(__import__("os").stat(ckpt).st_mode) & 0o222
    rw = json.loads(sim.run("healthy_h100", "gpufleet-sim", "init", node="h").stdout)
    assert open(rw["mounts_file"]).read().splitlines()[-1].split()[3].startswith("rw,")


DRYRUN_KEYS = {"rank", "local_rank", "world_size", "backend", "device", "device_name", "host", "torch_version",
               "cuda_available", "ok", "errors", "params", "hidden", "layers", "batch_size", "model_mib", "step_time_s",
               "allreduce_time_s", "loss", "allreduce_ok", "allreduce_expected", "allreduce_min", "allreduce_max",
               "memory_allocated_mib", "memory_peak_mib"}


def test_torchrun_prints_one_dryrun_line_per_rank(sim):
    res = sim.run("healthy_h100", "torchrun", "--standalone", "--nproc-per-node=8", "dryrun.py", "--model-mb", "64")
    assert res.returncode == 0, res.stderr
    reports = [json.loads(line[len("GPUFLEET_DRYRUN "):]) for line in res.stdout.splitlines()]
    assert [r["rank"] for r in reports] == list(range(8))
    assert all(set(r) == DRYRUN_KEYS and r["ok"] and r["world_size"] == 8 for r in reports)
    src = (REPO / "plugins" / "module_utils" / "dryrun_script.py")
    if src.exists():  # keep the stand-in in step with the collection's script
        text = src.read_text()
        assert all('"%s"' % k in text for k in DRYRUN_KEYS)
    oom = sim.run("neighbour_process", "torchrun", "--nproc_per_node", "8", "dryrun.py", "--model-mb", "15000")
    assert oom.returncode == 1 and "torch.OutOfMemoryError: CUDA out of memory" in oom.stderr
    assert "rank      : 4 (local_rank: 4)" in oom.stderr and "exitcode  : 1" in oom.stderr
