"""kentino.gpufleet.training_env_facts: a REAL `bash -l` reads a profile in a temp HOME (through a one-line bash
wrapper that only points HOME there), stand-in su/systemctl replay what those tools print."""

import importlib

from ansible_collections.kentino.gpufleet.plugins.module_utils import env_files, judge_env
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULT_ENV_EXPECTED
from helpers.module_runner import run_module
from hypothesis import given, settings
from hypothesis import strategies as st

MOD = importlib.import_module("ansible_collections.kentino.gpufleet.plugins.modules.training_env_facts")
T = {"gpufleet_env_expected": dict(DEFAULT_ENV_EXPECTED)}


def setup_node(tmp_path, profile, systemd_env=None, etc_environment="", envd=None):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bash_profile").write_text(profile)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    bash = bindir / "bash"
    bash.write_text("#!/bin/sh\nHOME=%s exec /bin/bash \"$@\"\n" % home)
    bash.chmod(0o755)
    args = {"etc_environment": str(tmp_path / "environment"), "environment_d": str(tmp_path / "environment.d")}
    (tmp_path / "environment").write_text(etc_environment)
    (tmp_path / "environment.d").mkdir()
    for name, text in (envd or {}).items():
        (tmp_path / "environment.d" / name).write_text(text)
    if systemd_env is None:
        args["systemctl_executable"] = "/nonexistent/systemctl"
    else:
        ctl = bindir / "systemctl"
        (tmp_path / "show-environment").write_text(systemd_env)
        ctl.write_text("#!/bin/sh\n[ \"$1\" = show-environment ] || exit 1\ncat %s\n" % (tmp_path / "show-environment"))
        ctl.chmod(0o755)
        args["systemctl_executable"] = str(ctl)
    return args, [bindir]


GOOD = "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1\nexport TORCH_NCCL_TRACE_BUFFER_SIZE=20000\n"
SYSTEMD_GOOD = "LANG=C.UTF-8\nPATH=/usr/bin:/bin\nTORCH_NCCL_ASYNC_ERROR_HANDLING=1\nTORCH_NCCL_TRACE_BUFFER_SIZE=20000\n"


def by_name(r):
    return {v["name"]: v for v in r["variables"]}


def _codes(findings):
    return sorted(f["code"] for f in findings)


