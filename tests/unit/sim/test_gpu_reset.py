"""nvidia-smi --gpu-reset in the simulator, in the real tool's words and exit codes: a reset applies a pending row
remap; a GPU a process holds is refused (exit 255, "In use by another client"); a lost GPU cannot be reset."""

import re


def _pending(sim, scenario, gpu):
    out = sim.run(scenario, "nvidia-smi", "--query-gpu=remapped_rows.pending", "--format=csv,noheader", "-i", gpu)
    return out.stdout.strip()


def test_a_reset_applies_a_pending_row_remap(sim):
    bus = sim.run("ecc_leak", "nvidia-smi", "--query-gpu=index,pci.bus_id,remapped_rows.pending",
                  "--format=csv,noheader").stdout
    index, pci = next((r.split(", ")[0], r.split(", ")[1]) for r in bus.splitlines() if r.endswith("Yes"))
    done = sim.run("ecc_leak", "nvidia-smi", "--gpu-reset", "-i", pci)
    assert (done.returncode, done.stdout) == (0, "GPU %s was successfully reset.\n" % pci)
    assert _pending(sim, "ecc_leak", index) == "No"


def test_a_gpu_a_process_holds_is_not_reset(sim):
    pci = sim.run("neighbour_process", "nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader",
                  "-i", "4").stdout.strip()
    done = sim.run("neighbour_process", "nvidia-smi", "-r", "-i", "4")
    assert done.returncode == 255
    assert done.stdout.startswith("The following GPUs could not be reset:\n  GPU %s: In use by another client\n\n1 "
                                  "device is currently being used by one or more other processes" % pci)
    assert re.search(r"Please first kill all processes using this device", done.stdout)
