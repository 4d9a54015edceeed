"""Load a scenario file and expand it into the node's GPUs (identity, model facts, per-GPU overrides).

The scenario is the only input: the same file on two nodes gives two different sets of UUIDs and serials (derived
from the node name) unless the scenario pins them per GPU, so a 32-node fleet of `healthy` copies has no duplicates.
"""

import copy
import hashlib
import json
import os
import re

from .models import MODELS

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO_DIR = os.path.join(PACKAGE_ROOT, "scenarios")
DEFAULT_TIME_SCALE = 0.01

DEFAULTS = {
    "schema": 1,
    "gpu_count": 8,
    "driver": {"version": "570.133.20", "cuda_version": "12.8", "generation": "current"},
    "gpus": {},
    "events": [],
    "compute_apps": [],
    "nccl": {},
    "kernel_log": {},
    "storage": {},
    "dcgm": {},
    "gpu_burn": {},
    "torchrun": {},
    "platform": {},
    # nvidia_smi.output: "junk" prints lines that are not its output (exit 0); "rows:N" stops after N GPU rows.
    "nvidia_smi": {},
    # [{from_day, driver, gpus: {"<index>" or "*": overrides}, platform}]: what changes from a simulated day on.
    "timeline": [],
}
DEFAULT_DMI = "Supermicro SYS-421GE-TNRT/X13DEG-OA, BIOS 2.1 02/21/2024"
_DMI_RE = re.compile(r"^(?P<vendor>\S+)\s+(?P<product>[^/,]+)(?:/(?P<board>[^,]+))?,\s*BIOS\s+(?P<bios>\S+)"
                     r"(?:\s+(?P<date>\S+))?")


class ScenarioError(Exception):
    """The scenario cannot be used; the message says which file and what to fix."""


def resolve_path(spec):
    """A scenario given as a path, or as a bare name of a file in the shipped scenarios directory."""
    if not spec:
        raise ScenarioError("GPUFLEET_SIM_SCENARIO is not set: point it at a scenario JSON file or name one of %s"
                            % ", ".join(list_scenarios()))
    if os.path.sep in spec or spec.endswith(".json"):
        path = spec
    else:
        path = os.path.join(SCENARIO_DIR, spec + ".json")
    if not os.path.isfile(path):
        raise ScenarioError("scenario %s not found (known: %s)" % (spec, ", ".join(list_scenarios())))
    return os.path.abspath(path)


def list_scenarios():
    try:
        return sorted(f[:-5] for f in os.listdir(SCENARIO_DIR) if f.endswith(".json"))
    except OSError:
        return []


def _merge(base, over):
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _digest(*parts):
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()


def load(spec, node_name=None):
    path = resolve_path(spec)
    try:
        with open(path) as fh:
            raw = json.load(fh)
    except ValueError as exc:
        raise ScenarioError("scenario %s is not valid JSON: %s" % (path, exc)) from exc
    if not isinstance(raw, dict):
        raise ScenarioError("scenario %s must be a JSON object" % path)
    scen = _merge(DEFAULTS, raw)
    scen["path"] = path
    scen.setdefault("name", os.path.basename(path)[:-5])
    model_key = scen.get("gpu_model")
    if model_key not in MODELS:
        raise ScenarioError("scenario %s: gpu_model %r unknown (known: %s)" % (path, model_key, ", ".join(sorted(MODELS))))
    scen["node"] = node_name or scen["name"]
    scen["gpu_list"] = _expand_gpus(scen, MODELS[model_key])
    return scen


def _expand_gpus(scen, model):
    count = int(scen["gpu_count"])
    bus_ids = scen.get("pci_bus_ids") or model["bus_ids"]
    if len(bus_ids) < count or len(set(bus_ids[:count])) != count:
        raise ScenarioError("scenario %s: needs %d distinct pci_bus_ids" % (scen["path"], count))
    gpus = []
    for index in range(count):
        gpu = copy.deepcopy(model)
        gpu.pop("bus_ids", None)
        bus = bus_ids[index].lower()
        seed = _digest(scen["node"], scen["name"], index)
        gpu.update({
            "index": index,
            "bus": bus,
            "pci_bus_id": "00000000:%s:00.0" % bus.upper(),  # nvidia-smi form
            "pci_sysfs": "0000:%s:00.0" % bus,  # sysfs / NVRM multi-line form
            "pci_xid": "0000:%s:00" % bus,  # Xid line form
            "uuid": "GPU-%s-%s-%s-%s-%s" % (seed[0:8], seed[8:12], seed[12:16], seed[16:20], seed[20:32]),
            "serial": None if model["consumer"] else "1654%09d" % (int(seed[32:44], 16) % 10 ** 9),
            "pcie_load_gen": model["pcie_gen_max"],
            "pcie_load_width": model["pcie_width_max"],
            "pcie_idle_width": model["pcie_width_max"],
            "pcie_replays_base": 0,
            "pcie_replays_per_load_hour": 0,
        })
        gpu = _merge(gpu, scen["gpus"].get(str(index), {}))
        gpus.append(gpu)
    return gpus


def at_day(scen, day):
    """The scenario as it stands on simulated day `day`: every timeline entry with from_day <= day applied in order."""
    entries = [e for e in scen.get("timeline") or [] if float(e.get("from_day", 0)) <= day]
    if not entries:
        return scen
    out = copy.deepcopy(scen)
    for entry in entries:
        for key in ("driver", "platform"):
            if isinstance(entry.get(key), dict):
                out[key] = _merge(out[key], entry[key])
        for which, over in (entry.get("gpus") or {}).items():
            targets = range(int(out["gpu_count"])) if which == "*" else [int(which)]
            for index in targets:
                out["gpus"][str(index)] = _merge(out["gpus"].get(str(index), {}), over)
    out["gpu_list"] = _expand_gpus(out, MODELS[out["gpu_model"]])
    return out


def dmi_files(scen):
    """/sys/class/dmi/id file -> value, from the scenario's DMI boot line (platform.dmi) and the node's name."""
    platform = scen.get("platform") or {}
    match = _DMI_RE.match(platform.get("dmi") or DEFAULT_DMI) or _DMI_RE.match(DEFAULT_DMI)
    seed = _digest(scen["node"], "dmi")
    vendor = match.group("vendor")
    files = {
        "sys_vendor": vendor, "product_name": match.group("product").strip(),
        "product_serial": "S%s" % seed[:11].upper(), "board_vendor": vendor,
        "board_name": (match.group("board") or match.group("product")).strip(),
        "board_serial": "B%s" % seed[11:23].upper(), "chassis_serial": "C%s" % seed[23:33].upper(),
        "bios_vendor": "American Megatrends International, LLC.",
        "bios_version": platform.get("bios_version") or match.group("bios"),
        "bios_date": platform.get("bios_date") or match.group("date") or "01/01/2024",
    }
    return files


def time_scale(env=None):
    env = os.environ if env is None else env
    try:
        scale = float(env.get("GPUFLEET_SIM_TIME_SCALE", DEFAULT_TIME_SCALE))
    except ValueError:
        scale = DEFAULT_TIME_SCALE
    return scale if scale > 0 else DEFAULT_TIME_SCALE
