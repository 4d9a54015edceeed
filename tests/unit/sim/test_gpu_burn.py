"""gpu_burn stand-in: wilicc/gpu-burn shapes and traps (docs/signals.md section 5), faults, time scaling, CUDA_VISIBLE_DEVICES."""

import json
import re
import time

from simlib import SIM

FRAME = re.compile(r"^(\d{1,3}\.\d)%  proc'd: (?P<proc>.*?)  errors: (?P<err>.*?)  temps: (?P<temps>.*?)"
                   r"(?:  power: (?P<power>.*))?$")
PROC = re.compile(r"(-?\d+) \((\d+) Gflop/s\) ")
ERRS = re.compile(r"(-?\d+) (?: \((WARNING|DIED)!\))?")


def frames(stdout):
    return [m for m in (FRAME.match(part) for part in re.split(r"[\r\n]", stdout)) if m]


def test_healthy_burn_has_the_real_shape(sim):
    res = sim.run("healthy_rtx5090", "gpu_burn", "600")
    out = res.stdout
    assert res.returncode == 0
    assert out.startswith("Using compare file: compare.ptx\nBurning for 600 seconds.\nGPU 0: NVIDIA GeForce RTX 5090 (UUID: ")
    assert len(re.findall(r"^Initialized device \d with 32607 MB of memory \(32187 MB available, using 28968 MB of it\), "
                          r"using FLOATS$", out, re.M)) == 8
    fr = frames(out)
    assert len(fr) > 20
    assert "-- " in fr[0].group("temps")  # no temperature read yet in the first frames
    last = fr[-1]
    assert len(PROC.findall(last.group("proc"))) == 8
    assert all(int(p) > 0 and int(g) > 50000 for p, g in PROC.findall(last.group("proc")))
    assert [e[0] for e in ERRS.findall(last.group("err"))] == ["0"] * 8
    assert re.fullmatch(r"(\d\d C (- )?){8}", last.group("temps").strip() + " ") or last.group("temps").count(" C") == 8
    summaries = re.findall(r"^\tSummary at:   \w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \w+ \d{4}$", out, re.M)
    assert 7 <= len(summaries) <= 10  # about every 10%
    assert out.rstrip().endswith("\n".join("\tGPU %d: OK" % i for i in range(8)))
    assert "\nTested 8 GPUs:\n" in out and "Killing processes with SIGTERM (soft kill)" in out


def test_riser_gpu3_dies_at_40_percent_and_exit_is_still_zero(sim):
    res = sim.run("riser_xid79", "gpu_burn", "600")
    assert res.returncode == 0  # the real tool exits 0 even with FAULTY GPUs
    assert "\tGPU 3: FAULTY" in res.stdout and "\tGPU 2: OK" in res.stdout
    fr = frames(res.stdout)
    died = [f for f in fr if "(DIED!)" in f.group("err")]
    assert died and 39.0 <= float(died[0].group(1)) <= 45.0
    assert ERRS.findall(died[0].group("err"))[3] == ("-1", "DIED")
    assert "Failure during compute" in res.stderr
    smi = sim.run("riser_xid79", "nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader")
    assert smi.returncode == 15
    assert ("Unable to determine the device handle for GPU 0000:61:00.0: GPU is lost. Reboot the system to recover "
            "this GPU") in smi.stdout.splitlines()
    log = sim.run("riser_xid79", "journalctl", "-k", "-o", "cat", "--no-pager").stdout
    assert "NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." in log
    assert "NVRM: GPU 0000:61:00.0: GPU has fallen off the bus." in log
    # A second burn sees 7 CUDA devices: the lost GPU is gone from CUDA, and nvidia-smi -L reports it inside the output.
    again = sim.run("riser_xid79", "gpu_burn", "100")
    assert "\nTested 7 GPUs:\n" in again.stdout and "GPU is lost" in again.stdout


