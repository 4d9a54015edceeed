"""findings and judge_common: the finding shape, verdicts from findings, a tool that could not run, the judges' door."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import findings as F
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_common
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULTS
from judgelib import HOST, TOOL_OK, check_shape


def test_worst_orders_verdicts_and_unknown_strings_are_errors():
    assert F.worst([]) == "pass" and F.worst(["pass", "skipped"]) == "skipped"
    assert F.worst(["warn", "error"]) == "error" and F.worst(["error", "fail", "warn"]) == "fail"
    assert F.worst(["pass", "maybe"]) == "error", "an unknown verdict never passes"


def test_module_fields_from_findings():
    fs = [F.finding("warn", "A_B", "node01: a", "do a", ["line 1", "line 2"]),
          F.finding("fail", "C", "node01: c", "do c", "line 2")]
    assert F.module_fields(fs) == {"verdict": "fail", "reasons": ["node01: a", "node01: c"],
                                   "evidence": ["line 1", "line 2"]}
    assert F.module_fields([]) == {"verdict": "pass", "reasons": [], "evidence": []}
    assert F.module_fields([], not_run="check mode") == {"verdict": "skipped", "reasons": ["check mode"],
                                                         "evidence": []}


def test_evidence_lines_are_bounded_stripped_and_unique():
    assert F.lines(None) == [] and F.lines("one\n") == ["one"]
    assert F.lines(["a", None, "a", "", "b\r\n"]) == ["a", "b"]
    many = F.lines(["line %d" % i for i in range(100)])
    assert len(many) == F.MAX_EVIDENCE_LINES
    assert len(F.lines(["x" * 10000])[0]) == F.MAX_LINE_CHARS


@pytest.mark.parametrize("gpu, pci, want", [
    (3, "00000000:C1:00.0", (3, "0000:c1:00")), (0, "0000:3a:00", (0, "0000:3a:00")), ("3", "garbage", (None, None)),
    (True, None, (None, None)), (None, 5, (None, None))])
def test_a_finding_names_a_gpu_only_by_an_int_index_and_a_normalised_pci_address(gpu, pci, want):
    f = F.finding("fail", "X", "node01: x", "do x", gpu=gpu, pci=pci)
    assert (f["gpu"], f["pci"]) == want


def test_gpu_label_names_host_index_and_pci():
    assert F.gpu_label("node03", 3, "0000:c1:00") == "node03 GPU 3 (0000:c1:00)"
    assert F.gpu_label("node03", 3) == "node03 GPU 3"
    assert F.gpu_label("node03", None, "0000:c1:00") == "node03 GPU at PCI 0000:c1:00"


def test_could_not_run():
    assert judge_common.could_not_run({"tool": dict(TOOL_OK)}, "gpu_burn", HOST) == []
    (f,) = check_shape(judge_common.could_not_run({"tool": dict(TOOL_OK, rc=None, error="gpu_burn not found")},
                                                  "gpu_burn", HOST))
    assert f["code"] == "CHECK_ERROR" and f["message"] == "node01: gpu_burn could not run: gpu_burn not found"
    assert f["evidence"] == ["argv: tool rc=None timed_out=False"]
    hung = {"tool": dict(TOOL_OK, rc=-9, timed_out=True, duration_s=725.3), "output_tail": ["50.0%  proc'd: 3"]}
    (f,) = check_shape(judge_common.could_not_run(hung, "gpu_burn", HOST))
    assert "timed out: killed with its process group after running 725.3 s" in f["message"]
    assert f["evidence"][0] == "50.0%  proc'd: 3", "the last output shows where it hung"


def test_complete_fills_missing_thresholds_and_treats_none_as_unset():
    t = judge_common.complete({"gpufleet_temp_max_c": 80.0, "gpufleet_temp_sustained_s": None, "extra": 1})
    assert t["gpufleet_temp_max_c"] == 80.0 and t["gpufleet_temp_sustained_s"] == DEFAULTS["gpufleet_temp_sustained_s"]
    assert t["extra"] == 1 and judge_common.complete(None) == DEFAULTS


def test_the_door_refuses_what_is_not_a_mapping_and_never_disguises_a_judge_s_bug():
    """The shape is the schema's to check (rules/reading.py, before the judge); the door only refuses a result that is
    not a mapping at all. A TypeError inside a judge is a bug in the judge: it is raised, not reported as
    unreadable input (on main it came back as CHECK_ERROR "could not be judged: TypeError")."""
    @judge_common.judge_door("demo")
    def judge(result, t, host):
        return [F.finding("warn", "DEMO", "%s: %s" % (host, result["x"] + t["gpufleet_temp_max_c"]), "act")]

    assert judge({"x": 1.0}, {}, HOST)[0]["message"] == "node01: 86.0", "thresholds completed from the defaults"
    with pytest.raises(TypeError):
        judge({"x": "one"}, {}, HOST)
    (f,) = check_shape(judge(["x"], {}, HOST))
    assert "it is list, not a mapping" in f["message"]

    @judge_common.judge_door("demo")
    def broken(result, t, host):
        raise RuntimeError("a bug, not a bad shape")

    with pytest.raises(RuntimeError):
        broken({}, {}, HOST)


def test_fmt_size():
    assert [judge_common.fmt_size(s) for s in (8, 1 << 20, 1 << 30, 3 << 29, None)] == [
        "8 B", "1 MiB", "1 GiB", "1536 MiB", "? B"]
