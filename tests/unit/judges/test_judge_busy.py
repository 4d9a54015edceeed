"""judge_busy: a GPU running someone else's process (GPU_BUSY), the ignore list and the severity; bad input."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_busy
from hypothesis import given, settings
from judgelib import GARBAGE, HOST, check_shape, codes, door, only, set_path, thresholds


def gpus(*processes):
    """GPU i runs processes[i] (a list of (pid, name, MiB))."""
    return [{"index": i, "pci": "0000:%02x:00" % (0x18 + i), "processes": [
        {"pid": pid, "name": name, "used_memory_mib": mib} for pid, name, mib in procs]}
        for i, procs in enumerate(processes)]


def judge(data, **t):
    return judge_busy.judge(data, thresholds(**t), HOST)


def test_idle_gpus_have_no_finding():
    assert judge(gpus([], [])) == []


def test_a_process_makes_the_gpu_busy_with_pid_name_and_memory():
    f = only(judge(gpus([], [(4821, "/usr/bin/python3", 70001)])), "GPU_BUSY")
    assert (f["severity"], f["gpu"], f["pci"]) == ("warn", 1, "0000:19:00")
    assert "PID 4821 (/usr/bin/python3, 70001 MiB)" in f["message"] and "CUDA OOM" in f["action"]
    assert f["evidence"] == ["pid=4821 name=/usr/bin/python3 used_memory_mib=70001"]


def test_ignore_list_by_name_or_basename_and_severity_are_thresholds():
    data = gpus([(1, "/usr/lib/xorg/Xorg", 20)], [(2, "python", 900)])
    assert codes(judge(data)) == [("GPU_BUSY", 0), ("GPU_BUSY", 1)]
    assert codes(judge(data, gpufleet_busy_ignore_processes=["Xorg"])) == [("GPU_BUSY", 1)]
    assert judge(data, gpufleet_busy_ignore_processes=["/usr/lib/xorg/Xorg", "python"]) == []
    assert {f["severity"] for f in judge(data, gpufleet_busy_gpu_severity="fail")} == {"fail"}


def test_the_node_refusal_uses_the_same_predicate():
    data = gpus([(1, "Xorg", 20)], [(2, "python", 900)], [])
    busy = judge_busy.busy_gpus(data, ["Xorg"])
    assert [b["index"] for b in busy] == [1]
    assert judge_busy.refusal_reason(busy).startswith("GPU 1 busy: invasive checks not run")
    assert judge_busy.refusal_reason([]) == ""


@pytest.mark.parametrize("bad", [None, {}, "x", 5, [None], ["x"], [{"processes": "x"}], [{"processes": [None]}],
                                 [{"index": "0", "pci": 5, "processes": [{"pid": None, "name": None}]}]])
def test_bad_input_is_refused_at_the_door(bad):
    """The busy judge reads gpu_facts' gpufleet_gpus: its schema is the door."""
    if isinstance(bad, list):
        door("gpu_facts", {"gpufleet_gpus": bad}, lambda data: check_shape(judge_busy.judge(bad, {}, HOST)))
    else:
        check_shape(judge_busy.judge(bad, {}, HOST))


def test_a_process_without_a_name_still_makes_the_gpu_busy():
    f = only(judge(set_path(gpus([(7, "x", 1)]), (0, "processes", 0, "name"), None)), "GPU_BUSY")
    assert "PID 7" in f["message"]


@settings(max_examples=200, deadline=None)
@given(GARBAGE)
def test_fuzz_is_refused_or_judged(data):
    if isinstance(data, list):
        door("gpu_facts", {"gpufleet_gpus": data}, lambda d: check_shape(judge_busy.judge(data, thresholds(), HOST)))
    else:
        check_shape(judge_busy.judge(data, thresholds(), HOST))
