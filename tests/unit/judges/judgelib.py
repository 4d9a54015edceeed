"""What every judge test checks: the finding contract, the module schema of the inputs, and bad input.

A judge is pure: judge(result, thresholds, host, ...) -> [finding]. These helpers keep the tests about what each
finding means (the code, the GPU it names, the threshold behind it).
"""

import copy
import re

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import module_fields
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULTS
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reading import schema_errors
from hypothesis import strategies as st

HOST = "node01"
TOOL_OK = {"argv": ["tool"], "rc": 0, "timed_out": False, "duration_s": 1.0, "error": None}
CODE = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$")
PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}$")


def thresholds(**overrides):
    """The defaults with some thresholds changed (the names of module_utils/thresholds.py)."""
    t = copy.deepcopy(DEFAULTS)
    t.update(overrides)
    return t


def check_shape(findings):
    """Every finding has the contract's keys and types, names the host and gives an action; returns findings."""
    assert isinstance(findings, list)
    for f in findings:
        assert set(f) == {"severity", "code", "gpu", "pci", "message", "action", "evidence"}, f
        assert f["severity"] in ("warn", "error", "fail"), f
        assert CODE.match(f["code"]), f
        assert f["gpu"] is None or isinstance(f["gpu"], int), f
        assert f["pci"] is None or PCI.match(f["pci"]), f
        assert isinstance(f["message"], str) and HOST in f["message"], f
        assert isinstance(f["action"], str) and f["action"], f
        assert isinstance(f["evidence"], list) and all(isinstance(e, str) for e in f["evidence"]), f
    return findings


def codes(findings):
    """[(code, gpu)] in the judge's order."""
    return [(f["code"], f["gpu"]) for f in check_shape(findings)]


def only(findings, code):
    """The one finding with this code."""
    found = [f for f in check_shape(findings) if f["code"] == code]
    assert len(found) == 1, codes(findings)
    return found[0]


def door(module, data, judge):
    """What the fleet report does with a result (rules/reading.py): a result its module's JSON Schema refuses is a
    RESULT_INVALID error and never reaches the judge (returns None); one the schema accepts is judged, and a judge
    that raises on it has a bug this test shows (the exception propagates). `judge` is a callable of the data; a
    result that is not a mapping at all goes to the judge's own door (one CHECK_ERROR)."""
    if isinstance(data, dict):
        candidate = dict(data)
        if module != "gpu_facts":
            for key, value in module_fields([], data.get("not_run")).items():
                candidate.setdefault(key, value)
        if schema_errors(module, candidate):
            return None
    return judge(data)


def assert_schema(module, observations, findings):
    """The observations a test builds are what the module returns: they match its schema once judged."""
    result = dict(observations)
    result.update(module_fields(findings, observations.get("not_run")))
    assert schema_errors(module, result) == []


def set_path(data, path, value):
    """A deep copy of data with data[path[0]][path[1]]... = value."""
    data = copy.deepcopy(data)
    cur = data
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    return data


# Inputs of the wrong shape: not a mapping, values of the wrong type where the judges look.
BAD_TOP = [None, [], "garbage", 42, 1.5, True, {}, {"tool": "x"}, {"tool": {"rc": "one", "argv": 5, "error": 3}}]
WORDS = ["tool", "rc", "argv", "rows", "gpus", "samples", "tests", "ranks", "variables", "sources", "path", "space",
         "job", "write_test", "devices", "health", "watchdog", "oom", "header", "failures", "index", "pci", "status",
         "name", "size_bytes", "t_s", "temperature_c", "step_time_s", "login_shell", "read", "exists", "is_dir",
         "keep", "checkpoint_size_gb", "free_gb", "frames", "init_failures", "errors", "xid", "time", "line",
         "processes", "gpufleet_gpus", "gpufleet_gpu_problems", "gpufleet_pci_gpus", "message", "kind", "warnings"]
SCALARS = st.none() | st.booleans() | st.integers(-2, 10**12) | st.floats(allow_nan=True) | st.text(max_size=6) \
    | st.sampled_from(["fail", "pass", "warn", "0000:3a:00", "cuda:0", "1"])
JSONISH = st.recursive(SCALARS, lambda children: st.lists(children, max_size=4) | st.dictionaries(
    st.sampled_from(WORDS), children, max_size=6), max_leaves=25)
GARBAGE = st.one_of(st.sampled_from(BAD_TOP), JSONISH, st.dictionaries(st.sampled_from(WORDS), JSONISH, max_size=8))


