# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parse and judge gpu_burn (wilicc/gpu-burn) output; stdlib only, runs on the node (formats: gpu_burn-drv.cpp).

Shapes read:
  cuInit returned 0 (no error)  (stderr, gpu_burn since November 2025; a non-zero CUresult is read into cuda_errors)
  Using compare file: compare.ptx / Burning for 600 seconds.
  Initialized device 0 with 81079 MB of memory (80484 MB available, using 72436 MB of it), using FLOATS[, using Tensor Cores]
  progress frames rewritten with \\r (so in a captured log they are glued together or split across lines):
    11.7%  proc'd: 2947 (7124 Gflop/s) - 2664 (6963 Gflop/s)   errors: 0 - 3  (WARNING!)   temps: 56 C - -- [  power: 300 W - 290 W ]
  a tab/space indented "Summary at:   <date>" about every 10 %; the error counters restart after each summary
  Killing processes with SIGTERM (soft kill) / done / Tested 2 GPUs: / GPU 0: OK / GPU 1: FAULTY
  Couldn't init a GPU test: ..., Failure during compute: ..., No clients are alive!  Aborting
  a worker killed by an uncaught exception (older gpu_burn, or an error outside its try blocks), printed by the C++
  runtime: `terminate called after throwing an instance of 'std::runtime_error'` then `  what():  <message>`; an
  uncaught std::string has no what() line (`... instance of 'std::string'`, or its C++11 ABI name)
  checkError's message, in any of the lines above: `Error (gpu_burn-drv.cpp:298): system not yet initialized` or
  `Error in <what> (gpu_burn-drv.cpp:112): <cuGetErrorString text>`, read into cuda_errors with the CUresult
  (module_utils/cuda_errors.py): error 802 is the NVLink fabric not ready, not a faulty GPU

Captured through a pipe or into a file (as the module reads it), gpu_burn's stdout is block-buffered: each worker's
"Initialized device" and "Results are" lines, and a copy of the start lines it inherited at fork, come out when the
worker exits, after the frames (a real H200 capture, tests/fixtures/gpu_burn/h200_piped_20s.log), or never when it is
killed with SIGKILL: a GPU whose frames show work was initialised, line or not.

Traps: exit code 0 with FAULTY GPUs; negative error counts (int overflow, or -1 added by a dying worker); "OK" after a
failed init; no progress frames at all. A GPU passes only if initialised, did work, had zero errors in every frame and
was not reported FAULTY.

Output whose start was not captured (a log tail, a redirect that missed the first lines) has no "Initialized device"
lines: each GPU's status then comes from the final GPU n: OK/FAULTY lines, the (DIED!) markers and the error counts
alone, and the judgement says that initialisation could not be checked (never a pass).

Each GPU also gets gflops_series: [[percent, Gflop/s], ...], one point per progress frame (0 once its worker is dead:
gpu_burn keeps printing the last figure of a dead worker), thinned evenly to at most MAX_SERIES_POINTS while reading,
so a long burn costs bounded memory.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.kentino.gpufleet.plugins.module_utils.cuda_errors import driver_error

