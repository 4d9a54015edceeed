# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge a gpu_burn result, never trusting its exit code (stdlib only).

gpu-burn exits 0 with FAULTY GPUs, prints OK after "Couldn't init a GPU test", can print no progress at all, and its
error counters can overflow negative. CUDA error 802 (its workers' or its own) is the NVLink fabric not ready, said
alone: what follows from it (no progress, missing GPUs, a hang until the timeout) is its consequence. A GPU passes
only if it was initialised, did work (proc'd > 0, Gflop/s > 0), had zero errors in every frame and was not reported
FAULTY or DIED. Per-GPU findings carry nvidia-smi's index and
PCI address (gpu_burn's own device numbers are mapped by the module, in PCI bus order).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.kentino.gpufleet.plugins.module_utils.cuda_errors import SYSTEM_NOT_READY, not_ready_action
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, gpu_label
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import could_not_run, judge_door

CHECK = "gpu_burn"
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads: what a module passes it.
THRESHOLDS = ()

CODES = {
    "BURN_NOT_RUN": ("error", "output not recognised, no CUDA, no compare kernel, no progress, unfinished, or a log "
                              "tail whose GPU initialisation is unproven"),
    "BURN_FAULTY": ("fail", "a GPU: FAULTY, DIED, errors in a frame, not initialised, or no work"),
    "BURN_GPU_MISSING": ("fail", "fewer GPUs initialised than nvidia-smi showed at the start"),
    "BURN_FABRIC_NOT_READY": ("fail", "CUDA error 802 (system not yet initialized): on an NVSwitch machine the fabric "
                                      "manager is not running at the driver's version"),
}


def _rerun(label):
    return "rerun gpu-burn on %s alone; if it fails again replace the card (RMA) with this evidence" % label


def _cuda_errors(result):
    return [e for e in result.get("cuda_errors") or [] if isinstance(e, dict)]


def _fabric_not_ready(result, host, timed_out=False):
    """[finding] when gpu_burn met CUDA error 802 (its workers, or its own cuInit): nothing else it says matters."""
    errors = _cuda_errors(result)
    if not any(e.get("code") == SYSTEM_NOT_READY for e in errors):
        return []
    evidence = [str(e.get("line")) for e in errors] + [str(t.get("line")) for t in result.get("terminated") or []
                                                     if isinstance(t, dict)][:2]
    return [finding("fail", "BURN_FABRIC_NOT_READY", "%s: gpu_burn could not initialise CUDA: error 802 (system not yet "
                    "initialized)%s: the GPUs are not registered with the NVLink fabric, nothing was burnt" % (
                        host, "; it then hung and was killed at its timeout" if timed_out else ""),
                    not_ready_action(host), evidence)]


def _setup_errors(result, host):
    out = _fabric_not_ready(result, host)
    if out:
        return out
    action = "fix the gpu_burn installation or the driver on %s (nvidia-smi must work), then rerun" % host
    seen = set()  # gpu_burn prints the same set-up failure once per GPU: one finding per distinct line
    for line in result.get("cuda_failures") or []:
        if line in seen:
            continue
        seen.add(line)
        out.append(finding("error", "BURN_NOT_RUN", "%s: gpu_burn could not use CUDA (%s)" % (host, line), action,
                           [line]))
    for line in result.get("init_failures") or []:
        if ("compare kernel" in line or "compare.ptx" in line or "compare.fatbin" in line) and line not in seen:
            seen.add(line)
            # The file it looked for: compare.fatbin (gpu-burn since May 2026) or compare.ptx (before).
            named = re.search(r"compare kernel: (\S+)", line)
            out.append(finding("error", "BURN_NOT_RUN", "%s: gpu_burn cannot find its compare kernel (%s)" % (
                host, line), "run it from the directory holding %s (option chdir) on %s" % (
                named.group(1) if named else "its compare kernel (compare.fatbin or compare.ptx)", host), [line]))
    if not result.get("frames"):
        # Workers killed by an uncaught exception before any progress: gpu_burn's crash, not a GPU's fault.
        crashed = [t.get("line") for t in result.get("terminated") or [] if isinstance(t, dict)]
        crashed += [e.get("line") for e in _cuda_errors(result) if e.get("line") not in seen]
        if crashed and not out:
            named = ["%s %s" % (e.get("name"), e.get("code")) for e in _cuda_errors(result) if e.get("name")]
            out.append(finding("error", "BURN_NOT_RUN", "%s: gpu_burn crashed before any progress (%s)%s" % (
                host, crashed[0], ": " + ", ".join(named) if named else ""), action, crashed[:6]))
    return out


def _final_line(entry):
    """The GPU's line of the final summary ("GPU n: OK|FAULTY", n being gpu_burn's device), else its figures: a
    finding always quotes what it rests on."""
    if entry.get("final"):
        return "GPU %s: %s" % (entry.get("cuda_index"), entry["final"])
    return "gpu_burn device %s: initialised=%s proc'd=%s gflops_max=%s errors=%s" % (
        entry.get("cuda_index"), entry.get("initialised"), entry.get("processed"), entry.get("gflops_max"),
        entry.get("errors"))


def _gpu_findings(entry, host):
    index, pci = entry.get("index"), entry.get("pci")
    label = gpu_label(host, index, pci)
    if entry.get("cuda_index") not in (None, index):
        label += " (gpu_burn device %s)" % entry["cuda_index"]
    status = entry.get("status")
    evidence = [entry.get("died_line") or entry.get("first_error_line") or _final_line(entry)]
    if status == "not_initialised":
        return [finding("fail", "BURN_FAULTY", "%s appears in gpu_burn's output but was never initialised" % label,
                        _rerun(label), evidence, index, pci)]
    if status == "died":
        return [finding("fail", "BURN_FAULTY", "%s: its gpu_burn worker died during the run (DIED!): check the "
                        "kernel log for XIDs" % label, "reseat or replace the card; " + _rerun(label), evidence,
                        index, pci)]
    if status == "faulty":
        detail = "%d calculation errors" % entry["errors"] if entry.get("errors") else "reported FAULTY"
        if entry.get("negative_error_frames"):
            detail += " (counter overflowed negative)"
        return [finding("fail", "BURN_FAULTY", "%s produced wrong results under load (%s): faulty GPU memory or "
                        "compute" % (label, detail), _rerun(label), evidence, index, pci)]
    if status == "no_work":
        return [finding("fail", "BURN_FAULTY", "%s was initialised but did no work (proc'd %s, Gflop/s %s): hung or "
                        "stalled GPU" % (label, entry.get("processed"), entry.get("gflops_max")), _rerun(label),
                        evidence, index, pci)]
    return []


@judge_door(CHECK)
def judge(result, t, host, expected_gpus=None):
    """[finding] for one gpu_burn result. expected_gpus: how many GPUs the burn should have initialised."""
    out = could_not_run(result, CHECK, host)
    if out and (result.get("tool") or {}).get("timed_out"):
        # gpu_burn loops after its workers die of error 802 (wilicc/gpu-burn#92): the timeout is its consequence.
        return _fabric_not_ready(result, host, timed_out=True) or out
    if out or result.get("not_run"):
        return out
    rc = (result.get("tool") or {}).get("rc")
    gpus = result.get("gpus") or []
    frames = result.get("frames") or 0
    recognised = (result.get("burn_s") is not None or frames or gpus or result.get("tested_gpus") is not None
                  or result.get("init_failures") or result.get("cuda_failures") or result.get("aborted")
                  or result.get("terminated") or result.get("cuda_errors"))
    if not recognised:
        return [finding("error", "BURN_NOT_RUN", "%s: gpu_burn output not recognised (rc=%s): no start, progress or "
                        "summary lines" % (host, rc), "run gpu_burn by hand on %s and read its output" % host,
                        (result.get("unparsed") or {}).get("samples"))]
    # Set-up problems make every later symptom (dead workers, missing GPUs) an artefact: report them alone.
    out = _setup_errors(result, host)
    if out:
        return out
    for entry in gpus:
        if entry.get("status") == "no_work" and not frames:
            continue  # no progress at all is one node-level error below, not eight GPU failures
        out.extend(_gpu_findings(entry, host))
    # Lines that name no GPU: evidence of the GPUs' own findings when there are some, a finding of their own if not.
    rerun = "rerun gpu-burn on %s; replace the GPU it names if it fails again" % host
    unnamed = [("a GPU test could not initialise (%s): the GPU is unusable, check nvidia-smi and the kernel log for "
                "XIDs", line) for line in result.get("init_failures") or []]
    unnamed += [("all gpu_burn workers died (%s)", line) for line in result.get("aborted") or []]
    unnamed += [("a GPU failed during compute (%s)", line) for line in result.get("compute_failures") or []]
    if out:
        for _what, line in unnamed:
            if line not in out[0]["evidence"]:
                out[0]["evidence"].append(line)
    else:
        out.extend(finding("fail", "BURN_FAULTY", "%s: %s" % (host, what % line), rerun, [line])
                   for what, line in unnamed)
    initialised = [g for g in gpus if g.get("initialised")]
    if result.get("start_missing") and gpus:
        # A log tail (no "Initialized device" lines): the statuses come from the end of the run, init is unproven.
        out.append(finding("error", "BURN_NOT_RUN", "%s: gpu_burn output has no 'Initialized device' lines (a log tail "
                           "or a run whose start was not captured): that GPUs %s initialised is not proven" % (
                               host, ", ".join(str(g.get("index")) for g in gpus)),
                           "rerun gpu_burn on %s and keep its whole output" % host))
        if expected_gpus is not None and len(gpus) < expected_gpus:
            out.append(finding("fail", "BURN_GPU_MISSING", "%s: only %d of %d expected GPUs appear in gpu_burn's "
                               "output" % (host, len(gpus), expected_gpus),
                               "check nvidia-smi, risers and power on %s" % host))
    elif expected_gpus is not None and len(initialised) < expected_gpus:
        out.append(finding("fail", "BURN_GPU_MISSING", "%s: only %d of %d expected GPUs initialised in gpu_burn" % (
            host, len(initialised), expected_gpus), "check nvidia-smi, risers and power on %s" % host,
            ["initialised: %s" % ", ".join(str(g.get("index")) for g in initialised)]))
    if not frames:
        out.append(finding("error", "BURN_NOT_RUN", "%s: gpu_burn printed no progress frames: nothing was measured"
                           % host, "run gpu_burn by hand on %s and read its output" % host))
    elif result.get("tested_gpus") is None and not result.get("aborted"):
        out.append(finding("error", "BURN_NOT_RUN", "%s: gpu_burn did not finish (no 'Tested N GPUs' summary, last "
                           "progress %s%%)" % (host, result.get("last_percent")),
                           "rerun gpu_burn on %s and read the end of its output" % host))
    if result.get("tested_gpus") is not None and gpus and result["tested_gpus"] != len(gpus):
        out.append(finding("error", "BURN_NOT_RUN", "%s: gpu_burn tested %d GPUs but its output shows %d" % (
            host, result["tested_gpus"], len(gpus)), "rerun gpu_burn on %s and read its output" % host))
    if rc not in (0, None) and not out:
        out.append(finding("error", "BURN_NOT_RUN", "%s: gpu_burn exited with rc=%s although its output looks "
                           "clean" % (host, rc), "rerun gpu_burn on %s and read its output" % host))
    return out


@judge_door(CHECK, empty=lambda: ([], {}), takes_t=False)
def figures(result):
    """Per GPU: mean and best Gflop/s, errors, temperature; and the Gflop/s series for the chart."""
    per, series = [], {}
    for g in result.get("gpus") or []:
        per.append({"index": g.get("index"), "pci": g.get("pci"), "burn_gflops": g.get("gflops_mean"),
                    "burn_gflops_max": g.get("gflops_max"), "burn_errors": g.get("errors"),
                    "burn_temperature_max_c": g.get("max_temperature_c")})
        if g.get("gflops_series") and g.get("index") is not None:
            series[str(g["index"])] = g["gflops_series"]
    return per, series
