# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""gpufleet_ckpt: save training checkpoints atomically and find the newest COMPLETE one (stdlib only, Python >= 3.8).

A training script imports it (the kentino.gpufleet.elastic_training role puts it on the workers' PYTHONPATH as
``gpufleet_ckpt``; it has no other dependency, so it can also be copied next to a script). The contract:

    <checkpoint dir>/step-000000001200/            a complete checkpoint: the script's files and, written last,
                      gpufleet-manifest.json        {"step", "files": {name: size}, "created", "host", "extra"}
    <checkpoint dir>/.partial-step-...              being written, or left by a writer that died: never offered

A checkpoint is written into a ``.partial-`` directory, every file and the directory are fsync'ed, the manifest is
written, and only then is the directory renamed to ``step-<12 digits>`` (rename is atomic on a POSIX filesystem) and
the parent directory fsync'ed. So a reader that lists ``step-*`` directories never sees a half-written checkpoint, and
latest() also checks every file against the sizes in the manifest (a checkpoint damaged later is skipped, not loaded).

    import gpufleet_ckpt
    ckpt = gpufleet_ckpt.resume()                    # newest complete checkpoint (GPUFLEET_RESUME_FROM or the dir)
    if ckpt:
        state = torch.load(ckpt.file("state.pt"))    # ckpt.step, ckpt.manifest["extra"]
    ...
    gpufleet_ckpt.save(directory, step, lambda d: torch.save(state, os.path.join(d, "state.pt")), keep=3)

Sharded checkpoints (every rank writes its own file): rank 0 calls ``begin(directory, step, clear=True)``, all ranks
wait at a barrier, each writes into ``staging_path(directory, step)``, all wait again, rank 0 calls ``commit``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import shutil
import socket
import time

PREFIX = "step-"
PARTIAL = ".partial-"
DOOMED = ".deleting-"
MANIFEST = "gpufleet-manifest.json"
VERSION = 1
STEP_DIGITS = 12
ENV_DIR = "GPUFLEET_CHECKPOINT_DIR"
ENV_RESUME = "GPUFLEET_RESUME_FROM"
_COMPLETE_RE = re.compile(r"^step-(\d+)$")
_PARTIAL_RE = re.compile(r"^\.partial-step-(\d+)(?:-.*)?$")


class CheckpointError(Exception):
    """A checkpoint could not be written (the message names the directory and the step)."""


class Checkpoint:
    """A complete checkpoint: its directory, step and manifest."""

    def __init__(self, path, step, manifest):
        self.path = path
        self.step = step
        self.manifest = manifest

    def file(self, name):
        return os.path.join(self.path, name)

    def __repr__(self):
        return "Checkpoint(step=%d, path=%r)" % (self.step, self.path)


def step_name(step):
    step = int(step)
    if step < 0:
        raise ValueError("a checkpoint step must be >= 0, got %d" % step)
    return PREFIX + str(step).zfill(STEP_DIGITS)


def staging_path(directory, step):
    """The shared staging directory of a sharded checkpoint at `step` (every rank writes its files there)."""
    return os.path.join(directory, PARTIAL + step_name(step))


def _fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    except OSError:
        if not directory:  # some filesystems refuse fsync on a directory; a file must reach the disk
            raise
    finally:
        os.close(fd)


def _remove_tree(path):
    """Rename out of sight first (a half-deleted checkpoint must never look complete), then delete."""
    parent, name = os.path.split(path)
    doomed = os.path.join(parent, DOOMED + name.lstrip(".") + "-%d-%s" % (os.getpid(), os.urandom(3).hex()))
    try:
        os.rename(path, doomed)
    except OSError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def begin(directory, step, clear=False):
    """Create (or, with clear, recreate empty) the shared staging directory for `step`; returns its path."""
    path = staging_path(directory, step)
    if clear and os.path.lexists(path):
        _remove_tree(path)
    os.makedirs(path, exist_ok=True)
    return path


def _inventory(staging):
    """{relative name: size} of every regular file under staging, each fsync'ed, and the directories fsync'ed."""
    files = {}
    for root, _dirs, names in os.walk(staging):
        for name in names:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, staging)
            if rel == MANIFEST or not os.path.isfile(full) or os.path.islink(full):
                continue
            _fsync_path(full)
            files[rel] = os.path.getsize(full)
        _fsync_path(root, directory=True)
    return files


def _write_json(path, data):
    tmp = path + ".tmp-%d" % os.getpid()
    with open(tmp, "w") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, path)


