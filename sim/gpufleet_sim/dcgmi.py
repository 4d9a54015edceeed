"""Stand-in for dcgmi: `diag -r N [-j] [-i LIST] [--iterations N]`, `discovery -l`, `--version`.

JSON is the DCGM 4.x shape by default (scenario dcgm.version "4.x"), or the 3.x shape ("DCGM GPU Diagnostic",
gpu_id/gpu_ids strings, upper-case status) when dcgm.version starts with "3.". Traps reproduced: a warning is
serialised as status "Fail" with error_severity 1 (DCGM_ERROR_MONITOR) while a failure has 2 (ISOLATE); GeForce
cards run level 1 only, so higher levels come back as Skip and still exit 0; a scenario can force `runtime_error`
(the diag could not run). Exit codes: 0, or 226 (-30 as an unsigned byte) when a test failed. error_id values follow
dcgm_errors.h where known and are otherwise illustrative.
"""

import json
import sys
import time

from .gpu import View

LEVEL_ALIASES = {"1": 1, "short": 1, "quick": 1, "2": 2, "medium": 2, "3": 3, "long": 3, "4": 4, "xlong": 4}
LEVEL_SIM_SECONDS = {1: 12, 2: 120, 3: 900, 4: 5400}
# (category, test, first level that runs it)
TESTS = [
    ("Deployment", "software", 1),
    ("Integration", "pcie", 2),
    ("Hardware", "memory", 2),
    ("Hardware", "diagnostic", 3),
    ("Stress", "targeted_stress", 3),
    ("Stress", "targeted_power", 3),
    ("Stress", "memory_bandwidth", 3),
    ("Hardware", "memtest", 4),
    ("Hardware", "pulse_test", 4),
]
NAMES_3X = {"software": "Software", "pcie": "PCIe", "memory": "Memory", "diagnostic": "Diagnostic",
            "targeted_stress": "Targeted Stress", "targeted_power": "Targeted Power",
            "memory_bandwidth": "Memory Bandwidth", "memtest": "Memtest", "pulse_test": "Pulse Test"}
EXIT_FAIL = 226
LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def main(node, argv, out=sys.stdout, err=sys.stderr):
    version = node.scen["dcgm"].get("version", "4.2.3")
    if not argv or argv[0] in ("-h", "--help"):
        out.write("dcgmi -- Command line interface for DCGM.\n\nUsage: dcgmi <subsystem>\n")
        return 0 if argv else 1
    if argv[0] in ("--version", "-v"):
        out.write("dcgmi  version: %s\n" % version)
        return 0
    if argv[0] == "discovery":
        return discovery(node, argv[1:], out, err)
    if argv[0] == "diag":
        return diag(node, argv[1:], version, out, err)
    err.write("Error: unknown subsystem '%s'.\n" % argv[0])
    return 1


def discovery(node, argv, out, err):
    if "-l" not in argv and "--list" not in argv:
        err.write("Error: discovery needs -l.\n")
        return 1
    lost = node.lost()
    gpus = [g for g in node.gpus if g["index"] not in lost]
    line = "+--------+----------------------------------------------------------------------+"
    out.write("%d GPU%s found.\n%s\n| GPU ID | Device Information%s|\n%s\n"
              % (len(gpus), "" if len(gpus) == 1 else "s", line, " " * 52, line))
    for g in gpus:
        for i, text in enumerate(["Name: " + g["name"], "PCI Bus ID: " + g["pci_bus_id"],
                                  "Device UUID: " + g["uuid"]]):
            out.write("| %-6s | %-68s |\n" % (g["index"] if i == 0 else "", text))
        out.write(line + "\n")
    out.write("0 NvSwitches found.\n+-----------+\n| Switch ID |\n+-----------+\n+-----------+\n")
    return 0


