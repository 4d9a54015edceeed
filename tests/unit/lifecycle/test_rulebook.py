"""The EDA rulebook (extensions/eda/rulebooks/gpufleet_quarantine.yml) against a recorded Alertmanager webhook POST
(Alertmanager's webhook_config JSON, version 4): its condition matches a firing GpuXidCritical and nothing else, and
its action runs the lifecycle playbook's quarantine for the alert's node with a finding code the repair ladder
knows, taken from the newest alert of the node's group. ansible-rulebook (Java, drools) is not run here: the condition is evaluated by a reader of the only form it
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
    # ansible-rulebook's builtin webhook source (>= 1.3): no collection to install beside it.
    assert list(ruleset["sources"][0]) == ["name", "eda.builtin.webhook"]
    (rule,) = ruleset["rules"]
    return rule


def _event(payload):
    # ansible.eda.webhook's event: the POST's JSON body under payload, the request under meta.
    return {"payload": payload, "meta": {"endpoint": "alerts", "headers": {"Content-Type": "application/json"}}}


def render(action, payload):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    return {k: env.from_string(v).render(event=_event(payload)) if isinstance(v, str) else v
            for k, v in action["extra_vars"].items()}


def test_a_firing_gpu_xid_critical_runs_the_quarantine_for_its_node():
    rule = _rule()
    assert matches(rule["condition"], _event(PAYLOAD))
    action = rule["action"]["run_playbook"]
    assert action["name"] == "kentino.gpufleet.lifecycle" and (REPO / "playbooks" / "lifecycle.yml").is_file()
    rendered = render(action, PAYLOAD)
    assert rendered["lifecycle_action"] == "quarantine" and rendered["lifecycle_actor"] == "alert"
    assert rendered["lifecycle_node"] == "gpu01"  # the instance without the exporter's port
    assert rendered["lifecycle_code"] == "XID_79" and repair_ladder.start(rendered["lifecycle_code"])[0] == \
        "bmc_power_cycle"
    assert rendered["lifecycle_gpu"] == "3" and "XID 79 on GPU 3" in rendered["lifecycle_reason"]


def test_the_finding_is_the_newest_alert_of_the_nodes_group():
    # A second GPU's XID while the first still fires: Alertmanager posts the group, both alerts, in its own order.
    payload = copy.deepcopy(PAYLOAD)
    newer = copy.deepcopy(payload["alerts"][0])
    newer["labels"].update(gpu="5", xid="48", pci="0000:c5:00")
    newer["annotations"]["summary"] = "gpu01:9100: XID 48 on GPU 5 (0000:c5:00) 2s ago"
    newer["startsAt"] = "2026-11-30T02:20:00.000Z"
    payload["alerts"].insert(0, newer)
    payload["alerts"][1]["startsAt"] = "2026-11-30T02:14:05.412Z"
    payload["alerts"].reverse()
    rendered = render(_rule()["action"]["run_playbook"], payload)
    assert (rendered["lifecycle_code"], rendered["lifecycle_gpu"]) == ("XID_48", "5")
    assert "XID 48 on GPU 5" in rendered["lifecycle_reason"]


@pytest.mark.parametrize("change", [
    {"status": "resolved"},
    {"commonLabels": dict(PAYLOAD["commonLabels"], alertname="GpuXidWarning")},
    {"commonLabels": {"instance": "gpu01:9100"}},
])
def test_a_resolved_alert_or_another_alert_runs_nothing(change):
    payload = copy.deepcopy(PAYLOAD)
    payload.update(change)
    assert not matches(_rule()["condition"], _event(payload))
