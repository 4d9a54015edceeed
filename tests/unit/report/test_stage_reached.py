"""The stage a node reached, as the report names it (plugins/plugin_utils/rules/reach.py): each stage's first task
records it for all the nodes of the play at once (gpufleet_stages); a node that finished has its own `done`."""

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules.reach import stage_reached

# The fact as every host of the play holds it after the burn stage was entered: node02 stopped at identity.
STAGES = {"node01": "burn", "node02": "identity", "node03": "burn"}


def test_each_node_reads_its_own_entry_of_the_shared_fact():
    assert stage_reached("node01", {"gpufleet_stages": STAGES}) == "burn"
    assert stage_reached("node02", {"gpufleet_stages": STAGES}) == "identity"


def test_a_finished_node_is_done_whatever_stage_it_entered_last():
    assert stage_reached("node03", {"gpufleet_stages": STAGES, "gpufleet_stage": "done"}) == "done"


def test_no_stage_before_the_first_and_for_a_node_the_fact_does_not_name():
    assert stage_reached("node01", {}) is None
    assert stage_reached("node09", {"gpufleet_stages": STAGES}) is None
    assert stage_reached("node01", {"gpufleet_stages": "garbage"}) is None
