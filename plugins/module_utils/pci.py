# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""PCI address normalisation shared by every parser (stdlib only: runs on the node).

Sources spell the same GPU differently (docs/signals.md section 1):
  Xid line     PCI:0000:3b:00        (4-hex domain, no function)
  sysfs/NVRM   0000:3b:00.0
  nvidia-smi   00000000:3B:00.0      (8-hex domain, uppercase, with function)
  old Xid      0000:01:00 / 01:00.0  (no domain)
All are normalised to lowercase ``dddd:bb:dd`` (4-hex domain, bus, device; function dropped) so that
facts, events and rules can be joined on one key.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

_PCI_RE = re.compile(
    r"^(?:PCI:)?\s*(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?$"
)


def normalize_pci(value):
    """Return ``dddd:bb:dd`` for any known spelling of a PCI address, or None when it is not one."""
    if value is None:
        return None
    text = str(value).strip()
    match = _PCI_RE.match(text)
    if not match:
        return None
    domain = int(match.group("domain") or "0", 16)
    if domain > 0xFFFF:
        return None
    return "%04x:%02x:%02x" % (domain, int(match.group("bus"), 16), int(match.group("dev"), 16))