_FRAME_START = re.compile(r"(\d{1,3}(?:\.\d+)?)%\s+proc'd:")
_FRAME = re.compile(
    r"^(?P<pct>\d{1,3}(?:\.\d+)?)%\s+proc'd:(?P<proc>.*?)errors:(?P<errors>.*?)temps:(?P<temps>.*?)"
    r"(?:power:(?P<power>.*))?$"
)
_PROC_ENTRY = re.compile(r"(-?\d+)\s*\(\s*([-+\w.]+)\s*Gflop/s\)")
_ERR_ENTRY = re.compile(r"(-?\d+)\s*(\((?:WARNING|DIED)!\))?")
_TEMP_ENTRY = re.compile(r"(-?\d+)\s*C\b|(--)")
_POWER_ENTRY = re.compile(r"(-?\d+(?:\.\d+)?)\s*W\b|(--)")
_INIT = re.compile(
    r"Initialized device (?P<dev>\d+) with (?P<total>\d+) MB of memory \((?P<avail>\d+) MB available, "
    r"using (?P<used>\d+) MB of it\)(?:, using (?P<prec>\w+))?(?P<tc>, using Tensor Cores)?"
)
_COMPARE = re.compile(r"Using compare file:\s*(.*)$")
_BURNING = re.compile(r"Burning for (\d+) seconds")
_TESTED = re.compile(r"Tested (\d+) GPUs:")
_FINAL = re.compile(r"^\s*GPU (\d+):\s*(OK|FAULTY)\s*$")
_SUMMARY = re.compile(r"^\s*Summary at:")
_SMI_L = re.compile(r"^GPU \d+: .*\(UUID: ")
_CUINIT = re.compile(r"^cuInit returned (?P<code>-?\d+) \((?P<text>.*)\)$")
_KNOWN_NOISE = (
    "Killing processes", "done", "Results are ", "Freed memory for dev", "Uninitted cublas",
    "Run length not specified", "read[",
)
_FAILURE_MARKERS = (
    ("init_failures", "Couldn't init a GPU test"),
    ("compute_failures", "Failure during compute"),
    ("cuda_failures", "Couldn't init CUDA"),
    ("cuda_failures", "No CUDA devices"),
    ("cuda_failures", "No CUDA capable GPUs"),
    ("aborted", "No clients are alive"),
)
_TERMINATE = re.compile(r"^terminate called after throwing an instance of '(.+)'\s*$")
_WHAT = re.compile(r"^what\(\):\s*(.*)$")
_CHECK_ERROR = re.compile(r"\bError(?: in (?P<desc>.+?))? \((?P<where>[^()\s]+:\d+)\): (?P<error>.+?)\s*$")
MAX_SAMPLES = 5
MAX_SERIES_POINTS = 240
MAX_DISTINCT = 10  # distinct CUDA errors and crash lines kept (a looping gpu_burn prints them thousands of times)


class _Series:
    """Points kept at a stride that doubles whenever twice the limit is reached, so memory stays bounded while the
    points stay evenly spread over the run; points() thins to the limit and always ends with the last point."""

    def __init__(self, limit=MAX_SERIES_POINTS):
        self.limit = max(2, int(limit))
        self.kept = []
        self.stride = 1
        self.seen = 0
        self.last = None

    def add(self, point):
        if self.seen % self.stride == 0:
            self.kept.append(point)
            if len(self.kept) >= 2 * self.limit:
                self.kept = self.kept[::2]
                self.stride *= 2
        self.seen += 1
        self.last = point

    def points(self):
        kept = list(self.kept)
        if self.last is not None and (not kept or kept[-1] is not self.last):
            kept.append(self.last)
        if len(kept) > self.limit:
            step = (len(kept) - 1) / float(self.limit - 1)
            kept = [kept[int(round(i * step))] for i in range(self.limit)]
        return [list(p) for p in kept]


