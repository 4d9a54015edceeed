"""Reading a host's variables for the report: results and facts are data, read as they are (the templar's walk through
a 32-node fleet's results was most of the report's time); what only the templar can read still goes through it."""

from ansible.template import trust_as_template
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.hostvars import host_value, read_host


def render(value):
    if isinstance(value, list):
        return [render(v) for v in value]
    return "rendered" if isinstance(value, str) and "{{" in value else value


class HostVars(dict):
    """Ansible's HostVars in miniature: raw_get gives the untemplated variables; hostvars[host][key] templates and
    notes which keys it had to template."""

    def __init__(self, raw):
        super().__init__()
        self.raw = raw
        self.templated = []
        self.lookups = []
        outer = self

        class Vars(dict):
            def __getitem__(self, key):
                outer.templated.append(key)
                return render(outer.raw[key])

        self["n1"] = Vars(raw)

    def raw_get(self, host):
        self.lookups.append("raw_get")
        return self.raw if host == "n1" else None

    def __getitem__(self, host):
        self.lookups.append("hostvars[%s]" % host)  # each one is a variable lookup for the host
        return dict.__getitem__(self, host)


def test_results_are_read_raw_and_templates_through_the_templar():
    raw = {
        "gpufleet_result_gpu_burn": {"verdict": "pass", "gpus": [{"gflops_series": [[0.2, 51046.0]], "final": "OK"}]},
        "gpufleet_stage": "done",
        "gpufleet_checkpoint_path": trust_as_template("{{ gpufleet_sim_state_dir }}/checkpoint"),
        "gpufleet_listed": [1, trust_as_template("{{ x }}")],
        "gpufleet_text": "{{ a module's output that looks like a template }}",  # not trusted: never templated
        "ansible_facts": {"gpufleet_gpus": [{"index": 0}], "other": 1},
        "unrelated": trust_as_template("{{ undefined_thing }}"),
    }
    hv = HostVars(raw)
    out = read_host(hv, "n1")
    assert sorted(hv.templated) == ["gpufleet_checkpoint_path", "gpufleet_listed"]
    assert out["gpufleet_result_gpu_burn"] == raw["gpufleet_result_gpu_burn"]
    assert type(out["gpufleet_result_gpu_burn"]["gpus"][0]["gflops_series"][0][1]) is float
    assert out["gpufleet_checkpoint_path"] == "rendered" and out["gpufleet_listed"] == [1, "rendered"]
    assert out["gpufleet_text"] == raw["gpufleet_text"] and out["gpufleet_stage"] == "done"
    assert out["ansible_facts"] == {"gpufleet_gpus": [{"index": 0}]} and "unrelated" not in out
    assert hv.lookups == ["raw_get", "hostvars[n1]"]  # the templated view once, for both templates
    assert host_value(hv, "n1", "gpufleet_stage") == "done" and host_value(hv, "n1", "nope") is None
    assert hv.lookups[2:] == ["raw_get", "raw_get"]  # data only: no templated view made
    assert read_host(hv, "n9") == {}  # not in the inventory


def test_a_value_the_templar_cannot_read_is_still_an_error_naming_it():
    class Failing(HostVars):
        def __init__(self, raw):
            super().__init__(raw)

            class Vars(dict):
                def __getitem__(self, key):
                    raise ValueError("'gpufleet_sim_state_dir' is undefined")

            self["n1"] = Vars(raw)

    raw = {"gpufleet_checkpoint_path": trust_as_template("{{ gpufleet_sim_state_dir }}/x"),
           "gpufleet_result_xid_facts": {"verdict": "pass"}}
    out = read_host(Failing(raw), "n1")
    assert out["gpufleet_result_xid_facts"] == {"verdict": "pass"}
    assert "gpufleet_checkpoint_path of n1" in out["gpufleet_result_report_input"]["reasons"][0]
