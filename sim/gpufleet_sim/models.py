"""GPU models the scenarios can name: the per-model facts the stand-ins answer with (and thresholds key on).

Numbers are typical for the part, not measurements of one card: idle/load temperature and power, PCIe link, the
FP32 Gflop/s gpu_burn shows, the single-node NCCL all_reduce busbw, which ECC features exist. NVLink: links per GPU and
the per-link speed `nvidia-smi nvlink -s` prints (H100 SXM 18 x 26.562 GB/s, A100 SXM 12 x 25 GB/s, V100 SXM2 6 x
25.781 GB/s, from published nvidia-smi output), and the baseboard's NVSwitches (PCI device 10de:22a3 on HGX H100,
10de:1af1 on HGX A100, class 0680); V100 SXM2 (DGX-1 style hybrid cube mesh) has NVLink without NVSwitches.
"""

MODELS = {
    "h100_sxm": {
        "name": "NVIDIA H100 80GB HBM3", "architecture": "Hopper", "brand": "NVIDIA", "pci_device_id": "2330",
        "memory_total_mib": 81559, "memory_reserved_mib": 328, "power_limit_w": 700.0,
        "idle_power_w": 71.5, "load_power_w": 688.0, "idle_temp_c": 31, "load_temp_c": 67,
        "idle_mem_temp_c": 38, "load_mem_temp_c": 71, "slowdown_temp_c": 90, "shutdown_temp_c": 92,
        "pcie_gen_max": 5, "pcie_width_max": 16, "pcie_idle_gen": 5, "compute_cap": "9.0",
        "vbios": "96.00.99.00.01", "gflops": 51200, "gflops_tensor": 389000, "busbw_gbps": 368.0,
        "ecc": True, "remapped_rows": True, "retired_pages": False, "sram_threshold": True, "consumer": False,
        "fan": False, "mig": True, "dcgm_max_level": 4, "remap_banks": 2560, "clocks_sm_max_mhz": 1980,
        "bus_ids": ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"],
        "nvlink_links": 18, "nvlink_speed_gbps": 26.562, "nvswitch_device_id": "22a3",
        "nvswitch_bus_ids": ["05", "06", "07", "08"],
    },
    "a100_sxm4_80": {
        "name": "NVIDIA A100-SXM4-80GB", "architecture": "Ampere", "brand": "NVIDIA", "pci_device_id": "20b2",
        "memory_total_mib": 81920, "memory_reserved_mib": 512, "power_limit_w": 400.0,
        "idle_power_w": 61.2, "load_power_w": 392.0, "idle_temp_c": 30, "load_temp_c": 64,
        "idle_mem_temp_c": 36, "load_mem_temp_c": 69, "slowdown_temp_c": 87, "shutdown_temp_c": 92,
        "pcie_gen_max": 4, "pcie_width_max": 16, "pcie_idle_gen": 4, "compute_cap": "8.0",
        "vbios": "92.00.45.00.06", "gflops": 19100, "gflops_tensor": 148000, "busbw_gbps": 231.0,
        "ecc": True, "remapped_rows": True, "retired_pages": False, "sram_threshold": False, "consumer": False,
        "fan": False, "mig": True, "dcgm_max_level": 4, "remap_banks": 640, "clocks_sm_max_mhz": 1410,
        "bus_ids": ["07", "0f", "47", "4e", "87", "90", "b7", "bd"],
        "nvlink_links": 12, "nvlink_speed_gbps": 25.0, "nvswitch_device_id": "1af1",
        "nvswitch_bus_ids": ["c4", "c5", "c6", "c7", "c8", "c9"],
    },
    "l40s": {
        "name": "NVIDIA L40S", "architecture": "Ada Lovelace", "brand": "NVIDIA", "pci_device_id": "26b9",
        "memory_total_mib": 46068, "memory_reserved_mib": 480, "power_limit_w": 350.0,
        "idle_power_w": 34.8, "load_power_w": 346.0, "idle_temp_c": 29, "load_temp_c": 71,
        "idle_mem_temp_c": None, "load_mem_temp_c": None, "slowdown_temp_c": 88, "shutdown_temp_c": 93,
        "pcie_gen_max": 4, "pcie_width_max": 16, "pcie_idle_gen": 1, "compute_cap": "8.9",
        "vbios": "95.02.5D.00.01", "gflops": 61000, "gflops_tensor": 290000, "busbw_gbps": 24.5,
        "ecc": True, "remapped_rows": True, "retired_pages": False, "sram_threshold": False, "consumer": False,
        "fan": False, "mig": False, "dcgm_max_level": 4, "remap_banks": 768, "clocks_sm_max_mhz": 2520,
        "bus_ids": ["16", "38", "49", "5a", "98", "b8", "c8", "d8"],
    },
    "rtx5090": {
        "name": "NVIDIA GeForce RTX 5090", "architecture": "Blackwell", "brand": "GeForce", "pci_device_id": "2b85",
        "memory_total_mib": 32607, "memory_reserved_mib": 420, "power_limit_w": 575.0,
        "idle_power_w": 24.6, "load_power_w": 566.0, "idle_temp_c": 34, "load_temp_c": 76,
        "idle_mem_temp_c": None, "load_mem_temp_c": None, "slowdown_temp_c": 90, "shutdown_temp_c": 95,
        "pcie_gen_max": 5, "pcie_width_max": 16, "pcie_idle_gen": 1, "compute_cap": "12.0",
        "vbios": "98.02.2E.00.A5", "gflops": 76400, "gflops_tensor": 205000, "busbw_gbps": 38.0,
        "ecc": False, "remapped_rows": False, "retired_pages": False, "sram_threshold": False, "consumer": True,
        "fan": True, "mig": False, "dcgm_max_level": 1, "remap_banks": 0, "clocks_sm_max_mhz": 3090,
        "bus_ids": ["01", "21", "41", "61", "81", "a1", "c1", "e1"],
    },
    "v100_sxm2": {
        "name": "Tesla V100-SXM2-32GB", "architecture": "Volta", "brand": "Tesla", "pci_device_id": "1db5",
        "memory_total_mib": 32768, "memory_reserved_mib": 0, "power_limit_w": 300.0,
        "idle_power_w": 42.1, "load_power_w": 297.0, "idle_temp_c": 33, "load_temp_c": 66,
        "idle_mem_temp_c": 31, "load_mem_temp_c": 64, "slowdown_temp_c": 87, "shutdown_temp_c": 90,
        "pcie_gen_max": 3, "pcie_width_max": 16, "pcie_idle_gen": 3, "compute_cap": "7.0",
        "vbios": "88.00.80.00.01", "gflops": 14300, "gflops_tensor": 96000, "busbw_gbps": 128.0,
        "ecc": True, "remapped_rows": False, "retired_pages": True, "sram_threshold": False, "consumer": False,
        "fan": False, "mig": False, "dcgm_max_level": 4, "remap_banks": 0, "clocks_sm_max_mhz": 1530,
        "bus_ids": ["15", "16", "3a", "3b", "89", "8a", "b2", "b3"],
        "nvlink_links": 6, "nvlink_speed_gbps": 25.781, "nvswitch_device_id": None, "nvswitch_bus_ids": [],
    },
}
