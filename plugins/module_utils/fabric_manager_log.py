# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The fabric manager's own log lines, as its journal holds them (stdlib only: runs on the node; never raises).

  parse_fabric_manager_log(lines)   lines: message strings, or (message, epoch seconds or None) pairs, e.g. the
                                    MESSAGE of each entry of `journalctl -u nvidia-fabricmanager -o json`
                                    (kernel_log_sources.journal_record decodes those)

Recognised, anywhere in a line (the daemon prints them before its own log prefix exists; its later lines carry
`[Mon DD YYYY HH:MM:SS] [LEVEL] [tid N]`):
  driver_version_mismatch  `fabric manager NVIDIA GPU driver interface version 570.148.08 don't match with driver
                           version 570.172.08. Please update with matching NVIDIA driver package.`: the daemon's
                           version, then the loaded driver's; it exits at start. Spelled `don't`, `don’t` or
                           `doesn't match` in the reports that quote it.
  no_nvswitch              `request to query NVSwitch device information from NVSwitch driver failed with
                           error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]`: the NVSwitch driver lists no switch
                           (a machine without NVSwitches, where the service is not needed; on NVLink 5 machines, NVLSM
                           not running).
Other lines are counted, not kept: the daemon's INFO lines are many and say nothing the checks need.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

_VERSION = r"(\d+(?:\.\d+)+)"
_MISMATCH_RE = re.compile(r"fabric manager NVIDIA GPU driver interface version\s+" + _VERSION +
                          r"\s+(?:don't|don\u2019t|doesn't|doesn\u2019t|does not|do not)\s+match\s+with\s+"
                          r"(?:the\s+)?driver version\s+" + _VERSION, re.I)
_NOTHING_TO_DO_RE = re.compile(r"NV_WARN_NOTHING_TO_DO")
MAX_EVENTS = 20
MAX_LINE = 400


def _pairs(lines):
    if isinstance(lines, (str, bytes)):
        lines = str(lines).splitlines() if isinstance(lines, str) else []
    for item in lines or []:
        at = None
        if isinstance(item, (tuple, list)) and item:
            item, at = item[0], (item[1] if len(item) > 1 else None)
        if not isinstance(item, str):
            continue
        yield item, at if isinstance(at, (int, float)) and not isinstance(at, bool) else None


def parse_fabric_manager_log(lines):
    """{"events": [{kind, line, at, fabric_manager_version?, driver_version?}] (oldest first, the last MAX_EVENTS),
    "lines": how many lines were read}."""
    out = {"events": [], "lines": 0}
    try:
        for text, at in _pairs(lines):
            for line in text.splitlines() or [text]:
                out["lines"] += 1
                event = None
                match = _MISMATCH_RE.search(line)
                if match:
                    event = {"kind": "driver_version_mismatch", "fabric_manager_version": match.group(1),
                             "driver_version": match.group(2)}
                elif _NOTHING_TO_DO_RE.search(line):
                    event = {"kind": "no_nvswitch"}
                if event is not None:
                    event.update({"line": line.strip()[:MAX_LINE], "at": at})
                    out["events"] = (out["events"] + [event])[-MAX_EVENTS:]
    except Exception:  # never raise: what was read so far stands
        pass
    return out
