"""Live values of a node's GPUs at one instant: idle vs under load, heating and cooling, link, ECC, processes.

"Under load" means a stand-in that burns (gpu_burn, all_reduce_perf, torchrun) holds a load marker for the GPU.
Per-GPU scenario overrides (scenario["gpus"]["3"]) replace any model fact used here.
"""

import math
import time

from . import leak as leak_mod

HEAT_TAU_S = 90.0  # simulated seconds for the die to approach its load temperature
COOL_TAU_S = 60.0


def _jitter(seed, amplitude):
    # Deterministic small wobble so two samples a second apart are not bit-identical, yet tests are repeatable.
    x = math.sin(seed * 12.9898) * 43758.5453
    return (x - math.floor(x) - 0.5) * 2 * amplitude


class View:
    def __init__(self, node, now=None):
        self.node = node
        self.now = time.time() if now is None else now
        self.loads = node.active_loads(self.now)
        self.history = node.load_history()
        self.lost = node.lost()
        self.resets = node.resets()
        self.sim_elapsed_h = node.sim_elapsed_s(self.now) / 3600.0
        # The node's clock (timestamps the tools print) and its simulated day (what follows `gpufleet-sim clock`).
        self.clock_now = self.now + node.clock_offset_s()
        self.clock_day = node.clock_days()

    def load_of(self, index):
        for rec in self.loads:
            if index in rec["gpus"] and rec["start"] <= self.now:
                return rec
        return None

    def under_load(self, index):
        return self.load_of(index) is not None

    def _load_sim_s(self, index):
        total = float(self.history.get(index, {}).get("load_sim_s", 0.0))
        rec = self.load_of(index)
        if rec:
            total += max(0.0, self.now - rec["start"]) / self.node.scale
        return total

    def _tick(self, index):
        return int(self.now * 2) * 31 + index

    # ---- thermal / power -------------------------------------------------------------------------------------
    def _heat_fraction(self, index):
        rec = self.load_of(index)
        if rec:
            return 1.0 - math.exp(-(self.now - rec["start"]) / self.node.scale / HEAT_TAU_S)
        h = self.history.get(index)
        if h and h.get("last_end"):
            reached = 1.0 - math.exp(-(h["last_end"] - h["last_start"]) / self.node.scale / HEAT_TAU_S)
            return reached * math.exp(-(self.now - h["last_end"]) / self.node.scale / COOL_TAU_S)
        return 0.0

    def temperature_c(self, gpu):
        f = self._heat_fraction(gpu["index"])
        t = gpu["idle_temp_c"] + (gpu["load_temp_c"] - gpu["idle_temp_c"]) * f
        return int(round(t + _jitter(self._tick(gpu["index"]), 0.8)))

    def memory_temperature_c(self, gpu):
        if gpu.get("idle_mem_temp_c") is None:
            return None
        f = self._heat_fraction(gpu["index"])
        return int(round(gpu["idle_mem_temp_c"] + (gpu["load_mem_temp_c"] - gpu["idle_mem_temp_c"]) * f))

    def power_w(self, gpu):
        if self.under_load(gpu["index"]):
            p = gpu["load_power_w"] * (0.97 + 0.02 * self._heat_fraction(gpu["index"]))
        else:
            p = gpu["idle_power_w"]
        return max(1.0, p + _jitter(self._tick(gpu["index"]) + 7, 1.5))

    def utilization(self, gpu):
        if self.under_load(gpu["index"]):
            return 100
        return max([int(a.get("utilization_pct", 0)) for a in self.foreign_apps(gpu)] or [0])

    def pstate(self, gpu):
        if self.under_load(gpu["index"]) or self.foreign_apps(gpu):
            return "P0"
        return "P8" if gpu["consumer"] else "P0"

    def clocks_sm_mhz(self, gpu):
        if self.under_load(gpu["index"]):
            return int(gpu["clocks_sm_max_mhz"] * 0.93)
        return 345 if gpu["consumer"] else 1755

    def throttle_mask(self, gpu):
        if self.under_load(gpu["index"]):
            return int(str(gpu.get("throttle_under_load", "0x0")), 16)
        return 0x1  # gpu_idle

    # ---- PCIe ------------------------------------------------------------------------------------------------
    def pcie_gen(self, gpu):
        return gpu["pcie_load_gen"] if self.under_load(gpu["index"]) else gpu["pcie_idle_gen"]

    def pcie_width(self, gpu):
        return gpu["pcie_load_width"] if self.under_load(gpu["index"]) else gpu["pcie_idle_width"]

    def pcie_replays(self, gpu):
        return int(gpu["pcie_replays_base"] + gpu["pcie_replays_per_load_hour"] * self._load_sim_s(gpu["index"]) / 3600)

    # ---- memory / ECC ----------------------------------------------------------------------------------------
    def foreign_apps(self, gpu):
        return [a for a in self.node.scen["compute_apps"] if int(a["gpu"]) == gpu["index"]]

    def memory_used_mib(self, gpu):
        used = sum(int(a.get("used_memory_mib", 0)) for a in self.foreign_apps(gpu))
        if self.under_load(gpu["index"]):
            used += self.burn_memory_mib(gpu, used)
        return used

    def burn_memory_mib(self, gpu, others_mib=0):
        """What gpu_burn takes: 90% of the memory still available (cuMemGetInfo free)."""
        avail = gpu["memory_total_mib"] - gpu["memory_reserved_mib"] - others_mib
        return int(avail * 0.9)

    def processes(self, gpu):
        """(pid, name, used_memory_mib) of compute apps on this GPU: the scenario's foreign ones, then burners."""
        out = [(int(a["pid"]), a["name"], int(a.get("used_memory_mib", 0))) for a in self.foreign_apps(gpu)]
        rec = self.load_of(gpu["index"])
        if rec:
            others = sum(p[2] for p in out)
            out.append((rec["pid"], rec.get("process_name", rec["kind"]), self.burn_memory_mib(gpu, others)))
        return out

    def ecc(self, gpu):
        """ECC counters and row/page bookkeeping; None values where the card has no ECC."""
        if not gpu.get("ecc"):
            return None
        cfg = gpu.get("ecc_counters", {})
        load_h = self._load_sim_s(gpu["index"]) / 3600.0
        corrected = int(cfg.get("corrected_volatile_base", 0) + cfg.get("corrected_per_sim_hour", 0) * self.sim_elapsed_h
                        + cfg.get("corrected_per_load_hour", 0) * load_h)
        uncorrected = int(cfg.get("uncorrected_volatile", 0))
        hist = {"max": gpu.get("remap_banks", 0), "high": 0, "partial": 0, "low": 0, "none": 0}
        hist.update(cfg.get("remap_histogram", {}))
        leak = {"corrected": 0, "uncorrected": 0, "remapped_rows_correctable": 0, "remapped_rows_uncorrectable": 0,
                "remapped_rows_pending": False}
        if isinstance(gpu.get("ecc_leak"), dict):
            leak = leak_mod.counters(gpu["ecc_leak"], self.clock_day, int(gpu.get("remap_banks", 0)))
            hist = leak["histogram"]
        corrected += leak["corrected"]
        uncorrected += leak["uncorrected"]
        return {
            "corrected_volatile": corrected,
            "uncorrected_volatile": uncorrected,
            "corrected_aggregate": int(cfg.get("aggregate_corrected_base", 0)) + corrected,
            "uncorrected_aggregate": int(cfg.get("aggregate_uncorrected_base", 0)) + uncorrected,
            "sram_corrected_share": 0.1,
            "remapped_rows_correctable": int(cfg.get("remapped_rows_correctable", 0))
            + leak["remapped_rows_correctable"],
            "remapped_rows_uncorrectable": int(cfg.get("remapped_rows_uncorrectable", 0))
            + leak["remapped_rows_uncorrectable"],
            "remapped_rows_pending": (bool(cfg.get("remapped_rows_pending", False)) or leak["remapped_rows_pending"])
            and gpu["index"] not in self.resets,
            "remapped_rows_failure": bool(cfg.get("remapped_rows_failure", False)),
            "remap_histogram": hist,
            "retired_sbe": int(cfg.get("retired_pages_sbe", 0)),
            "retired_dbe": int(cfg.get("retired_pages_dbe", 0)),
            "retired_pending": bool(cfg.get("retired_pages_pending", False)) and gpu["index"] not in self.resets,
            "sram_threshold_exceeded": bool(cfg.get("sram_threshold_exceeded", False)),
        }