def test_login_shell_and_systemd_ok(tmp_path, contract):
    args, path = setup_node(tmp_path, 'echo "Welcome to gpu-node-07"\n' + GOOD +
                            "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n", SYSTEMD_GOOD)
    r = run_module("training_env_facts", args, path_prepend=path)
    assert r["verdict"] == "pass", r["reasons"]
    v = by_name(r)
    assert v["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["login_shell"] == "1"
    assert v["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["systemd"] == "1"
    assert v["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["status"] == "ok"
    assert v["PYTORCH_CUDA_ALLOC_CONF"]["status"] == "set"
    assert v["NCCL_ASYNC_ERROR_HANDLING"]["status"] == "unset"
    # The facts are observations (the statuses say how each variable compares); the verdict is the check's.
    facts = r["ansible_facts"]["gpufleet_training_env"]
    assert sorted(facts) == ["sources", "user", "variables"] and facts["variables"] == r["variables"]
    assert r["tool"]["argv"][1] == "-i" and r["tool"]["argv"][-2:] == ["-lc", MOD.SHELL_SCRIPT]
    assert contract("training_env_facts", r, judge_env.judge, T) == []


def test_missing_in_login_fails_even_if_module_env_has_it(tmp_path, contract):
    args, path = setup_node(tmp_path, "export TORCH_NCCL_TRACE_BUFFER_SIZE=20000\n")
    r = run_module("training_env_facts", args, path_prepend=path, env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"})
    assert r["verdict"] == "fail"
    assert by_name(r)["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["status"] == "missing"
    assert any("TORCH_NCCL_ASYNC_ERROR_HANDLING is not set in" in x for x in r["reasons"])
    assert r["sources"]["systemd"]["read"] is False
    findings = contract("training_env_facts", r, judge_env.judge, T)
    assert _codes(findings) == ["ENV_MISSING"] and "kentino.gpufleet.training_env" in findings[0]["action"]


def test_wrong_value_fails(tmp_path, contract):
    args, path = setup_node(tmp_path, "export TORCH_NCCL_ASYNC_ERROR_HANDLING=0\nexport TORCH_NCCL_TRACE_BUFFER_SIZE=0\n")
    r = run_module("training_env_facts", args, path_prepend=path)
    assert r["verdict"] == "fail"
    assert {v["status"] for v in r["variables"] if v["expected"]} == {"wrong"}
    assert any("TORCH_NCCL_ASYNC_ERROR_HANDLING=0 in" in x and "expected 1" in x for x in r["reasons"])
    assert _codes(contract("training_env_facts", r, judge_env.judge, T)) == ["ENV_MISSING", "ENV_MISSING"]
    # The report's expectations decide: a site that requires nothing gets no finding from the same observations.
    assert judge_env.judge(r, {"gpufleet_env_expected": {}}, "vm") == []


def test_alias_and_larger_buffer_pass(tmp_path):
    args, path = setup_node(tmp_path, "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1\nexport TORCH_FR_BUFFER_SIZE=50000\n")
    r = run_module("training_env_facts", args, path_prepend=path)
    assert r["verdict"] == "pass", r["reasons"]
    v = by_name(r)["TORCH_NCCL_TRACE_BUFFER_SIZE"]
    assert v["alias_used"] == "TORCH_FR_BUFFER_SIZE" and v["login_shell"] == "50000" and v["status"] == "ok"


def test_deprecated_and_systemd_missing_warn(tmp_path, contract):
    args, path = setup_node(tmp_path, GOOD, systemd_env="LANG=C.UTF-8\n",
                            etc_environment='NCCL_ASYNC_ERROR_HANDLING="1"\n')
    r = run_module("training_env_facts", args, path_prepend=path)
    assert r["verdict"] == "warn"
    v = by_name(r)
    assert v["NCCL_ASYNC_ERROR_HANDLING"]["status"] == "deprecated"
    assert v["NCCL_ASYNC_ERROR_HANDLING"]["etc_environment"] == "1"
    assert v["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["status"] == "systemd_missing"
    assert any("deprecated since torch 2.2" in x and "/etc/environment" in x for x in r["reasons"])
    assert any("systemd's manager environment" in x for x in r["reasons"])
    findings = contract("training_env_facts", r, judge_env.judge, T)
    assert _codes(findings) == ["ENV_DEPRECATED", "ENV_SYSTEMD_MISSING", "ENV_SYSTEMD_MISSING"]


def test_custom_expected_alloc_conf_subset_and_environment_d(tmp_path, contract):
    args, path = setup_node(tmp_path, GOOD + "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,"
                                             "expandable_segments:True\n",
                            envd={"50-torch.conf": "# comment\nTORCH_NCCL_DUMP_ON_TIMEOUT=1\n"})
    args["expected"] = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "NCCL_DEBUG": None}
    r = run_module("training_env_facts", args, path_prepend=path)
    v = by_name(r)
    assert v["PYTORCH_CUDA_ALLOC_CONF"]["status"] == "ok"
    assert v["TORCH_NCCL_DUMP_ON_TIMEOUT"]["status"] == "missing"  # environment.d is not the login shell
    assert v["TORCH_NCCL_DUMP_ON_TIMEOUT"]["environment_d"] == "1"
    assert v["TORCH_NCCL_TRACE_BUFFER_SIZE"]["status"] == "set"  # no longer required
    assert "NCCL_DEBUG" in v and r["verdict"] == "fail"
    t = {"gpufleet_env_expected": args["expected"]}
    assert _codes(contract("training_env_facts", r, judge_env.judge, t)) == ["ENV_MISSING"]


def test_other_user_through_su(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    su = bindir / "su"
    su.write_text("#!/bin/sh\nprintf '%%s\\n' \"$@\" > %s/su.argv\nprintf 'motd\\0__GPUFLEET_ENV__\\0HOME=/home/train\\0"
                  "TORCH_NCCL_ASYNC_ERROR_HANDLING=1\\0TORCH_NCCL_TRACE_BUFFER_SIZE=20000\\0MULTI=a\\nb\\0'\n" % tmp_path)
    su.chmod(0o755)
    r = run_module("training_env_facts", {"user": "train", "systemctl_executable": "/nonexistent/systemctl"},
                   path_prepend=[bindir])
    assert r["verdict"] == "pass", r["reasons"]
    assert (tmp_path / "su.argv").read_text().splitlines() == ["-", "train", "-c", MOD.SHELL_SCRIPT]
    assert r["user"] == "train"


def test_su_failure_is_error(tmp_path, contract):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    su = bindir / "su"
    su.write_text("#!/bin/sh\necho 'su: Authentication failure' >&2\nexit 1\n")
    su.chmod(0o755)
    r = run_module("training_env_facts", {"user": "train", "systemctl_executable": "/nonexistent/systemctl"},
                   path_prepend=[bindir])
    assert r["verdict"] == "error"
    assert "Authentication failure" in r["reasons"][0] and "become: true" in r["reasons"][0]
    assert {v["status"] for v in r["variables"] if v["expected"]} == {"unknown"}
    assert _codes(contract("training_env_facts", r, judge_env.judge, T)) == ["ENV_UNREADABLE"]


def test_home_option_points_the_login_shell_at_another_home(tmp_path, contract):
    # No bash wrapper: the module's own `env -i HOME=<home> ... bash -lc` reads <home>/.bash_profile.
    home = tmp_path / "alt-home"
    home.mkdir()
    (home / ".bash_profile").write_text(GOOD)
    r = run_module("training_env_facts", {"home": str(home), "systemctl_executable": "/nonexistent/systemctl"})
    assert r["verdict"] == "pass", r["reasons"]
    assert "HOME=%s" % home in r["tool"]["argv"]
    assert by_name(r)["TORCH_NCCL_TRACE_BUFFER_SIZE"]["login_shell"] == "20000"
    contract("training_env_facts", r, judge_env.judge, T)
    refused = run_module("training_env_facts", {"home": str(home), "user": "nobody"})
    assert refused.get("failed") and "home applies to the user running the module" in refused["msg"]


def test_invalid_user_fails_module():
    r = run_module("training_env_facts", {"user": "x; rm -rf /"})
    assert r.get("failed") is True


def test_parsers():
    assert env_files.parse_env0("banner\0__GPUFLEET_ENV__\0A=1\0B=x=y\0C=line1\nline2\0") == \
        {"A": "1", "B": "x=y", "C": "line1\nline2"}
    assert env_files.parse_assignments("# c\nexport A=1\nB = \"two words\"\nC='q'\nD=$'a\\tb'\nnot an assignment\n") == \
        {"A": "1", "B": "two words", "C": "q", "D": "a\tb"}
    assert judge_env.satisfies("TORCH_NCCL_TRACE_BUFFER_SIZE", "abc", "20000") is False
    assert judge_env.satisfies("TORCH_NCCL_TRACE_BUFFER_SIZE", " 30000 ", "20000") is True
    assert judge_env.satisfies("X", None, "1") is False


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_parsers(text):
    assert isinstance(env_files.parse_env0(text), dict)
    assert isinstance(env_files.parse_assignments(text), dict)
