# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The RMA evidence bundle's files on the node: secrets scrubbed, each file bounded, a manifest with the sha256 of
each (stdlib only: the module kentino.gpufleet.rma_bundle writes it; the controller adds the history's rows with the
same manifest functions).

Scrubbing replaces the value of anything that looks like a credential (key=value / key: value pairs whose key names
a password, secret, token, API key or credential; Authorization headers; private key blocks; AWS access key ids;
URLs with a password) with REDACTED, and counts what it replaced. A file over its share of the size limit keeps its
head and tail with a marker line between them saying how much was cut.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import gzip
import hashlib
import json
import os
import re

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
REDACTED = "REDACTED"
# (pattern, replacement): the value goes, what names it stays.
SECRETS = (
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S), REDACTED),
    (re.compile(r"(?i)(\bauthorization\s*[:=]\s*)(?:(?:bearer|basic|token)\s+)?[^\s\"']+"), r"\g<1>" + REDACTED),
    (re.compile(r"(?i)(\b[\w.-]*(?:passw(?:or)?d|passwd|secret|token|api[_-]?key|credential|private[_-]?key)"
                r"[\w.-]*\s*[:=]\s*)(?:\"[^\"]*\"|'[^']*'|[^\s,;]+)"), r"\g<1>" + REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/\s@]+:)[^@\s/]+(@)"), r"\g<1>" + REDACTED + r"\g<2>"),
)


def scrub(text):
    """(text with every secret value replaced by REDACTED, how many were replaced)."""
    count = 0
    for pattern, replacement in SECRETS:
        text, n = pattern.subn(replacement, text)
        count += n
    return text, count


def bounded(data, limit):
    """(data of at most about `limit` bytes: its head and tail around a marker, bytes cut)."""
    if len(data) <= limit:
        return data, 0
    keep = max(0, limit - 200) // 2
    cut = len(data) - 2 * keep
    marker = ("\n[gpufleet: %d bytes cut from the middle to keep the bundle within its size limit]\n" % cut).encode()
    return data[:keep] + marker + data[len(data) - keep:], cut


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_text(directory, name, text, limit, source=None, gz=False):
    """Scrub, bound and write one file of the bundle; returns its manifest entry."""
    clean, found = scrub(text)
    data, cut = bounded(clean.encode("utf-8", "replace"), limit)
    path = os.path.join(directory, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    with os.fdopen(os.open(path, flags, 0o600), "wb") as fh:
        fh.write(gzip.compress(data, 6) if gz else data)
    return {"name": name, "bytes": os.path.getsize(path), "sha256": sha256_of(path), "source": source or [],
            "secrets_redacted": found, "cut_bytes": cut}


def write_manifest(directory, manifest):
    """manifest.json of the bundle (files sorted by name), written last."""
    manifest = dict(manifest, version=MANIFEST_VERSION,
                    files=sorted(manifest.get("files") or [], key=lambda f: f["name"]))
    path = os.path.join(directory, MANIFEST)
    with open(path + ".tmp", "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
    return manifest