def _to_float(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    return value


def _segments(text):
    """Lines of the log with \\r-rewritten frames separated, however the capture glued or split them."""
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        starts = [m.start() for m in _FRAME_START.finditer(raw)]
        if not starts:
            yield raw
            continue
        if starts[0] > 0:
            yield raw[:starts[0]]
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else len(raw)
            yield raw[start:end]


def _parse_frame(segment):
    """One progress frame -> list of per-GPU dicts, or None when it is not a complete frame."""
    match = _FRAME.match(segment.strip())
    if not match:
        return None
    procs = _PROC_ENTRY.findall(match.group("proc"))
    errors = _ERR_ENTRY.findall(match.group("errors"))
    temps = _TEMP_ENTRY.findall(match.group("temps"))
    powers = _POWER_ENTRY.findall(match.group("power") or "")
    if not procs or len(errors) != len(procs):
        return None
    gpus = []
    for i, (proc, gflops) in enumerate(procs):
        err_count, marker = errors[i]
        temp = temps[i] if i < len(temps) else ("", "--")
        power = powers[i] if i < len(powers) else ("", "--")
        gpus.append({
            "processed": int(proc),
            "gflops": _to_float(gflops),
            "errors": int(err_count),
            "warning": marker == "(WARNING!)",
            "died": marker == "(DIED!)" or int(proc) == -1,
            "temperature_c": int(temp[0]) if temp[0] else None,
            "power_w": _to_float(power[0]) if power[0] else None,
        })
    return {"percent": _to_float(match.group("pct")), "gpus": gpus}


def _new_gpu(index):
    return {
        "index": index, "cuda_index": index, "initialised": False, "memory_total_mb": None, "memory_used_mb": None,
        "precision": None,
        "frames": 0, "processed": 0, "gflops_max": None, "gflops_mean": None, "_gflops": [],
        "errors": 0, "error_frames": 0, "negative_error_frames": 0, "_window_max": 0,
        "warning_frames": 0, "died": False, "max_temperature_c": None, "max_power_w": None, "final": None,
        "first_error_line": None, "died_line": None, "_series": _Series(),
    }


def parse_gpu_burn(text):
    """gpu_burn stdout (+stderr) -> dict; never raises. See the module docstring for the shapes."""
    text = text if isinstance(text, str) else ("" if text is None else str(text))
    out = {
        "compare_file": None, "burn_seconds": None, "frames": 0, "summaries": 0, "last_percent": None,
        "tested_gpus": None, "gpus": [], "init_failures": [], "compute_failures": [], "cuda_failures": [],
        "aborted": [], "finished": False, "unparsed": {"count": 0, "samples": []}, "problems": [],
        "evidence": [], "init_lines_seen": False, "cuda_errors": [], "terminated": [],
    }
    gpus = {}
    in_final = False
    last_frame_line = None

    def gpu(index):
        if index not in gpus:
            gpus[index] = _new_gpu(index)
        return gpus[index]

    def counted(key, item, match):
        """Add item to out[key] once (the same error repeats per GPU and per loop), counting the repeats."""
        for known in out[key]:
            if all(known.get(k) == item.get(k) for k in match):
                known["count"] += 1
                return False
        if len(out[key]) < MAX_DISTINCT:
            out[key].append(dict(item, count=1))
            out["evidence"].append(item["line"])
        return True

    def count_cuda_error(error, where, context, line, code=None):
        """One CUDA error into cuda_errors: its CUresult (looked up from its text unless given) and name."""
        known_code, name = driver_error(error)
        counted("cuda_errors", {"error": error, "code": known_code if code is None else code, "name": name,
                                "where": where, "context": context, "line": line}, ("error", "where", "context"))

    def cuda_error(line):
        """Read checkError's message in a line into cuda_errors; True when there was one."""
        match = _CHECK_ERROR.search(line)
        if not match:
            return False
        count_cuda_error(match.group("error"), match.group("where"), match.group("desc"), line)
        return True

    def close_window():
        # Counters are cumulative inside a summary window and restart after it: count each window once, by its
        # largest |count| (robust to the sign flip of an overflowed counter).
        for entry in gpus.values():
            entry["errors"] += entry["_window_max"]
            entry["_window_max"] = 0

    for segment in _segments(text):
        line = segment.rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        frame = _parse_frame(stripped) if "proc'd:" in stripped else None
        if frame is not None:
            out["frames"] += 1
            out["last_percent"] = frame["percent"]
            last_frame_line = stripped
            for index, values in enumerate(frame["gpus"]):
                entry = gpu(index)
                entry["frames"] += 1
                entry["processed"] = max(entry["processed"], values["processed"])
                if values["gflops"] is not None and values["gflops"] > 0:
                    entry["_gflops"].append(values["gflops"])
                if frame["percent"] is not None and values["gflops"] is not None:
                    entry["_series"].add((frame["percent"], 0.0 if values["died"] else values["gflops"]))
                if values["died"]:
                    # A dying worker reports -1 as its error count: that is the death signal, not a miscompare.
                    if not entry["died"]:
                        entry["died_line"] = stripped
                    entry["died"] = True
                elif values["errors"]:
                    entry["error_frames"] += 1
                    entry["_window_max"] = max(entry["_window_max"], abs(values["errors"]))
                    if entry["first_error_line"] is None:
                        entry["first_error_line"] = stripped
                if values["errors"] < 0 and not values["died"]:
                    entry["negative_error_frames"] += 1
                if values["warning"]:
                    entry["warning_frames"] += 1
                for key, value in (("max_temperature_c", values["temperature_c"]), ("max_power_w", values["power_w"])):
                    if value is not None and (entry[key] is None or value > entry[key]):
                        entry[key] = value
            continue
        if "proc'd:" in stripped:
            # A frame cut off by the capture (the last one of a killed run): not evidence of anything.
            out["problems"].append({"kind": "partial_frame", "message": "incomplete progress frame",
                                    "line": stripped[:200]})
            continue
        if _SUMMARY.match(line):
            out["summaries"] += 1
            close_window()
            continue
        match = _INIT.search(stripped)
        if match:
            entry = gpu(int(match.group("dev")))
            entry["initialised"] = True
            out["init_lines_seen"] = True
            entry["memory_total_mb"] = int(match.group("total"))
            entry["memory_used_mb"] = int(match.group("used"))
            prec = (match.group("prec") or "").upper()
            entry["precision"] = "double" if prec == "DOUBLES" else ("float" if prec == "FLOATS" else None)
            out["evidence"].append(stripped)
            continue
        match = _TESTED.search(stripped)
        if match:
            out["tested_gpus"] = int(match.group(1))
            in_final = True
            out["evidence"].append(stripped)
            continue
        match = _FINAL.match(stripped)
        if match and in_final:
            gpu(int(match.group(1)))["final"] = match.group(2)
            out["evidence"].append(stripped)
            continue
        match = _TERMINATE.match(stripped)
        if match:
            counted("terminated", {"line": stripped}, ("line",))
            continue
        match = _WHAT.match(stripped)
        if match:
            if not cuda_error(stripped):
                counted("terminated", {"line": stripped}, ("line",))
            continue
        failure = [key for key, marker in _FAILURE_MARKERS if marker in stripped]
        if failure:
            out[failure[0]].append(stripped)
            if not cuda_error(stripped):
                out["evidence"].append(stripped)
            continue
        match = _CUINIT.match(stripped)
        if match:
            code = int(match.group("code"))
            if code:  # the CUresult itself, not a text to look up: the 802 of a fabric not ready is read from here
                count_cuda_error(match.group("text"), "cuInit", None, stripped, code=code)
            continue
        match = _COMPARE.search(stripped)
        if match:
            out["compare_file"] = match.group(1).strip()
            continue
        match = _BURNING.search(stripped)
        if match:
            out["burn_seconds"] = int(match.group(1))
            continue
        if stripped.startswith("Killing processes") or stripped == "done":
            out["finished"] = out["finished"] or stripped == "done"
            continue
        if _SMI_L.match(stripped) or stripped.startswith(_KNOWN_NOISE) or _looks_like_date(stripped):
            continue
        out["unparsed"]["count"] += 1
        if len(out["unparsed"]["samples"]) < MAX_SAMPLES:
            out["unparsed"]["samples"].append(stripped[:200])
    close_window()

    init_known = not start_missing(out)
    for index in sorted(gpus):
        entry = gpus[index]
        # A worker's "Initialized device" line waits in its stdout buffer until it exits (to a pipe or a file gpu_burn
        # writes block-buffered): a worker killed with SIGKILL never prints it. Work in its frames proves the init.
        if not entry["initialised"] and entry["processed"] > 0:
            entry["initialised"] = True
        values = entry.pop("_gflops")
        entry.pop("_window_max")
        entry["gflops_series"] = entry.pop("_series").points()
        if values:
            entry["gflops_max"] = round(max(values), 1)
            entry["gflops_mean"] = round(sum(values) / len(values), 1)
        entry["status"] = _gpu_status(entry, init_known)
        out["gpus"].append(entry)
    if last_frame_line:
        out["evidence"].append(last_frame_line)
    return out


def _looks_like_date(line):
    # `date` output after "Summary at:" lands on its own line in captured logs: "Tue Aug 13 10:01:02 UTC 2024".
    return bool(re.match(r"^[A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2} ", line))


def start_missing(parsed):
    """True when the output lacks the run's start (no "Initialized device", "Burning for" or compare-file line): a log
    tail, so a GPU's missing init line proves nothing."""
    return not parsed["init_lines_seen"] and parsed["burn_seconds"] is None and parsed["compare_file"] is None


def _gpu_status(entry, init_known=True):
    if init_known and not entry["initialised"]:
        return "not_initialised"
    if entry["died"]:
        return "died"
    if entry["errors"] or entry["error_frames"] or entry["final"] == "FAULTY":
        return "faulty"
    if entry["processed"] <= 0 or not entry["gflops_max"]:
        return "no_work"
    return "ok"
