# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""gpufleet_metrics: training health metrics for node_exporter's textfile collector, per rank (stdlib only; torch is
used only when the training script has imported it).

The slow software failures of a training job (a memory leak, a loss that stopped falling or became NaN, a straggler
rank, a job that stopped stepping, a job that keeps restarting) are visible only from inside the job. Each rank calls
step() once per training step; the helper keeps running figures and, at most every `min_interval_s`, replaces its
file ``gpufleet_training_<job>_local<local rank>.prom`` atomically (prom_textfile.atomic_write: node_exporter never
reads half a file). The alert rules in monitoring/prometheus/gpufleet-training-alerts.yml read these series.

    import gpufleet_metrics
    metrics = gpufleet_metrics.TrainingMetrics()          # directory, job and ranks from the environment
    for step, batch in ...:
        with metrics.compute():                            # the rank's own work, before it waits for its peers
            loss = model(batch).backward() ...
        all_reduce(gradients); optimizer.step()
        metrics.step(step, loss.item())
    metrics.close(finished=True)

Series (labels training_job, rank, local_rank):
  gpufleet_training_step, gpufleet_training_loss (mean of the steps since the last write; NaN stays NaN),
  gpufleet_training_step_seconds (mean wall time per step), gpufleet_training_compute_seconds (mean time inside
  compute(), when used), gpufleet_training_memory_allocated_bytes / _max_reserved_bytes{memory="cuda"|"rss"}
  (torch.cuda.memory_allocated / max_memory_reserved, or the process RSS / peak RSS without CUDA),
  gpufleet_training_last_step_timestamp_seconds, gpufleet_training_start_timestamp_seconds,
  gpufleet_training_restart_count (GPUFLEET_RESTART_COUNT from the elastic worker wrapper: every restart of the
  node's worker group, a peer's failure included; TORCHELASTIC_RESTART_COUNT without it), gpufleet_training_world_size.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import os
import re
import resource
import sys
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils.prom_textfile import MetricFamily, atomic_write, render

ENV_DIR = "GPUFLEET_TRAINING_METRICS_DIR"
ENV_JOB = "GPUFLEET_JOB"
_JOB_RE = re.compile(r"[^A-Za-z0-9_.-]")


def metrics_file(directory, job, local_rank):
    return os.path.join(directory, "gpufleet_training_%s_local%s.prom" % (_JOB_RE.sub("_", job), local_rank))


