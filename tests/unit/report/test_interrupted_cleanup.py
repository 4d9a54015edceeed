"""An interrupted node's finding says what the run_record callback's stop did on it, never that its work stopped
"by itself" without knowing (plugins/plugin_utils/rules/reach.py)."""

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reach import interrupted_cleanup


def test_what_was_stopped_is_the_evidence():
    evidence, action = interrupted_cleanup({"stopped": [{"kind": "tool", "killed": True}],
                                            "msg": "1 process group(s) stopped: tool gpu_burn [4242]"})
    assert evidence == "stopped on the node before this report: 1 process group(s) stopped: tool gpu_burn [4242]"
    assert action == "rerun"


def test_a_stop_that_failed_or_never_ran_says_so_and_what_to_do():
    for cleanup, why in (({"error": "the node did not answer"}, "the node did not answer"),
                         (None, "did not run the stop")):
        evidence, action = interrupted_cleanup(cleanup)
        assert evidence.startswith("the run's work on the node was not stopped") and why in evidence
        assert "gpufleet abort" in action and "lease" in action
