"""A host variable that does not template (a copied sim inventory's gpufleet_sim_root, a typo in a Jinja expression)
is a finding that says which variable and why, with the fix; not a RESULT_INVALID that asks for a bug report."""

from ansible_collections.kentino.gpufleet.plugins.plugin_utils.hostvars import read_host
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import evaluate_node


class Unreadable(dict):
    """hostvars of one host whose gpufleet_sim_root raises when read, as Ansible's lazy templating does."""

    def __getitem__(self, key):
        if key == "gpufleet_sim_root":
            raise ValueError("the simulated fleet's stand-in tools are not in /tmp/sim/bin: this inventory is a copy")
        return dict.__getitem__(self, key)


def test_an_unreadable_variable_is_named_with_its_message():
    hv = read_host({"n1": Unreadable(gpufleet_sim_root=None, gpufleet_stage="start")}, "n1")
    node = evaluate_node("n1", hv, in_play_hosts=True)  # it took part in the play, and failed its first task
    codes = [f["code"] for f in node["findings"]]
    assert "RESULT_INVALID" not in codes, node["findings"]
    finding = next(f for f in node["findings"] if f["code"] == "VARIABLE_UNREADABLE")
    assert "gpufleet_sim_root" in finding["message"] and "stand-in tools are not in /tmp/sim/bin" in finding["message"]
    assert "bug" not in finding["action"] and "n1" in finding["message"]
    assert node["verdict"] == "error"
