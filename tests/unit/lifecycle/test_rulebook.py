"""The EDA rulebook (extensions/eda/rulebooks/gpufleet_quarantine.yml) against a recorded Alertmanager webhook POST
(Alertmanager's webhook_config JSON, version 4): its condition matches a firing GpuXidCritical and nothing else, and
its action runs the lifecycle playbook's quarantine for the alert's node with a finding code the repair ladder
knows, taken from the newest alert of the node's group by its parsed startsAt. ansible-rulebook (Java, drools) is not
run here: the condition is evaluated by a reader of the only form it may take (`event.<path> == "<value>"` joined by
`and`), which fails on anything else."""

import copy
import json
import re
from pathlib import Path

import jinja2
import jinja2.nativetypes
import pytest
import yaml
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import alerts, repair_ladder

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
    # ansible-rulebook renders an action's strings with Jinja2's NativeEnvironment (a list stays a list).
    env = jinja2.nativetypes.NativeEnvironment(undefined=jinja2.StrictUndefined)
    return {k: env.from_string(v).render(event=_event(payload)) if isinstance(v, str) else v
            for k, v in action["extra_vars"].items()}


def finding(rendered):
    """The finding the lifecycle playbook quarantines for: the alert_finding filter's of the rule's lifecycle_alerts
    (playbooks/lifecycle.yml), which the rule passes whole (a list, not its text)."""
    assert isinstance(rendered["lifecycle_alerts"], list) and not {"lifecycle_code", "lifecycle_gpu"} & set(rendered)
    return alerts.finding(rendered["lifecycle_alerts"])


def test_a_firing_gpu_xid_critical_runs_the_quarantine_for_its_node():
    rule = _rule()
    assert matches(rule["condition"], _event(PAYLOAD))
    action = rule["action"]["run_playbook"]
    assert action["name"] == "kentino.gpufleet.lifecycle" and (REPO / "playbooks" / "lifecycle.yml").is_file()
    rendered = render(action, PAYLOAD)
    assert rendered["lifecycle_action"] == "quarantine" and rendered["lifecycle_actor"] == "alert"
    assert rendered["lifecycle_node"] == "gpu01"  # the instance without the exporter's port
    found = finding(rendered)
    assert found["code"] == "XID_79" and repair_ladder.start(found["code"])[0] == "bmc_power_cycle"
    assert found["gpu"] == "3" and "XID 79 on GPU 3" in found["reason"]


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
    found = finding(render(_rule()["action"]["run_playbook"], payload))
    assert (found["code"], found["gpu"]) == ("XID_48", "5") and "XID 48 on GPU 5" in found["reason"]


def _two_gpus(older, newer):
    payload = copy.deepcopy(PAYLOAD)
    second = copy.deepcopy(payload["alerts"][0])
    second["labels"].update(gpu="5", xid="48", pci="0000:c5:00")
    second["annotations"]["summary"] = "gpu01:9100: XID 48 on GPU 5 (0000:c5:00) 2s ago"
    payload["alerts"][0]["startsAt"], second["startsAt"] = older, newer
    payload["alerts"] = [second, payload["alerts"][0]]  # the newer first: its text sorts before the older's
    return payload


# Alertmanager writes startsAt as Go's RFC 3339 with nanoseconds and the trailing zeros dropped, so one alert's
# fraction is longer than the other's or missing; another sender may give an offset. The newer is GPU 5's.
@pytest.mark.parametrize("older, newer", [
    ("2026-12-01T10:00:00Z", "2026-12-01T10:00:00.5Z"),
    ("2026-12-01T10:00:00.5Z", "2026-12-01T10:00:01Z"),
    ("2026-12-01T10:00:00.123456789Z", "2026-12-01T10:00:00.5Z"),
    ("2026-12-01T11:00:30+01:00", "2026-12-01T10:00:40Z"),
    ("2026-12-01T10:00:00.999999999Z", "2026-12-01T09:01:01-00:59"),
])
def test_the_newest_alert_is_chosen_by_its_time_not_by_its_text(older, newer):
    found = finding(render(_rule()["action"]["run_playbook"], _two_gpus(older, newer)))
    assert (found["code"], found["gpu"]) == ("XID_48", "5")


def test_the_alert_time_is_parsed_to_the_nanosecond_and_garbage_is_named():
    assert alerts.rfc3339_ns("1970-01-01T00:00:01.000000001Z") == 10**9 + 1
    assert alerts.rfc3339_ns("1970-01-01T01:00:00+01:00") == 0 == alerts.rfc3339_ns("1970-01-01T00:00:00z")
    assert alerts.finding(_two_gpus("2026-12-01T10:00:00Z", "2026-12-01T10:00:00.5Z")["alerts"])["started"] == \
        1796119200.5
    for bad in ("2026-12-01 10:00:00", "2026-12-01T10:00:00", "2026-02-30T10:00:00Z", "yesterday", None):
        payload = _two_gpus("2026-12-01T10:00:00Z", bad)
        with pytest.raises(alerts.AlertError, match=r"GpuXidCritical of gpu01:9100: startsAt .*RFC 3339"):
            alerts.finding(payload["alerts"])
    with pytest.raises(alerts.AlertError, match="non-empty list"):
        alerts.finding([])


def test_a_second_xid_while_the_alert_fires_is_a_new_fault_by_its_last_event_time():
    # The alert started at 10:00 and still fires; the same XID on the same GPU came again at 10:40 (the rules'
    # last_event_epoch annotation): the fault's time is 10:40, so a node returned at 10:20 is quarantined again.
    payload = copy.deepcopy(PAYLOAD)
    payload["alerts"][0]["startsAt"] = "2026-12-01T10:00:00.25Z"
    payload["alerts"][0]["annotations"]["last_event_epoch"] = "1796121600.000"  # 2026-12-01T10:40:00Z
    found = alerts.finding(payload["alerts"])
    assert found["started"] == 1796121600.0 and found["at"] == "2026-12-01T10:40:00Z"
    assert found["startsAt"] == "2026-12-01T10:00:00.25Z"
    # the XID older than startsAt (the alert began on another evaluation's data) or absent: startsAt stands
    for older in ("1796119000.000", "", None):
        payload["alerts"][0]["annotations"]["last_event_epoch"] = older
        assert alerts.finding(payload["alerts"])["started"] == pytest.approx(1796119200.25, abs=1e-6)
    # a second GPU's alert that started earlier but whose XID came last is the finding
    two = _two_gpus("2026-12-01T10:00:05Z", "2026-12-01T10:00:00Z")
    two["alerts"][1]["annotations"]["last_event_epoch"] = "1796119800"
    assert alerts.finding(two["alerts"])["gpu"] == "3"
    for bad in ("soon", "nan", "-1", "inf", "0"):
        payload["alerts"][0]["annotations"]["last_event_epoch"] = bad
        with pytest.raises(alerts.AlertError, match=r"GpuXidCritical of gpu01:9100: annotation last_event_epoch"):
            alerts.finding(payload["alerts"])


@pytest.mark.parametrize("change", [
    {"status": "resolved"},
    {"commonLabels": dict(PAYLOAD["commonLabels"], alertname="GpuXidWarning")},
    {"commonLabels": {"instance": "gpu01:9100"}},
])
def test_a_resolved_alert_or_another_alert_runs_nothing(change):
    payload = copy.deepcopy(PAYLOAD)
    payload.update(change)
    assert not matches(_rule()["condition"], _event(payload))
