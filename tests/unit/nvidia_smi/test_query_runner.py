"""QueryGpu's field negotiation with a fake runner: converges without --help-query-gpu, never loops forever."""

from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import FACTS_SPEC, SAMPLE_SPEC, QueryGpu
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import ToolResult


class FakeSmi:
    """Accepts `valid` fields, one GPU row of '1' values (index 0, a bus id); help prints `help_text`."""

    def __init__(self, valid, help_text="", always_reject=None):
        self.valid = set(valid)
        self.help_text = help_text
        self.always_reject = always_reject
        self.argvs = []

    def __call__(self, argv, timeout_s):
        self.argvs.append(list(argv))
        if "--help-query-gpu" in argv:
            return ToolResult(argv, 0, self.help_text, "", False, 0.01)
        fields = argv[1].split("=", 1)[1].split(",")
        bad = self.always_reject or next((f for f in fields if f not in self.valid), None)
        if bad:
            return ToolResult(argv, 2, 'Field "%s" is not a valid field to query.\n\n' % bad, "", False, 0.01)
        cells = ["00000000:18:00.0" if f == "pci.bus_id" else "0" if f == "index" else "1" for f in fields]
        return ToolResult(argv, 0, ", ".join(cells) + "\n", "", False, 0.01)


ALL_NEWEST = [c[0] for _k, c in FACTS_SPEC]


def test_newest_driver_is_one_call():
    fake = FakeSmi(ALL_NEWEST)
    query = QueryGpu("nvidia-smi", FACTS_SPEC, 5, runner=fake)
    answer = query.run()
    assert len(fake.argvs) == 1 and answer["problems"] == [] and len(answer["gpus"]) == 1
    assert answer["gpus"][0]["pci"] == "0000:18:00"


def test_without_help_output_it_retries_field_by_field_and_remembers():
    old = [f for f in ALL_NEWEST if f not in ("pcie.link.gen.gpucurrent", "clocks_event_reasons.active",
                                              "gpu_recovery_action")] + ["pcie.link.gen.current"]
    fake = FakeSmi(old, help_text="")  # help prints nothing useful
    query = QueryGpu("nvidia-smi", FACTS_SPEC, 5, runner=fake)
    answer = query.run()
    assert answer["problems"] == [] and len(answer["gpus"]) == 1
    assert sorted(query.rejected) == ["clocks_event_reasons.active", "clocks_throttle_reasons.active",
                                      "gpu_recovery_action", "pcie.link.gen.gpucurrent"]
    assert answer["gpus"][0]["pcie_gen_current"] == 1
    assert "throttle_reasons" not in answer["gpus"][0] and "recovery_action" not in answer["gpus"][0]
    calls_before = len(fake.argvs)
    query.run()  # the next run asks the right set at once
    assert len(fake.argvs) == calls_before + 1


def test_a_field_rejected_again_gives_up_with_a_tool_error():
    fake = FakeSmi(ALL_NEWEST, always_reject="bogus.field")
    answer = QueryGpu("nvidia-smi", SAMPLE_SPEC, 5, runner=fake).run()
    assert answer["gpus"] == []
    assert [p["kind"] for p in answer["problems"]] == ["tool_error"]
    assert "bogus.field" in answer["problems"][0]["message"]
    assert len(fake.argvs) <= 3


def test_tool_that_cannot_start():
    def broken(argv, timeout_s):
        return ToolResult(argv, None, "", "", False, 0.0, error="cannot execute nvidia-smi: Permission denied")

    answer = QueryGpu("/usr/bin/nvidia-smi", SAMPLE_SPEC, 5, runner=broken).run()
    assert answer["problems"][0]["kind"] == "tool_error" and "Permission denied" in answer["problems"][0]["message"]