def commit(directory, step, keep=None, extra=None, staging=None):
    """Seal the staging directory of `step` as a complete checkpoint; returns the Checkpoint.

    extra: JSON-serialisable metadata kept in the manifest (loss, epoch, data position). keep: how many complete
    checkpoints to keep (oldest removed; None keeps all). A checkpoint of the same step already there is replaced.
    """
    staging = staging or staging_path(directory, step)
    final = os.path.join(directory, step_name(step))
    if not os.path.isdir(staging):
        raise CheckpointError("%s: no staging directory %s for step %d (call begin() first)" % (directory, staging,
                                                                                                 step))
    try:
        files = _inventory(staging)
        manifest = {"version": VERSION, "step": int(step), "created": time.time(), "host": socket.gethostname(),
                    "files": files, "extra": extra if extra is not None else {}}
        _write_json(os.path.join(staging, MANIFEST), manifest)
        _fsync_path(staging, directory=True)
        if os.path.lexists(final):  # the same step saved again (a resumed run repeating it): newest wins
            _remove_tree(final)
        os.rename(staging, final)
        _fsync_path(directory, directory=True)
    except (OSError, TypeError, ValueError) as exc:
        raise CheckpointError("%s: checkpoint of step %d not committed: %s" % (directory, step, exc)) from exc
    if keep is not None:
        prune(directory, keep)
    _clear_leftovers(directory, step)
    return Checkpoint(final, int(step), manifest)


def save(directory, step, write, keep=None, extra=None):
    """write(staging_dir) writes the checkpoint's files; then they are sealed as step `step`. One writer only
    (for sharded writes see begin/commit). Returns the Checkpoint; raises CheckpointError (nothing is offered)."""
    os.makedirs(directory, exist_ok=True)
    staging = os.path.join(directory, "%s%s-%d-%s" % (PARTIAL, step_name(step), os.getpid(), os.urandom(3).hex()))
    os.mkdir(staging)
    try:
        write(staging)
    except BaseException:
        _remove_tree(staging)
        raise
    return commit(directory, step, keep=keep, extra=extra, staging=staging)


def _entries(directory):
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def check(path):
    """(manifest, None) when the checkpoint directory is complete, else (None, why)."""
    try:
        with open(os.path.join(path, MANIFEST)) as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        return None, "no readable %s (%s)" % (MANIFEST, exc)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return None, "%s has no file list" % MANIFEST
    for name, size in manifest["files"].items():
        try:
            actual = os.path.getsize(os.path.join(path, name))
        except OSError:
            return None, "%s is missing" % name
        if actual != size:
            return None, "%s has %d bytes, the manifest says %s" % (name, actual, size)
    return manifest, None


def complete(directory, skipped=None):
    """Every complete checkpoint in directory, oldest first. skipped (a list) receives (name, why) of the rest."""
    out = []
    for name in _entries(directory):
        match = _COMPLETE_RE.match(name)
        path = os.path.join(directory, name)
        if not match or not os.path.isdir(path):
            if skipped is not None and _PARTIAL_RE.match(name):
                skipped.append((name, "being written or abandoned (not renamed yet)"))
            continue
        manifest, why = check(path)
        if manifest is None:
            if skipped is not None:
                skipped.append((name, why))
            continue
        out.append(Checkpoint(path, int(match.group(1)), manifest))
    out.sort(key=lambda c: c.step)
    return out


def latest(directory, skipped=None):
    """The newest complete checkpoint in directory, or None."""
    found = complete(directory, skipped)
    return found[-1] if found else None


def find(directory, step):
    """The complete checkpoint of exactly `step`, or None (ranks that agreed on a step load the same one)."""
    path = os.path.join(directory, step_name(step))
    manifest, _why = check(path) if os.path.isdir(path) else (None, None)
    return Checkpoint(path, int(step), manifest) if manifest is not None else None


def resume(directory=None, skipped=None):
    """The checkpoint a (re)starting worker resumes from: GPUFLEET_RESUME_FROM (set by the elastic launcher's
    worker wrapper when the worker starts) if it is still complete, else the newest complete one in `directory`
    (default GPUFLEET_CHECKPOINT_DIR). None: start from scratch."""
    offered = os.environ.get(ENV_RESUME)
    if offered:
        match = _COMPLETE_RE.match(os.path.basename(offered.rstrip("/")))
        manifest, _why = check(offered) if match and os.path.isdir(offered) else (None, None)
        if manifest is not None:
            return Checkpoint(offered, int(match.group(1)), manifest)
    directory = directory or os.environ.get(ENV_DIR)
    return latest(directory, skipped) if directory else None


def prune(directory, keep):
    """Remove all but the newest `keep` complete checkpoints; returns the removed steps."""
    keep = int(keep)
    if keep < 1:
        raise ValueError("keep must be >= 1, got %d" % keep)
    found = complete(directory)
    removed = []
    for ckpt in found[:-keep]:
        _remove_tree(ckpt.path)
        removed.append(ckpt.step)
    return removed


def _clear_leftovers(directory, committed_step):
    """Staging directories of steps up to the one just committed were abandoned by writers that died."""
    for name in _entries(directory):
        match = _PARTIAL_RE.match(name)
        if match and int(match.group(1)) <= committed_step:
            _remove_tree(os.path.join(directory, name))
        elif name.startswith(DOOMED):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
