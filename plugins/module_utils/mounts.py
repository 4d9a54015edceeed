# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Mount table parsers and the path -> mount -> backing device lookup (stdlib only: runs on the node).

The current state of a checkpoint filesystem (read-only after an NVMe error) is judged from /proc/mounts or
`findmnt -J`, never from old kernel log lines (docs/signals.md section 7). Traps handled here:
- /proc/mounts escapes space, tab, newline and backslash in paths as octal (`\\040`, `\\011`, `\\012`, `\\134`).
- Mounts stack: a later mount on T hides earlier mounts on T and below it (their subtree is covered).
- Longest prefix must respect path components: /data2 is not under /data.
- findmnt shows bind mounts as `/dev/sda1[/subdir]`; /proc/mounts shows only `/dev/sda1`.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
_NVME_RE = re.compile(r"^/dev/(?P<ctrl>nvme\d+)(?:(?P<ns>n\d+)(?:p\d+)?)?$")
_SD_RE = re.compile(r"^/dev/(?P<disk>(?:sd|vd|xvd|hd)[a-z]+)\d*$")
_MAX_SAMPLES = 5


def unescape_mount_field(value):
    """Undo the kernel's octal escaping of mount table fields (`\\040` -> space)."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), value)


def _entry(source, target, fstype, options, line):
    opts = [o for o in (options or "").split(",") if o]
    return {
        "source": source,
        "target": target,
        "fstype": fstype,
        "options": opts,
        "read_only": "ro" in opts,
        "line": line,
    }


def _unparsed():
    return {"count": 0, "samples": []}


def _note_unparsed(unparsed, line, reason):
    unparsed["count"] += 1
    if len(unparsed["samples"]) < _MAX_SAMPLES:
        unparsed["samples"].append({"line": line[:300], "reason": reason})


def parse_proc_mounts(text):
    """Parse /proc/mounts (same format as /etc/mtab) text. Never raises.

    Returns {"mounts": [{source, target, fstype, options, read_only, line}], "unparsed": {count, samples}}.
    """
    mounts = []
    unparsed = _unparsed()
    if not isinstance(text, str):
        _note_unparsed(unparsed, repr(text), "not text")
        return {"mounts": mounts, "unparsed": unparsed}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) < 4:
            _note_unparsed(unparsed, raw, "expected at least 4 fields (source target fstype options)")
            continue
        target = unescape_mount_field(fields[1])
        if not target.startswith("/"):
            _note_unparsed(unparsed, raw, "mount target is not an absolute path")
            continue
        mounts.append(_entry(unescape_mount_field(fields[0]), target, fields[2], fields[3], raw))
    return {"mounts": mounts, "unparsed": unparsed}


def parse_findmnt_json(text):
    """Parse `findmnt -J` (tree or --list form) into the same shape as parse_proc_mounts. Never raises."""
    mounts = []
    unparsed = _unparsed()
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        _note_unparsed(unparsed, str(text)[:300], "not JSON: %s" % exc)
        return {"mounts": mounts, "unparsed": unparsed}
    roots = data.get("filesystems") if isinstance(data, dict) else None
    if not isinstance(roots, list):
        _note_unparsed(unparsed, str(text)[:300], "no 'filesystems' list")
        return {"mounts": mounts, "unparsed": unparsed}

    # Depth-first in document order = mount order, so "last match wins" holds for stacked mounts too.
    stack = list(reversed(roots))
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            _note_unparsed(unparsed, repr(node)[:300], "filesystem entry is not an object")
            continue
        target, source = node.get("target"), node.get("source")
        if not isinstance(target, str) or not target.startswith("/") or not isinstance(source, str):
            _note_unparsed(unparsed, json.dumps(node)[:300], "entry lacks a target path or source")
        else:
            bind_root = None
            match = re.match(r"^(.*)\[(/.*)\]$", source)
            if match:
                source, bind_root = match.group(1), match.group(2)
            opts = node.get("options") if isinstance(node.get("options"), str) else ""
            fstype = node.get("fstype") if isinstance(node.get("fstype"), str) else None
            entry = _entry(source, target, fstype, opts, json.dumps(
                {k: node.get(k) for k in ("target", "source", "fstype", "options")}))
            entry["bind_root"] = bind_root
            mounts.append(entry)
        children = node.get("children")
        if isinstance(children, list):
            stack.extend(reversed(children))
    return {"mounts": mounts, "unparsed": unparsed}


def _is_under(path, target):
    if target == "/":
        return path.startswith("/")
    return path == target or path.startswith(target.rstrip("/") + "/")


def visible_mounts(mounts):
    """Mounts still visible, in order: a later mount on T hides every earlier mount on T or below T."""
    visible = []
    for entry in mounts or []:
        target = entry.get("target")
        if not isinstance(target, str):
            continue
        visible = [e for e in visible if not _is_under(e["target"], target)]
        visible.append(entry)
    return visible


def find_mount(mounts, path):
    """The mount entry that holds `path` (an absolute, already resolved path), or None.

    Among visible mounts (stacking resolved), the longest target that is a path-component prefix of path.
    """
    # Only mounts whose target is an ancestor of path matter, and anything that hides one of them is itself an
    # ancestor of path: stacking is resolved among those few (a node with thousands of overlay mounts stays fast).
    candidates = [e for e in mounts or [] if isinstance(e.get("target"), str) and _is_under(path, e["target"])]
    best = None
    for entry in visible_mounts(candidates):
        target = entry["target"]
        if best is None or len(target.rstrip("/")) > len(best["target"].rstrip("/")):
            best = entry
    return best


def nvme_devices_for_source(source):
    """/dev/nvme0n1p1 -> {"namespace": "/dev/nvme0n1", "controller": "/dev/nvme0"}; None for anything else.

    A controller path (/dev/nvme0) gives namespace None.
    """
    match = _NVME_RE.match(source or "") if isinstance(source, str) else None
    if not match:
        return None
    return {"namespace": "/dev/%s%s" % (match.group("ctrl"), match.group("ns")) if match.group("ns") else None,
            "controller": "/dev/%s" % match.group("ctrl")}


def disk_for_source(source):
    """/dev/sda1 -> /dev/sda (smartctl target for SATA/SAS/virtio disks); None when not such a device."""
    match = _SD_RE.match(source or "")
    return "/dev/%s" % match.group("disk") if match else None


def backing_devices(source, sys_block="/sys/class/block", dev_root="/dev"):
    """Physical block devices under a mount source, following device-mapper/md slaves in sysfs.

    /dev/mapper/vg-lv or /dev/md0 -> the NVMe namespaces or disks beneath. Returns a list of /dev paths (possibly
    the source itself). Never raises: unreadable sysfs just yields what is known.
    """
    if not isinstance(source, str) or not source.startswith("/dev/"):
        return []
    try:
        real = os.path.realpath(source)
    except (OSError, ValueError):
        real = source
    result = []
    seen = set()

    def walk(name, depth):
        if name in seen or depth > 8:
            return
        seen.add(name)
        slaves_dir = os.path.join(sys_block, name, "slaves")
        try:
            slaves = sorted(os.listdir(slaves_dir))
        except OSError:
            slaves = []
        if not slaves:
            result.append(os.path.join(dev_root, name))
            return
        for slave in slaves:
            walk(slave, depth + 1)

    walk(os.path.basename(real), 0)
    return result


def read_mounts(proc_mounts="/proc/mounts"):
    """Read and parse the live mount table; a read error is reported in unparsed, never raised."""
    try:
        with open(proc_mounts, "r") as fh:
            text = fh.read()
    except (IOError, OSError) as exc:
        unparsed = _unparsed()
        _note_unparsed(unparsed, proc_mounts, "cannot read: %s" % exc)
        return {"mounts": [], "unparsed": unparsed}
    return parse_proc_mounts(text)
