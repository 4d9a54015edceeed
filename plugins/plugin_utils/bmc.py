# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""A node's BMC (controller side): its inventory values checked whole before anything is sent, and what a Redfish
module's failure means, as one named state. The power-cycle rung (plugins/action/bmc_power_cycle.py) uses both;
docs/lifecycle.md lists the states."""

from __future__ import annotations

import re

# The Redfish modules build https://<baseuri>: the BMC's address is https, a host (DNS name, IPv4, [IPv6]) and an
# optional port, nothing else (no user:password@, path, query or whitespace).
URL = re.compile(r"\A(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?"
                 r"|\[[0-9A-Fa-f:.]{2,45}\])(?::(?P<port>[0-9]{1,5}))?/?\Z")
USERNAME = re.compile(r"\A[^\x00-\x1f\x7f:]{1,64}\Z")  # basic auth: no colon in the user name
PASSWORD = re.compile(r"\A[^\x00-\x1f\x7f]{1,256}\Z")
SYSTEM_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")

# bmc_state -> what the operator does about it. "power_cycled" is the one success.
STATES = {
    "power_cycled": "the system was powered off and on again; the node's validation follows",
    "not_configured": "set gpufleet_bmc_url (and gpufleet_bmc_username, gpufleet_bmc_password) for the node, or "
                      "power-cycle it by hand, run a preflight and gpufleet release",
    "bad_input": "correct the node's BMC inventory value named in the message",
    "missing_collection": "install the ansible package (it ships community.general's Redfish modules) or "
                          "ansible-galaxy collection install community.general",
    "auth_failed": "the BMC refused the credentials (HTTP 401/403): check gpufleet_bmc_username and "
                   "gpufleet_bmc_password (vault) and the account's role on the BMC",
    "timeout": "the BMC did not answer in time: check its network and raise gpufleet_bmc_timeout_s if it is slow",
    "unreachable": "the BMC could not be reached (connection refused, name, route or TLS): check gpufleet_bmc_url, "
                   "the BMC network, and gpufleet_bmc_validate_certs/gpufleet_bmc_ca_path for its certificate",
    "refused": "the BMC answered the request with an error: read its message",
    "unknown_system": "the BMC has no such system: set gpufleet_bmc_system_id to the system's Redfish Id",
    "no_power_off": "the system did not report PowerState Off in time: a person checks the BMC",
    "no_power_on": "the system did not report PowerState On in time: a person checks the machine and its BMC",
    "error": "the Redfish module failed: read its message",
}
FAILED = tuple(s for s in STATES if s != "power_cycled")


def endpoint(url, username=None, password=None, system_id=None):
    """(baseuri, errors): the Redfish modules' baseuri (host[:port]) of a node's BMC values, and what is wrong with
    them (each error names the variable). Values are checked whole; the password never appears in an error."""
    errors = []
    found = URL.match(url) if isinstance(url, str) else None
    if not found:
        errors.append("gpufleet_bmc_url must be https://HOST[:PORT] (a DNS name, IPv4 or [IPv6] address, no path, "
                      "credentials or control characters), got %r" % (url,))
    elif found.group("scheme").lower() != "https":
        errors.append("gpufleet_bmc_url must use https (the Redfish modules speak HTTPS only), got %r" % url)
    elif found.group("port") and not 0 < int(found.group("port")) < 65536:
        errors.append("gpufleet_bmc_url's port must be 1-65535, got %s" % found.group("port"))
    if username is not None and not (isinstance(username, str) and USERNAME.match(username)):
        errors.append("gpufleet_bmc_username must be 1-64 characters without ':' or control characters")
    if password is not None and not (isinstance(password, str) and PASSWORD.match(password)):
        errors.append("gpufleet_bmc_password must be 1-256 characters without control characters")
    if system_id is not None and not (isinstance(system_id, str) and SYSTEM_ID.match(system_id)):
        errors.append("gpufleet_bmc_system_id must be a Redfish Id (letters, digits, '._:-'), got %r" % (system_id,))
    if errors:
        return None, errors
    return found.group("host") + (":" + found.group("port") if found.group("port") else ""), []


def classify(msg):
    """The named state of a Redfish module's failure message (community.general's redfish_utils words)."""
    text = str(msg or "")
    status = re.search(r"HTTP Error (\d{3})", text)
    if status and status.group(1) in ("401", "403"):
        return "auth_failed"
    if re.search(r"timed out|timeout", text, re.I):
        return "timeout"
    if re.search(r"System resource \S+ not found|Members array is either empty", text):
        return "unknown_system"
    if status:
        return "refused"
    if "URL Error" in text or re.search(r"Connection refused|Name or service not known|certificate", text, re.I):
        return "unreachable"
    return "error"
