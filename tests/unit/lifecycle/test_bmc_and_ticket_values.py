"""The BMC's and the ticket webhook's inventory values are checked whole before anything is sent, and a Redfish
module's failure message (community.general's redfish_utils words) is one named state."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import bmc, tickets


@pytest.mark.parametrize("url, baseuri", [("https://bmc-gpu01.example", "bmc-gpu01.example"),
                                          ("https://10.0.4.17:8443/", "10.0.4.17:8443"),
                                          ("https://[fd00::17]:443", "[fd00::17]:443")])
def test_a_valid_bmc_address_gives_the_redfish_baseuri(url, baseuri):
    assert bmc.endpoint(url, "admin", "p@ss word!", "System.Embedded.1") == (baseuri, [])


@pytest.mark.parametrize("url, words", [
    ("http://10.0.4.17", "must use https"), ("https://10.0.4.17:70000", "port must be 1-65535"),
    ("https://admin:pw@10.0.4.17", "must be https://HOST[:PORT]"), ("https://10.0.4.17/redfish/v1", "HOST[:PORT]"),
    ("https://10.0.4.17\n", "HOST[:PORT]"), ("https://bmc;reboot", "HOST[:PORT]"), (None, "HOST[:PORT]")])
def test_a_malformed_bmc_address_is_named(url, words):
    baseuri, errors = bmc.endpoint(url)
    assert baseuri is None and len(errors) == 1 and words in errors[0]


def test_credentials_are_checked_and_the_password_is_never_repeated():
    baseuri, errors = bmc.endpoint("https://bmc", "ad:min", "hunter2\x1b[2J", "sys 1")
    assert baseuri is None and [e.split(" ")[0] for e in errors] == [
        "gpufleet_bmc_username", "gpufleet_bmc_password", "gpufleet_bmc_system_id"]
    assert not any("hunter2" in e for e in errors)


@pytest.mark.parametrize("msg, state", [
    ("HTTP Error 401 on GET request to 'https://b/redfish/v1/Systems', extended message: 'x'", "auth_failed"),
    ("HTTP Error 403 on POST request to 'https://b/x', extended message: 'x'", "auth_failed"),
    ("URL Error on GET request to 'https://b/redfish/v1/': '_ssl.c:1003: The handshake operation timed out'",
     "timeout"),
    ("URL Error on GET request to 'https://b/redfish/v1/': '[Errno 111] Connection refused'", "unreachable"),
    ("URL Error on GET request to 'https://b/': '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed'",
     "unreachable"),
    ("System resource sys9 not found", "unknown_system"),
    ("HTTP Error 500 on POST request to 'https://b/x', extended message: 'x'", "refused"),
    ("something else", "error")])
def test_a_redfish_failure_is_one_named_state(msg, state):
    assert bmc.classify(msg) == state and state in bmc.STATES


def test_the_ticket_settings_are_checked_whole():
    assert tickets.check("https://jira.example/rest/api/2/issue", "jira", {"Authorization": "Bearer x"}, 10) == []
    assert set(tickets.SHIPPED) >= {"generic", "jira", "github"}
    errors = tickets.check("https://jira.example/rest api\n", "servicenow", {"X-Token": "a\r\nInjected: 1"}, 0)
    assert [e.split(" ")[0] for e in errors] == ["gpufleet_ticket_webhook_url", "gpufleet_ticket_template",
                                                 "gpufleet_ticket_headers:", "gpufleet_ticket_timeout_s"]
    assert not any("Injected" in e for e in errors)


@pytest.mark.parametrize("template, action, path, field", [
    ("generic", "create", "", "id"), ("jira", "create", "", "key"), ("jira", "update", "/OPS-7/comment", "key"),
    ("github", "create", "", "number"), ("github", "update", "/12/comments", "number")])
def test_each_shipped_template_renders_its_request(template, action, path, field):
    values = {"action": action, "ticket": {"jira": "OPS-7", "github": "12"}.get(template) if action == "update"
              else None, "node": "gpu01", "state": "quarantined", "code": "XID_79", "gpu": "3",
              "reason": 'XID 79 "fallen off the bus"', "evidence": ["NVRM: Xid (PCI:0000:61:00): 79, GPU has fallen"],
              "bundle": "reports/rma/gpu01/b", "actor": "alert", "time": "2026-12-01T00:00:00Z", "project": "OPS",
              "updates": 1 if action == "update" else 0}
    request = tickets.render(template, values)
    assert request["path"] == path and request["id_field"] == field
    text = str(request["body"])
    assert "gpu01" in text and "XID_79" in text and ("fallen off the bus" in text)


def test_a_ticket_id_that_would_change_the_update_url_is_not_kept():
    assert tickets.ticket_id({"key": "OPS-7"}, "key") == "OPS-7" and tickets.ticket_id({"number": 12}, "number") == "12"
    assert tickets.ticket_id({"key": "../../admin"}, "key") is None and tickets.ticket_id({}, "id") is None
