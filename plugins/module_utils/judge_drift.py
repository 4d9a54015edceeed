# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge version drift: a node whose driver, DCGM, kernel, system BIOS, GPU VBIOS or InfoROM differs from its group's
majority, or from the pinned golden set (stdlib only, pure).

Nodes of one platform that run different versions behave differently (NCCL busbw, XID handling, power management),
and a version nobody chose is how a surprise upgrade shows. The reference is gpufleet_golden_versions when set for a
key, else the strict majority of the group (gpufleet_drift_group, default the GPU model), counted over the group's
latest known versions and only once the group has gpufleet_drift_min_nodes nodes. Per-GPU versions (VBIOS, InfoROM)
are counted per GPU.

The system BIOS is compared only between nodes of one board model (versions.board).

Input (`result`): {"group": str, "versions": {<node key>: str, <gpu key>: {"<index>": str}, "board": str},
                   "peers": [{"host": str, "versions": {...}}]}   peers: the group's nodes, this one included
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door

CHECK = "drift"
# Every finding this judge can return: code -> (severity, what it means). docs/rules.md is generated from these.
CODES = {
    "VERSION_DRIFT": ("warn", "a version differs from the strict majority of the node's group (gpufleet_drift_group, "
                              "at least gpufleet_drift_min_nodes nodes) or, per GPU, of the node's own GPUs"),
    "VERSION_NOT_GOLDEN": ("warn", "a version differs from gpufleet_golden_versions"),
}
NODE_KEYS = ("driver", "dcgm", "kernel", "bios")
GPU_KEYS = ("vbios", "inforom")
BOARD_KEYS = ("bios",)
WORDS = {"driver": "NVIDIA driver", "dcgm": "DCGM", "kernel": "kernel", "bios": "system BIOS", "vbios": "VBIOS",
         "inforom": "InfoROM image"}


def _text(value):
    return str(value).strip() if isinstance(value, (str, int, float)) and str(value).strip() else None


def _values(versions, key):
    """The node's known values of a key: [(gpu index or None, value)]."""
    raw = (versions or {}).get(key)
    if key in GPU_KEYS:
        if not isinstance(raw, dict):
            return []
        out = []
        for index, value in raw.items():
            try:
                out.append((int(index), _text(value)))
            except (TypeError, ValueError):
                continue
        return sorted((i, v) for i, v in out if v)
    value = _text(raw)
    return [(None, value)] if value else []


def majority(counts):
    """(value, share) of the most common value when it holds more than half of the counts, else (None, share)."""
    total = sum(counts.values())
    if not total:
        return None, 0.0
    value = max(sorted(counts), key=lambda v: counts[v])
    share = counts[value] / float(total)
    return (value, share) if share > 0.5 else (None, share)


def reference(result, t, key):
    """(reference value or None, where it comes from)."""
    golden = _text((t.get("gpufleet_golden_versions") or {}).get(key))
    if golden:
        return golden, "golden"
    peers = [p for p in result.get("peers") or [] if _values(p.get("versions"), key)]
    if key in BOARD_KEYS:
        # A system BIOS is only comparable between boards of one model.
        board = (result.get("versions") or {}).get("board")
        peers = [p for p in peers if (p.get("versions") or {}).get("board") == board]
    if len(peers) < int(t["gpufleet_drift_min_nodes"]):
        return None, "group %s has %d node(s) reporting %s (< %d)" % (
            result.get("group"), len(peers), key, int(t["gpufleet_drift_min_nodes"]))
    counts = {}
    for peer in peers:
        for _index, value in _values(peer.get("versions"), key):
            counts[value] = counts.get(value, 0) + 1
    value, share = majority(counts)
    unit = "GPUs" if key in GPU_KEYS else "nodes"
    if value is None:
        return None, "no majority in group %s (%s)" % (result.get("group"), ", ".join(
            "%s: %d %s" % (v, c, unit) for v, c in sorted(counts.items())))
    scope = "group %s%s" % (result.get("group"), " on board %s" % (result.get("versions") or {}).get("board")
                             if key in BOARD_KEYS else "")
    return value, "majority of %s (%d of %d %s)" % (scope, counts[value], sum(counts.values()), unit)


@judge_door(CHECK)
def judge(result, t, host):
    """[finding] for one node's versions against its group (see the module docstring)."""
    out = []
    versions = result.get("versions") or {}
    for key in NODE_KEYS + GPU_KEYS:
        mine = _values(versions, key)
        if not mine:
            continue
        ref, source = reference(result, t, key)
        if ref is None and key in GPU_KEYS and len(mine) >= 2:
            counts = {}
            for _index, value in mine:
                counts[value] = counts.get(value, 0) + 1
            ref, share = majority(counts)
            source = "majority of the node's own GPUs (%.0f%%)" % (share * 100)
        if ref is None:
            continue
        off = [(index, value) for index, value in mine if value != ref]
        if not off:
            continue
        reference_words = "the golden %s" % ref if source == "golden" else "%s (%s)" % (ref, source)
        evidence = ["%s%s = %s" % (key, "" if index is None else "[GPU %d]" % index, value) for index, value in off]
        evidence.append("reference: %s from %s" % (ref, source))
        fix = ("bring %s on %s to %s, or pin the version you qualified in gpufleet_golden_versions"
               % (WORDS[key], host, ref))
        for index, value in off:
            message = "%s%s: %s %s differs from %s" % (host, "" if index is None else " GPU %d" % index, WORDS[key],
                                                       value, reference_words)
            if source == "golden":
                out.append(finding("warn", "VERSION_NOT_GOLDEN", message, fix, evidence, gpu=index))
            else:
                out.append(finding("warn", "VERSION_DRIFT", message, fix, evidence, gpu=index))
    return out


def _no_figures():
    return {}


@judge_door(CHECK, empty=_no_figures)
def figures(result, t):
    """{key: {"values": [...], "reference": str or None, "source": str}} for the report and the handover sheet."""
    out = {}
    for key in NODE_KEYS + GPU_KEYS:
        mine = _values(result.get("versions") or {}, key)
        if mine:
            ref, source = reference(result, t, key)
            out[key] = {"values": sorted(set(v for _i, v in mine)), "reference": ref, "source": source}
    return out
