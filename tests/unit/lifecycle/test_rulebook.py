"""The EDA rulebook (extensions/eda/rulebooks/gpufleet_quarantine.yml) against a recorded Alertmanager webhook POST
(Alertmanager's webhook_config JSON, version 4): its condition matches a firing GpuXidCritical and nothing else, and
its action runs the lifecycle playbook's quarantine for the alert's node with a finding code the repair ladder
knows. ansible-rulebook (Java, drools) is not run here: the condition is evaluated by a reader of the only form it
may take (`event.<path> == "<value>"` joined by `and`), which fails on anything else."""

import copy
import json
import re
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import repair_ladder

REPO = Path(__file__).resolve().parents[3]
RULEBOOK = REPO / "extensions" / "eda" / "rulebooks" / "gpufleet_quarantine.yml"
PAYLOAD = json.loads((REPO / "tests" / "fixtures" / "alertmanager" / "gpu_xid_critical_firing.json").read_text())
TERM = re.compile(r'\Aevent\.([A-Za-z_][A-Za-z0-9_.]*) == "([^"]*)"\Z')


def matches(condition, event):
    """ansible-rulebook's `==` on dotted paths, `and` only; a missing path is false (as a rulebook's condition)."""
    result = True
    for term in condition.split(" and "):
        found = TERM.match(term.strip())
        assert found, "the rulebook's condition uses a form this test cannot evaluate: %r" % term
        value = event
        for key in found.group(1).split("."):
            value = value.get(key) if isinstance(value, dict) else None
        result = result and value == found.group(2)
    return result


def _rule():
    (ruleset,) = yaml.safe_load(RULEBOOK.read_text())
    assert list(ruleset["sources"][0]) == ["name", "ansible.eda.webhook"]
    (rule,) = ruleset["rules"]
    return rule


def _event(payload):
    # ansible.eda.webhook's event: the POST's JSON body under payload, the request under meta.
    return {"payload": payload, "meta": {"endpoint": "alerts", "headers": {"Content-Type": "application/json"}}}


def test_a_firing_gpu_xid_critical_runs_the_quarantine_for_its_node():
    rule = _rule()
    assert matches(rule["condition"], _event(PAYLOAD))
    action = rule["action"]["run_playbook"]
    assert action["name"] == "kentino.gpufleet.lifecycle" and (REPO / "playbooks" / "lifecycle.yml").is_file()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    rendered = {k: env.from_string(v).render(event=_event(PAYLOAD)) if isinstance(v, str) else v
                for k, v in action["extra_vars"].items()}
    assert rendered["lifecycle_action"] == "quarantine" and rendered["lifecycle_actor"] == "alert"
    assert rendered["lifecycle_node"] == "gpu01"  # the instance without the exporter's port
    assert rendered["lifecycle_code"] == "XID_79" and repair_ladder.start(rendered["lifecycle_code"])[0] == \
        "bmc_power_cycle"
    assert "XID 79 on GPU 3" in rendered["lifecycle_reason"]


@pytest.mark.parametrize("change", [
    {"status": "resolved"},
    {"commonLabels": dict(PAYLOAD["commonLabels"], alertname="GpuXidWarning")},
    {"commonLabels": {"instance": "gpu01:9100"}},
])
def test_a_resolved_alert_or_another_alert_runs_nothing(change):
    payload = copy.deepcopy(PAYLOAD)
    payload.update(change)
    assert not matches(_rule()["condition"], _event(payload))