def test_psu_rail_b_loses_gpus_4_to_7_within_milliseconds(sim):
    res = sim.run("psu_rail_b", "gpu_burn", "300")
    assert [line for line in res.stdout.splitlines() if "FAULTY" in line] == ["\tGPU %d: FAULTY" % i for i in (4, 5, 6, 7)]
    recs = [json.loads(line) for line in sim.run("psu_rail_b", "journalctl", "-k", "-o", "json").stdout.splitlines()]
    xids = [r for r in recs if isinstance(r["MESSAGE"], str) and ": 79, " in r["MESSAGE"]]
    assert len(xids) == 4
    stamps = [int(r["__REALTIME_TIMESTAMP"]) for r in xids]
    assert max(stamps) - min(stamps) < 10000  # µs
    assert any(r["MESSAGE"] == "NVRM: fallen off the bus and is not responding to commands." for r in recs)
    lost = sim.run("psu_rail_b", "nvidia-smi", "-L").stdout
    assert lost.count("GPU is lost") == 4


def test_time_is_compressed_by_the_scale(sim):
    t0 = time.monotonic()
    res = sim.run("healthy_h100", "gpu_burn", "1000", scale=0.001)
    elapsed = time.monotonic() - t0
    assert "Burning for 1000 seconds." in res.stdout and "100.0%" in res.stdout
    assert 0.9 < elapsed < 6.0


def test_cuda_visible_devices_filters_and_renumbers(sim):
    res = sim.run("riser_xid79", "gpu_burn", "500", extra={"CUDA_VISIBLE_DEVICES": "2,5"})
    assert re.findall(r"^Initialized device (\d)", res.stdout, re.M) == ["0", "1"]
    assert "\nTested 2 GPUs:\n\tGPU 0: OK\n\tGPU 1: OK" in res.stdout
    assert "DIED" not in res.stdout  # GPU 3 was not burning: its riser fault is not triggered
    smi = sim.run("riser_xid79", "nvidia-smi", "-L")
    assert smi.returncode == 0  # nvidia-smi ignores CUDA_VISIBLE_DEVICES and sees all 8


def test_missing_compare_file_aborts_and_single_device_option(sim, tmp_path):
    res = sim.run("healthy_h100", "gpu_burn", "-c", tmp_path / "missing.ptx", "60")
    assert res.returncode == 123
    assert "Couldn't init a GPU test" in res.stderr and "No clients are alive!  Aborting" in res.stderr
    one = sim.run("healthy_h100", "gpu_burn", "-i", "2", "-tc", "100")
    assert "Initialized device 2 with 81559 MB" in one.stdout and ", using Tensor Cores" in one.stdout
    assert one.stdout.rstrip().endswith("Tested 1 GPUs:\n\tGPU 0: OK")  # the summary counts workers from 0
    none = sim.run("healthy_h100", "gpu_burn", "60", extra={"CUDA_VISIBLE_DEVICES": ""})
    assert none.returncode == 19 and "No CUDA devices" in none.stderr


def test_power_column_and_neighbour_slows_its_gpu(sim):
    res = sim.run("neighbour_process", "gpu_burn", "400")
    last = frames(res.stdout)[-1]
    assert last.group("power") and last.group("power").count(" W") == 8
    gflops = [int(g) for _p, g in PROC.findall(last.group("proc"))]
    assert gflops[4] < 0.7 * gflops[0]
    assert "Initialized device 4 with 81559 MB of memory (50819 MB available" in res.stdout


def test_init_failure_still_prints_ok_and_silent_errors_make_faulty(sim, tmp_path):
    scen = json.loads((SIM / "scenarios" / "healthy_h100.json").read_text())
    scen["gpu_burn"] = {"init_fail_gpus": [1]}
    scen["events"] = [{"kind": "errors", "gpus": [6], "count": 3, "at": {"burn_fraction": 0.5}}]
    path = tmp_path / "quirky.json"
    path.write_text(json.dumps(scen))
    res = sim.run(str(path), "gpu_burn", "400")
    assert "Couldn't init a GPU test" in res.stderr
    assert "\tGPU 1: OK" in res.stdout  # never initialised, never worked, yet "OK": the trap
    assert PROC.findall(frames(res.stdout)[-1].group("proc"))[1] == ("0", "0")
    assert "\tGPU 6: FAULTY" in res.stdout and any("(WARNING!)" in f.group("err") for f in frames(res.stdout))
    assert res.returncode == 0
