# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Run nvidia-smi --query-gpu across driver generations (stdlib only: runs on the node). Shared by gpu_facts and
gpu_sample so that both ask for fields the same way and parse them with the same parser.

Field sets differ between drivers and ONE unknown name aborts the whole query (`Field "X" is not a valid field to
query.`, non-zero exit). So: ask optimistically with the newest names (one call on a current driver); when a field is
rejected, read --help-query-gpu once, drop or replace (old name) every field this driver does not know, ask again.
Rejections are remembered for the life of the QueryGpu object, so a sampling loop pays for the probe only once.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi import (
    decode_throttle_mask,
    parse_help_query_gpu,
    parse_query_gpu,
    parse_tool_messages,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool

# Every field the collection asks for: result key -> candidate field names, newest first. Old names:
# pcie.link.gen.current (before gpucurrent), clocks_throttle_reasons.* (before clocks_event_reasons.*, R535).
HISTOGRAM_LEVELS = ("max", "high", "partial", "low", "none")  # remapped_rows.histogram.*: bank remap availability
FIELDS = {
    "index": ("index",),
    "pci": ("pci.bus_id",),
    "uuid": ("uuid",),
    "serial": ("serial",),
    "name": ("name",),
    "driver_version": ("driver_version",),
    "vbios": ("vbios_version",),
    "temperature_c": ("temperature.gpu",),
    "power_w": ("power.draw",),
    "power_limit_w": ("power.limit",),
    "utilization_gpu_pct": ("utilization.gpu",),
    "memory_used_mib": ("memory.used",),
    "memory_total_mib": ("memory.total",),
    "pcie_gen_current": ("pcie.link.gen.gpucurrent", "pcie.link.gen.current"),
    "pcie_gen_max": ("pcie.link.gen.max",),
    "pcie_width_current": ("pcie.link.width.current",),
    "pcie_width_max": ("pcie.link.width.max",),
    "ecc_mode": ("ecc.mode.current",),
    "ecc_volatile_corrected": ("ecc.errors.corrected.volatile.total",),
    "ecc_volatile_uncorrected": ("ecc.errors.uncorrected.volatile.total",),
    "ecc_aggregate_corrected": ("ecc.errors.corrected.aggregate.total",),
    "ecc_aggregate_uncorrected": ("ecc.errors.uncorrected.aggregate.total",),
    "retired_pages_sbe": ("retired_pages.sbe",),
    "retired_pages_dbe": ("retired_pages.dbe",),
    "retired_pages_pending": ("retired_pages.pending",),
    "remapped_rows_correctable": ("remapped_rows.correctable",),
    "remapped_rows_uncorrectable": ("remapped_rows.uncorrectable",),
    "remapped_rows_pending": ("remapped_rows.pending",),
    "remapped_rows_failure": ("remapped_rows.failure",),
    "throttle_reasons": ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
    "persistence_mode": ("persistence_mode",),
    "recovery_action": ("gpu_recovery_action",),
}
FIELDS.update(("remap_banks_" + level, ("remapped_rows.histogram." + level,)) for level in HISTOGRAM_LEVELS)
# What only the audit's health snapshot reads: when nvidia-smi took the reading, the SM clocks, the InfoROM image.
FIELDS.update({"read_at": ("timestamp",), "clocks_sm_mhz": ("clocks.sm",), "clocks_sm_max_mhz": ("clocks.max.sm",),
               "inforom_image": ("inforom.img",)})


def spec(*keys):
    """A QueryGpu field set: ((result key, candidate names), ...) for these keys of FIELDS, in this order."""
    return tuple((key, FIELDS[key]) for key in keys)


IDENTITY = ("index", "pci", "uuid")
MEMORY_HEALTH = ("ecc_volatile_corrected", "ecc_volatile_uncorrected", "ecc_aggregate_corrected",
                 "ecc_aggregate_uncorrected", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending",
                 "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
                 "remapped_rows_failure")
FACTS_SPEC = spec(*IDENTITY + ("serial", "name", "driver_version", "vbios", "temperature_c", "power_w",
                               "power_limit_w", "memory_used_mib", "memory_total_mib", "pcie_gen_current",
                               "pcie_gen_max", "pcie_width_current", "pcie_width_max", "ecc_mode") + MEMORY_HEALTH
                  + ("throttle_reasons", "persistence_mode", "recovery_action"))
# Under load: the rated link too, so the sampler's judge needs no other source; corrected ECC to see a leak grow.
SAMPLE_SPEC = spec("index", "pci", "temperature_c", "power_w", "pcie_gen_current", "pcie_width_current",
                   "utilization_gpu_pct", "throttle_reasons", "memory_used_mib", "pcie_gen_max", "pcie_width_max",
                   "ecc_volatile_corrected")

TOOL_HINT = "check `dmesg` for XID 79 (GPU fallen off the bus) and reseat/recable the card or power-cycle the node"


def gpu_problem(kind, message, pci=None, index=None):
    """The shape of one gpufleet_gpu_problems entry (index: the GPU's nvidia-smi index where the tool named it)."""
    return {"kind": kind, "pci": pci, "index": index, "message": message}


def public_problems(items):
    """Parser problems -> {kind, pci, index, message}, dropping duplicates (a lost GPU is reported by several calls)."""
    out = []
    seen = set()
    for item in items:
        entry = gpu_problem(item.get("kind"), item.get("message"), item.get("pci"), item.get("index"))
        key = (entry["kind"], entry["pci"], entry["index"] if entry["pci"] is None else None,
               entry["message"] if entry["kind"] != "lost" else None)
        if key in seen:
            continue
        seen.add(key)
        out.append(entry)
    return out


def _first_line(*texts):
    for text in texts:
        for line in (text or "").splitlines():
            if line.strip():
                return line.strip()[:300]
    return ""


class QueryGpu:
    """One --query-gpu field set resolved against the local driver, runnable many times."""

    def __init__(self, executable, spec, timeout_s, runner=run_tool):
        self.executable = executable
        self.spec = tuple(spec)
        self.timeout_s = timeout_s
        self.runner = runner
        self.rejected = []  # field names this driver refused; never asked again in this run
        self.valid = None  # field names from --help-query-gpu, once probed
        self.help_probed = False
        self.calls = []  # tool dicts of every nvidia-smi invocation, for the evidence

    def chosen(self):
        """{result key: field name} for every key with a candidate this driver accepts (or has not refused yet)."""
        out = {}
        for key, candidates in self.spec:
            for name in candidates:
                if name in self.rejected:
                    continue
                if self.valid is not None and name.lower() not in self.valid:
                    continue
                out[key] = name
                break
        return out

    def unsupported_keys(self):
        chosen = self.chosen()
        return [key for key, _c in self.spec if key not in chosen]

    def _run(self, argv):
        result = self.runner(argv, self.timeout_s)
        self.calls.append(result.as_dict())
        return result

    def _probe_help(self):
        self.help_probed = True
        result = self._run([self.executable, "--help-query-gpu"])
        fields = parse_help_query_gpu(result.stdout)["fields"] if result.error is None else []
        if fields:
            self.valid = set(f.lower() for f in fields)  # the help spells some names in camelCase

    def run(self):
        """Query once (re-asking after rejected fields). Returns {"gpus": [{key: value}], "rows": [raw lines],
        "problems": [{kind, message, line, pci}], "unparsed", "tool": last ToolResult or None}. Never raises."""
        out = {"gpus": [], "rows": [], "problems": [], "unparsed": {"count": 0, "samples": []}, "tool": None}
        for _attempt in range(len(self.spec) + 3):
            chosen = self.chosen()
            if not chosen:
                out["problems"].append(_err("tool_error", "nvidia-smi accepts none of the fields gpufleet queries "
                                            "(rejected: %s); update the NVIDIA driver" % ", ".join(self.rejected)))
                return out
            keys = [key for key, _c in self.spec if key in chosen]
            names = [chosen[k] for k in keys]
            argv = [self.executable, "--query-gpu=" + ",".join(names), "--format=csv,noheader,nounits"]
            result = self._run(argv)
            out["tool"] = result
            if result.error is not None:
                out["problems"].append(_err("tool_error", "%s; install or repair the NVIDIA driver" % result.error))
                return out
            if result.timed_out:
                out["problems"].append(_err("tool_error", "nvidia-smi --query-gpu timed out after %ss (a hung driver "
                                            "or a lost GPU); %s" % (self.timeout_s, TOOL_HINT)))
                return out
            parsed = parse_query_gpu(result.stdout, names)
            messages = parse_tool_messages(result.stderr)
            rejected = [f for f in parsed["rejected_fields"] + messages["rejected_fields"]]
            if rejected:
                new = [f for f in rejected if f not in self.rejected]
                if not new:
                    out["problems"].append(_err("tool_error", "nvidia-smi keeps rejecting field(s) %s: %s"
                                                % (", ".join(rejected), _first_line(result.stdout, result.stderr))))
                    return out
                self.rejected.extend(new)
                if not self.help_probed:
                    self._probe_help()
                continue
            out["problems"].extend(parsed["problems"] + messages["problems"])
            out["unparsed"] = parsed["unparsed"]
            for row in parsed["gpus"]:
                out["gpus"].append(_row_to_keys(row["values"], chosen))
                out["rows"].append(row["raw"])
            if result.rc != 0 and not out["problems"]:
                out["problems"].append(_err("tool_error", "nvidia-smi --query-gpu exited %s: %s"
                                            % (result.rc, _first_line(result.stderr, result.stdout) or "no output")))
            return out
        out["problems"].append(_err("tool_error", "nvidia-smi --query-gpu: gave up after %d attempts (rejected: %s)"
                                    % (len(self.spec) + 3, ", ".join(self.rejected))))
        return out


def _err(kind, message, pci=None):
    return {"kind": kind, "message": message, "line": "", "pci": pci}


def _row_to_keys(values, chosen):
    """{field: value} of one csv row -> {result key: value}; None for keys this driver cannot report."""
    row = {}
    for key, name in chosen.items():
        value = values.get(name)
        if key == "throttle_reasons":
            value = decode_throttle_mask(value)
        row[key] = value
    return row
