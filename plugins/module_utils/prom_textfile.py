# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Prometheus text exposition for node_exporter's textfile collector, and atomic file writes (stdlib only: runs on
the node).

node_exporter reads every ``*.prom`` file of its textfile directory at each scrape. A file it reads half-written is a
scrape error (or, worse, a counter that seems to drop), so a file is replaced, never rewritten in place: a temporary
file in the same directory (its name does not end in ``.prom``, so the collector never reads it), write, fsync,
rename over the old file.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import os
import re
import tempfile

METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TYPES = ("counter", "gauge", "untyped")


def escape_label_value(value):
    """Label values escape backslash, double quote and newline (exposition format)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text):
    return str(text).replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class MetricFamily:
    """One metric name with its HELP, TYPE and samples [(labels dict, value)]."""

    def __init__(self, name, kind, help_text):
        if not METRIC_NAME_RE.match(name):
            raise ValueError("invalid metric name %r" % name)
        if kind not in TYPES:
            raise ValueError("invalid metric type %r" % kind)
        self.name = name
        self.kind = kind
        self.help = help_text
        self.samples = []

    def add(self, value, **labels):
        for key in labels:
            if key not in _GOOD_LABEL_NAMES:
                if not LABEL_NAME_RE.match(key) or key.startswith("__"):
                    raise ValueError("invalid label name %r on %s" % (key, self.name))
                _GOOD_LABEL_NAMES.add(key)
        self.samples.append((labels, value))
        return self

    def render(self):
        out = ["# HELP %s %s" % (self.name, escape_help(self.help)), "# TYPE %s %s" % (self.name, self.kind)]
        for labels, value in self.samples:
            out.append("%s%s %s" % (self.name, _label_text(labels), format_value(value)))
        return "\n".join(out)


# A long-running writer (the XID watcher) renders the same label sets at every write: their text is kept, up to a
# bound (a flood of new label sets only costs the cache's refill).
_GOOD_LABEL_NAMES = set()
_LABEL_TEXT = {}
_LABEL_TEXT_MAX = 8192


def _label_text(labels):
    if not labels:
        return ""
    key = tuple(sorted(labels.items()))
    text = _LABEL_TEXT.get(key)
    if text is None:
        if len(_LABEL_TEXT) >= _LABEL_TEXT_MAX:
            _LABEL_TEXT.clear()
        text = _LABEL_TEXT[key] = "{%s}" % ",".join('%s="%s"' % (k, escape_label_value(v)) for k, v in key)
    return text


def render(families):
    """Exposition text of families (those without samples are left out); ends with a newline as the collector wants."""
    parts = [f.render() for f in families if f.samples]
    return "\n".join(parts) + "\n" if parts else ""


def atomic_write(path, data, mode=0o644, sync_directory=False, sync_file=True):
    """Replace path with data (str or bytes): temp file in the same directory, write, fsync, rename.

    A reader sees the old file or the new one, whole, never a mix. sync_directory also fsyncs the directory so the
    rename itself survives a power cut; the watcher does not need it (after a crash an older state file replays the
    same lines onto the same counters) and it doubles the cost of every write. sync_file=False skips the file's fsync
    too, for data that is worthless after a power cut anyway (a training rank's metrics, rewritten every second):
    readers still never see a partial file. Raises OSError (unwritable directory, full disk): the caller decides what
    that means. Never leaves the temp file behind.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync_file:
                os.fsync(fd)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if not sync_directory:
        return
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