def _parse(argv):
    opts = {"level": None, "json": False, "ids": None, "iterations": 1, "error": None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, _, val = arg.partition("=")
        if key in ("-r", "--run"):
            if not val:
                i += 1
                val = argv[i] if i < len(argv) else ""
            opts["level"] = LEVEL_ALIASES.get(val.strip().lower())
            if opts["level"] is None:
                opts["error"] = "Error: Invalid value for -r: %s. Valid values are 1, 2, 3, 4, short, medium, long, xlong." % val
        elif key in ("-j", "--json"):
            opts["json"] = True
        elif key in ("-i", "--entity-id", "-g", "--group"):
            if not val:
                i += 1
                val = argv[i] if i < len(argv) else ""
            opts["ids"] = [int(x.split(":")[-1]) for x in val.split(",") if x.split(":")[-1].strip().isdigit()]
        elif key == "--iterations":
            if not val:
                i += 1
                val = argv[i] if i < len(argv) else "1"
            opts["iterations"] = max(1, int(val)) if val.isdigit() else 1
        i += 1
    if opts["level"] is None and not opts["error"]:
        opts["error"] = "Error: -r <level> is required."
    return opts


def diag(node, argv, version, out, err):
    opts = _parse(argv)
    if opts["error"]:
        err.write(opts["error"] + "\n")
        return 1
    level = opts["level"]
    gpus = [g for g in node.gpus if opts["ids"] is None or g["index"] in opts["ids"]]
    start = time.time()
    stress = level >= 2
    real_s = min(30.0, LEVEL_SIM_SECONDS[level] * node.scale) * opts["iterations"]
    if stress:
        node.add_load([g["index"] for g in gpus if g["index"] not in node.lost()], start, start + real_s + 0.5,
                      "dcgmi", process_name="/usr/libexec/datacenter-gpu-manager-4/plugins/cuda12/nvvs")
    try:
        # Sample the GPUs under load half way through, as the plugins do.
        time.sleep(real_s / 2)
        view = View(node)
        runs = [_run_once(node, view, gpus, level, version) for _ in range(opts["iterations"])]
        time.sleep(real_s / 2)
    finally:
        if stress:
            node.remove_load()
    failed = any(r[1] for r in runs)
    if opts["json"]:
        if opts["iterations"] > 1:
            doc = {"iterations": [r[0] for r in runs], "Overall Result": "Fail" if failed else "Pass"}
        else:
            doc = runs[0][0]
        out.write(json.dumps(doc, indent=4) + "\n")
    else:
        _table(runs[0][0], version, out)
    return EXIT_FAIL if failed else 0


def _results_for(node, view, g, test, level):
    """(status, warnings, info) of one test on one GPU."""
    lost = g["index"] in view.lost
    if lost:
        return "Fail", [{"warning": "GPU %d (%s) is inaccessible: GPU is lost. Reboot the system to recover this GPU"
                         % (g["index"], g["pci_bus_id"]), "error_id": 81, "error_severity": 2}], []
    if test != "software" and g["dcgm_max_level"] < 2:
        return "Skip", [], ["The %s test is skipped on this GPU SKU (%s): level 1 only." % (test, g["name"])]
    for o in node.scen["dcgm"].get("results", []):
        if o.get("test") == test and int(o.get("gpu", -1)) == g["index"]:
            w = [{"warning": o["warning"], "error_id": int(o.get("error_id", 0)),
                  "error_severity": int(o.get("error_severity", 2))}] if o.get("warning") else []
            return o.get("status", "Fail"), w, list(o.get("info", []))
    info = []
    if test == "pcie":
        gen, width = view.pcie_gen(g), view.pcie_width(g)
        bw = LANE_GBPS.get(gen, 1.0) * width * 0.82
        info.append("GPU %d GPU to Host bandwidth:\t\t%.2f GB/s" % (g["index"], bw))
        if gen < g["pcie_gen_max"] or width < g["pcie_width_max"]:
            return "Fail", [{"warning": "Error: GPU %d PCIe link is degraded under load: generation %d width x%d, "
                                        "expected generation %d width x%d. Check the riser, slot and cabling."
                                        % (g["index"], gen, width, g["pcie_gen_max"], g["pcie_width_max"]),
                             "error_id": 85, "error_severity": 2}], info
    if test == "memory":
        e = view.ecc(g)
        if e and e["remap_histogram"].get("none", 0) + e["remap_histogram"].get("low", 0) > 0:
            return "Fail", [{"warning": "Warning: GPU %d has %d correctable remapped rows and low bank remap "
                                        "availability; monitor it." % (g["index"], e["remapped_rows_correctable"]),
                             "error_id": 96, "error_severity": 1}], info
    if test == "memory_bandwidth":
        info.append("GPU %d DRAM bandwidth: %.1f GB/s" % (g["index"], 3010.0 if g["architecture"] == "Hopper" else 1900.0))
    return "Pass", [], info


def _run_once(node, view, gpus, level, version):
    if node.scen["dcgm"].get("runtime_error"):
        key = "DCGM GPU Diagnostic" if version.startswith("3.") else "DCGM Diagnostic"
        return ({key: {"test_categories": [], "runtime_error": node.scen["dcgm"]["runtime_error"]},
                 "metadata": {"version": version}}, True)
    failed = False
    cats = []
    for category, test, first in TESTS:
        if first > level:
            continue
        results, statuses = [], []
        for g in gpus:
            status, warnings, info = _results_for(node, view, g, test, level)
            statuses.append(status)
            if status == "Fail" and any(w["error_severity"] >= 2 for w in warnings):
                failed = True
            res = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": g["index"], "status": status}
            if version.startswith("3."):
                res = {"gpu_id": str(g["index"]), "status": status.upper()}
            if warnings:
                res["warnings"] = warnings
            if info:
                res["info"] = info
            results.append(res)
        summary = "Fail" if "Fail" in statuses else ("Skip" if statuses and all(s == "Skip" for s in statuses)
                                                     else "Pass")
        name = NAMES_3X[test] if version.startswith("3.") else test
        entry = {"name": name, "results": results, "test_summary": {"status": summary}}
        cat = next((c for c in cats if c["category"] == category), None)
        if cat is None:
            cat = {"category": category, "tests": []}
            cats.append(cat)
        cat["tests"].append(entry)
    if version.startswith("3."):
        return {"DCGM GPU Diagnostic": {"test_categories": cats, "version": version}}, failed
    doc = {
        "DCGM Diagnostic": {"test_categories": cats},
        "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1, "entities": [
            {"entity_id": g["index"], "serial_num": g["serial"] or "", "sku": g["pci_device_id"],
             "device_id": g["pci_device_id"]} for g in gpus]}],
        "metadata": {"version": version, "Driver Version Detected": node.scen["driver"]["version"]},
    }
    return doc, failed


def _table(doc, version, out):
    body = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic") or {}
    line = "+---------------------------+------------------------------------------------+"
    out.write("Successfully ran diagnostic for group.\n%s\n| Diagnostic                | Result"
              "                                         |\n%s\n" % (line, line.replace("-", "=")))
    out.write("| %-25s | %-46s |\n" % ("DCGM Version", version))
    if body.get("runtime_error"):
        out.write("| %-25s | %-46s |\n" % ("Runtime error", body["runtime_error"][:46]))
    for cat in body.get("test_categories", []):
        out.write("%s\n| %-76s |\n%s\n" % (line, "-----  %s  " % cat["category"] + "-" * 40, line))
        for t in cat["tests"]:
            out.write("| %-25s | %-46s |\n" % (t["name"], t["test_summary"]["status"]))
    out.write(line + "\n")