def _env_int(name, default=None):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def rss_bytes():
    """(current resident set, peak resident set) of this process in bytes. The peak is the process's own high-water
    mark (VmHWM): ru_maxrss carries over the peak of the process that forked it (torchrun's, through vfork and exec)."""
    status = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM") and value.split() and value.split()[0].isdigit():
                    status[key] = int(value.split()[0]) * 1024  # kB
    except OSError:
        pass
    peak = status.get("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return status.get("VmRSS", peak), peak


def memory_sample():
    """{"memory": "cuda"|"rss", "allocated": bytes, "max_reserved": bytes}. CUDA figures only when the script has
    imported torch and initialised CUDA (this module never imports torch itself)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        if cuda is not None and cuda.is_available() and cuda.is_initialized():
            return {"memory": "cuda", "allocated": int(cuda.memory_allocated()),
                    "max_reserved": int(cuda.max_memory_reserved())}
    except Exception:  # a broken CUDA context must not stop the training loop: fall back to RSS
        pass
    current, peak = rss_bytes()
    return {"memory": "rss", "allocated": current, "max_reserved": peak}


class TrainingMetrics:
    """Per-rank training health for the textfile collector. Never raises from step(): a full or unwritable
    directory is counted in `write_errors` (the job matters more than its metrics)."""

    def __init__(self, directory=None, job=None, rank=None, local_rank=None, world_size=None, min_interval_s=1.0,
                 clock=time.time, monotonic=time.monotonic, memory=memory_sample):
        self.directory = directory or os.environ.get(ENV_DIR) or "."
        self.job = job or os.environ.get(ENV_JOB) or os.environ.get("TORCHELASTIC_RUN_ID") or "train"
        self.rank = rank if rank is not None else _env_int("RANK", 0)
        self.local_rank = local_rank if local_rank is not None else _env_int("LOCAL_RANK", 0)
        self.world_size = world_size if world_size is not None else _env_int("WORLD_SIZE", 1)
        self.restart_count = _env_int("GPUFLEET_RESTART_COUNT", _env_int("TORCHELASTIC_RESTART_COUNT", 0))
        self.path = metrics_file(self.directory, self.job, self.local_rank)
        self.min_interval_s = float(min_interval_s)
        self._clock, self._monotonic, self._memory = clock, monotonic, memory
        self.started = clock()
        self._last_step_mono = None
        self._last_write_mono = None
        self._reset_window()
        self.last = None  # the figures of the last write
        self.writes = 0
        self.write_errors = 0
        self.last_error = None

    def _reset_window(self):
        self._n = 0
        self._loss_sum = 0.0
        self._step_s_sum = 0.0
        self._step_s_n = 0
        self._compute_s_sum = 0.0
        self._compute_n = 0

    @contextlib.contextmanager
    def compute(self):
        """Time the rank's own work (data, forward, backward before the gradient exchange): in data-parallel
        training every rank's step takes as long as the slowest, so only this shows which rank is the straggler."""
        started = self._monotonic()
        try:
            yield
        finally:
            self._compute_s_sum += self._monotonic() - started
            self._compute_n += 1

    def step(self, step, loss, step_time_s=None):
        """Record one finished step (its number and loss; step_time_s defaults to the time since the last call)."""
        now = self._monotonic()
        if step_time_s is None and self._last_step_mono is not None:
            step_time_s = now - self._last_step_mono
        self._last_step_mono = now
        self._step = step
        self._last_step_ts = self._clock()
        self._n += 1
        try:
            self._loss_sum += float(loss)
        except (TypeError, ValueError):
            self._loss_sum = float("nan")
        if step_time_s is not None:
            self._step_s_sum += step_time_s
            self._step_s_n += 1
        if self._last_write_mono is None or now - self._last_write_mono >= self.min_interval_s:
            self.flush()

    def flush(self):
        """Write the figures of the steps since the last write now; returns True when the file was replaced."""
        if not self._n:
            return False
        self._last_write_mono = self._monotonic()
        figures = {
            "step": self._step,
            "loss": self._loss_sum / self._n,
            "step_seconds": self._step_s_sum / self._step_s_n if self._step_s_n else None,
            "compute_seconds": self._compute_s_sum / self._compute_n if self._compute_n else None,
            "last_step_timestamp_seconds": self._last_step_ts,
        }
        figures.update(self._memory())
        self._reset_window()
        self.last = figures
        return self._write(render(self.families(figures)))

    def families(self, f):
        labels = {"training_job": self.job, "rank": self.rank, "local_rank": self.local_rank}
        mem = dict(labels, memory=f["memory"])
        out = [
            MetricFamily("gpufleet_training_step", "gauge", "Last training step this rank finished").add(
                f["step"], **labels),
            MetricFamily("gpufleet_training_loss", "gauge", "Mean loss of the steps since the previous write").add(
                f["loss"], **labels),
            MetricFamily("gpufleet_training_last_step_timestamp_seconds", "gauge",
                         "Unix time the rank finished its last step").add(f["last_step_timestamp_seconds"], **labels),
            MetricFamily("gpufleet_training_start_timestamp_seconds", "gauge",
                         "Unix time this worker process started").add(self.started, **labels),
            MetricFamily("gpufleet_training_memory_allocated_bytes", "gauge",
                         "torch.cuda.memory_allocated at the last write (process RSS without CUDA)").add(
                f["allocated"], **mem),
            MetricFamily("gpufleet_training_memory_max_reserved_bytes", "gauge",
                         "torch.cuda.max_memory_reserved (peak RSS without CUDA)").add(f["max_reserved"], **mem),
            MetricFamily("gpufleet_training_restart_count", "gauge",
                         "Restarts of the worker group so far, whatever their reason").add(
                self.restart_count, **labels),
            MetricFamily("gpufleet_training_world_size", "gauge", "Ranks in the job").add(self.world_size, **labels),
        ]
        if f["step_seconds"] is not None:
            out.append(MetricFamily("gpufleet_training_step_seconds", "gauge",
                                    "Mean wall time of the steps since the previous write").add(
                f["step_seconds"], **labels))
        if f["compute_seconds"] is not None:
            out.append(MetricFamily("gpufleet_training_compute_seconds", "gauge",
                                    "Mean time per step in the rank's own work (compute())").add(
                f["compute_seconds"], **labels))
        return out

    def _write(self, text):
        try:
            # No fsync: node_exporter must never read half a file (the rename), but a rank's metrics are rewritten
            # every second and worthless after a power cut; an fsync would cost the training loop milliseconds.
            atomic_write(self.path, text, sync_file=False)
        except OSError as exc:
            self.write_errors += 1
            self.last_error = "%s: %s" % (self.path, exc)
            return False
        self.writes += 1
        return True

    def close(self, finished=False):
        """Write what is pending; finished=True empties the file instead (no stale series after the job ends:
        TrainingStalled must not fire for a job that completed)."""
        if finished:
            self._reset_window()
            return self._write("")
        return self.flush()
