"""judge_env: the PyTorch/NCCL variables a job really sees against gpufleet_env_expected; bad input."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_env
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import resolve
from hypothesis import given, settings
from judgelib import BAD_TOP, GARBAGE, HOST, assert_schema, check_shape, codes, door, only, set_path, thresholds

GOOD = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000"}


def _var(name, login=None, systemd=None, etc=None, envd=None, alias=None):
    return {"name": name, "expected": None, "login_shell": login, "systemd": systemd, "etc_environment": etc,
            "environment_d": envd, "alias_used": alias, "status": None}


def healthy(systemd_read=True):
    return {"tool": {"argv": ["env", "-i"], "rc": 0, "timed_out": False, "duration_s": 0.1, "error": None},
            "user": "train",
            "sources": {"login_shell": {"read": True, "error": None},
                        "systemd": {"read": systemd_read, "error": None if systemd_read else "not booted"},
                        "etc_environment": {"read": True, "error": None},
                        "environment_d": {"read": True, "error": None}},
            "variables": [_var(n, v, v if systemd_read else None) for n, v in GOOD.items()]
            + [_var("NCCL_ASYNC_ERROR_HANDLING"), _var("PYTORCH_CUDA_ALLOC_CONF")]}


def judge(result, **t):
    return judge_env.judge(result, thresholds(**t), HOST)


def _with(result, name, **change):
    for var in result["variables"]:
        if var["name"] == name:
            var.update(change)
    return result


def test_recommended_environment_has_no_finding_and_matches_the_schema():
    result = healthy()
    assert judge(result) == []
    assert_schema("training_env_facts", result, [])


@pytest.mark.parametrize("value, expected", [("1", []), ("0", [("ENV_MISSING", None)]), (None, [("ENV_MISSING", None)])])
def test_required_value_in_the_login_shell(value, expected):
    result = _with(healthy(systemd_read=False), "TORCH_NCCL_ASYNC_ERROR_HANDLING", login_shell=value)
    findings = judge(result)
    assert codes(findings) == expected
    if findings:
        f = findings[0]
        assert f["severity"] == "fail" and "kentino.gpufleet.training_env" in f["action"]
        assert ("is not set in train's login shell" if value is None else "TORCH_NCCL_ASYNC_ERROR_HANDLING=0 in") \
            in f["message"]


@pytest.mark.parametrize("size, expected", [("20000", []), ("50000", []), ("19999", [("ENV_MISSING", None)]),
                                            ("lots", [("ENV_MISSING", None)])])
def test_buffer_sizes_pass_at_or_above_the_expected_one(size, expected):
    result = _with(healthy(systemd_read=False), "TORCH_NCCL_TRACE_BUFFER_SIZE", login_shell=size)
    assert codes(judge(result)) == expected


def test_the_alias_is_judged_and_shown_by_its_own_name():
    result = _with(healthy(systemd_read=False), "TORCH_NCCL_TRACE_BUFFER_SIZE", login_shell="100",
                   alias_used="TORCH_FR_BUFFER_SIZE")
    f = only(judge(result), "ENV_MISSING")
    assert "TORCH_FR_BUFFER_SIZE=100" in f["message"]
    assert judge(_with(result, "TORCH_NCCL_TRACE_BUFFER_SIZE", login_shell="20000")) == []


def test_expected_is_the_threshold():
    result = _with(healthy(systemd_read=False), "TORCH_NCCL_ASYNC_ERROR_HANDLING", login_shell="0")
    assert judge(result, gpufleet_env_expected={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}) == []
    # a value required by the site that the node did not read is said, not passed
    f = only(judge(healthy(), gpufleet_env_expected=dict(GOOD, NCCL_DEBUG="WARN")), "ENV_UNREADABLE")
    assert "NCCL_DEBUG was not read" in f["message"]
    # the allocator setting: every expected key:value must be present among the configured ones
    conf = _with(healthy(systemd_read=False), "PYTORCH_CUDA_ALLOC_CONF",
                 login_shell="max_split_size_mb:128,expandable_segments:True")
    assert judge(conf, gpufleet_env_expected={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) == []
    assert codes(judge(conf, gpufleet_env_expected={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})) == [
        ("ENV_MISSING", None)]


def test_systemd_manager_environment_warns_only_when_read():
    result = _with(healthy(), "TORCH_NCCL_ASYNC_ERROR_HANDLING", systemd=None)
    f = only(judge(result), "ENV_SYSTEMD_MISSING")
    assert f["severity"] == "warn" and "systemd's manager environment" in f["message"]
    result["sources"]["systemd"]["read"] = False
    assert judge(result) == []


def test_deprecated_variable_anywhere_warns():
    for where in ("login_shell", "systemd", "etc_environment", "environment_d"):
        result = _with(healthy(), "NCCL_ASYNC_ERROR_HANDLING", **{where: "1"})
        f = only(judge(result), "ENV_DEPRECATED")
        assert "deprecated since torch 2.2" in f["message"] and "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in f["action"]
    assert judge(_with(healthy(), "NCCL_ASYNC_ERROR_HANDLING")) == []


def test_unreadable_login_shell_is_an_error_not_a_pass():
    result = healthy()
    result["sources"]["login_shell"] = {"read": False, "error": "su: Authentication failure"}
    findings = judge(result)
    f = only(findings, "ENV_UNREADABLE")
    assert f["severity"] == "error" and "su: Authentication failure" in f["message"]
    assert "ENV_MISSING" not in [c for c, _ in codes(findings)], "unknown is not missing"


@pytest.mark.parametrize("bad", BAD_TOP)
def test_bad_input_is_refused_at_the_door(bad):
    findings = door("training_env_facts", bad, lambda data: check_shape(judge_env.judge(data, {}, HOST)))
    assert findings is None or (findings and all(f["severity"] == "error" for f in findings)), "no data is no claim"


@pytest.mark.parametrize("path, value", [
    (("variables", 0), None), (("variables", 0, "name"), None), (("variables", 0, "login_shell"), 1),
    (("variables",), "x"), (("sources",), None), (("sources", "login_shell"), "yes"), (("user",), None),
])
def test_values_of_the_wrong_type_are_refused_or_judged(path, value):
    door("training_env_facts", set_path(healthy(), path, value), lambda data: check_shape(judge(data)))


def test_expected_of_the_wrong_type_is_read_by_the_thresholds_door():
    """Inventory values reach the judge through thresholds.resolve: a number becomes its text, a string where a
    mapping belongs is refused (the default is used, the report says CONFIG_INVALID)."""
    t, _sources, errors = resolve({"gpufleet_env_expected": {"TORCH_NCCL_TRACE_BUFFER_SIZE": 20000}}, HOST)
    assert not errors and t["gpufleet_env_expected"] == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "20000"}
    check_shape(judge(healthy(), **t))
    t, _sources, errors = resolve({"gpufleet_env_expected": "TORCH_NCCL_ASYNC_ERROR_HANDLING=1"}, HOST)
    assert errors
    check_shape(judge(healthy(), **t))


@settings(max_examples=200, deadline=None)
@given(GARBAGE)
def test_fuzz_is_refused_or_judged(data):
    door("training_env_facts", data, lambda d: check_shape(judge_env.judge(d, thresholds(), HOST)))
