# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Parsers for environment listings (stdlib only): `env -0` after a marker, and KEY=VALUE files and command output
(/etc/environment, environment.d/*.conf, `systemctl show-environment`)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

MARK = "__GPUFLEET_ENV__"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ASSIGN_RE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def parse_env0(text):
    """NUL-separated NAME=VALUE records after the marker (env -0). Never raises.

    The marker is printed before env so that banners from profile scripts (echo in .bash_profile, motd) cannot be
    mistaken for variables."""
    if not isinstance(text, str):
        return {}
    marker = "\0%s\0" % MARK
    if marker in text:
        text = text.split(marker, 1)[1]
    records = text.split("\0") if "\0" in text else text.splitlines()
    env = {}
    for record in records:
        name, sep, value = record.partition("=")
        if sep and _NAME.match(name):
            env[name] = value
    return env


def _unquote(value):
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    if value.startswith("$'") and value.endswith("'"):  # systemd >= 249 quotes special characters C-style
        try:
            return value[2:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        except (UnicodeDecodeError, UnicodeEncodeError):
            return value[2:-1]
    return value


def parse_assignments(text):
    """KEY=VALUE lines (/etc/environment, environment.d, systemctl show-environment); comments skipped."""
    env = {}
    for line in (text or "").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _ASSIGN_RE.match(line)
        if match:
            env[match.group(1)] = _unquote(match.group(2))
    return env
