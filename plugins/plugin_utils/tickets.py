# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""A fault's ticket through a webhook (controller side): one JSON POST per fault, rendered from a tracker's template
(templates/tickets/<name>.json.j2: generic, jira, github, or a site's own file); a repeat of the same fault on the same
node within the update window updates the ticket the history keeps (history table tickets) instead of opening one.
A webhook that fails is a named warning: the quarantine it reports has happened already and stays."""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.error
import urllib.request

import jinja2

TEMPLATES = os.path.join(os.path.dirname(__file__), "templates", "tickets")
SHIPPED = tuple(sorted(f[: -len(".json.j2")] for f in os.listdir(TEMPLATES) if f.endswith(".json.j2")))
URL = re.compile(r"\Ahttps?://(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])"
                 r"(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%!$&'()*+,;=:@/-]*)?\Z")
HEADER_NAME = re.compile(r"\A[A-Za-z0-9-]{1,64}\Z")
HEADER_VALUE = re.compile(r"\A[^\x00-\x1f\x7f]{0,4096}\Z")
TICKET_ID = re.compile(r"\A[A-Za-z0-9._-]{1,64}\Z")  # it goes into the update's URL path

# ticket_state -> what it means; "created" and "updated" are the successes.
STATES = {
    "created": "a ticket was opened",
    "updated": "the open ticket of the same fault was updated",
    "not_configured": "gpufleet_ticket_webhook_url is not set: no ticket",
    "bad_input": "a ticket setting is malformed (named in the message): no ticket was sent",
    "timeout": "the webhook did not answer in time: no ticket; open one by hand with the node's bundle",
    "refused": "the webhook answered with an HTTP error: no ticket; read its answer",
    "unreachable": "the webhook could not be reached: no ticket; open one by hand with the node's bundle",
    "no_ticket_id": "the webhook's answer names no ticket: a repeat of this fault will open another",
}


def check(url, template, headers, timeout):
    """The settings' errors (each names its variable); headers' values are never repeated (they hold tokens)."""
    errors = []
    if not (isinstance(url, str) and URL.match(url)):
        errors.append("gpufleet_ticket_webhook_url must be an http(s) URL of a host, optional port and path, without "
                      "spaces, credentials or control characters, got %r" % (url,))
    if template not in SHIPPED and not (isinstance(template, str) and os.path.isabs(template)
                                        and os.path.isfile(template)):
        errors.append("gpufleet_ticket_template must be one of %s or the absolute path of a template file, got %r" % (
            ", ".join(SHIPPED), template))
    for name, value in (headers or {}).items():
        if not HEADER_NAME.match(str(name)) or not HEADER_VALUE.match(str(value)):
            errors.append("gpufleet_ticket_headers: header %r must be a token name with a one-line value"
                          % str(name)[:64])
    if not isinstance(timeout, int) or timeout < 1:
        errors.append("gpufleet_ticket_timeout_s must be at least 1, got %r" % (timeout,))
    return errors


def render(template, values):
    """{path, id_field, body} of the request the template makes for these values."""
    folder, name = (TEMPLATES, template + ".json.j2") if template in SHIPPED else os.path.split(template)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), undefined=jinja2.StrictUndefined,
                             autoescape=False, keep_trailing_newline=True)
    return json.loads(env.get_template(name).render(**values))


def post(url, body, headers, timeout):
    """(status, answer, failure state, message): POST the body as JSON."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers=dict({"Content-Type": "application/json", "Accept": "application/json",
                                                   "User-Agent": "kentino.gpufleet"}, **(headers or {})))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            text = answer.read(1 << 20).decode("utf-8", "replace")
            status = answer.status
    except urllib.error.HTTPError as exc:
        return exc.code, None, "refused", "HTTP %s %s: %s" % (exc.code, exc.reason, exc.read(300).decode(
            "utf-8", "replace"))
    except (TimeoutError, socket.timeout) as exc:
        return None, None, "timeout", "no answer within %ss (%s)" % (timeout, exc)
    except urllib.error.URLError as exc:
        timed_out = isinstance(exc.reason, (TimeoutError, socket.timeout))
        return None, None, "timeout" if timed_out else "unreachable", str(exc.reason)
    except OSError as exc:
        return None, None, "unreachable", str(exc)
    try:
        return status, json.loads(text) if text.strip() else {}, None, None
    except ValueError:
        return status, {}, None, None


def ticket_id(answer, field):
    """The ticket's id or key in the tracker's answer, if it is one that fits in a URL path."""
    value = answer.get(field) if isinstance(answer, dict) else None
    value = None if value is None or isinstance(value, bool) else str(value)
    return value if value and TICKET_ID.match(value) else None
