"""gpufleet_metrics: the textfile a rank writes is valid exposition text (checked with prometheus_client's parser),
holds the figures of the steps since the last write, is replaced atomically and throttled, falls back to RSS without
CUDA, and never raises into the training loop."""

import math
import os

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import gpufleet_metrics as gm
from prometheus_client.parser import text_string_to_metric_families


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def parse(path):
    out = {}
    for fam in text_string_to_metric_families(open(path).read()):
        for s in fam.samples:
            out[s.name] = (s.value, s.labels)
    return out


def fake_memory(allocated=1000, max_reserved=2000, memory="cuda"):
    return lambda: {"memory": memory, "allocated": allocated, "max_reserved": max_reserved}


def make(tmp_path, clock, **kw):
    kw.setdefault("memory", fake_memory())
    return gm.TrainingMetrics(str(tmp_path), job="llm-7b", rank=3, local_rank=1, world_size=4, clock=clock,
                              monotonic=clock, **kw)


def test_first_step_writes_a_valid_file_with_every_series(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    clock = Clock()
    m = make(tmp_path, clock)
    m.step(1, 2.5)
    assert m.path == str(tmp_path / "gpufleet_training_llm-7b_local1.prom")
    got = parse(m.path)
    labels = {"training_job": "llm-7b", "rank": "3", "local_rank": "1"}
    assert got["gpufleet_training_step"] == (1, labels)
    assert got["gpufleet_training_loss"] == (2.5, labels)
    assert got["gpufleet_training_last_step_timestamp_seconds"][0] == 1000.0
    assert got["gpufleet_training_start_timestamp_seconds"][0] == 1000.0
    assert got["gpufleet_training_restart_count"][0] == 2
    assert got["gpufleet_training_world_size"][0] == 4
    assert got["gpufleet_training_memory_allocated_bytes"] == (1000, dict(labels, memory="cuda"))
    assert got["gpufleet_training_memory_max_reserved_bytes"][0] == 2000
    assert "gpufleet_training_step_seconds" not in got  # no previous step to time against
    assert "gpufleet_training_compute_seconds" not in got


def test_restart_count_is_the_wrapper_count_when_there_is_one(tmp_path, monkeypatch):
    """A restart for a peer's failure leaves TORCHELASTIC_RESTART_COUNT at 0; the worker wrapper's count has it."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("GPUFLEET_RESTART_COUNT", "1")
    m = make(tmp_path, Clock())
    m.step(1, 2.5)
    assert parse(m.path)["gpufleet_training_restart_count"][0] == 1


def test_writes_are_throttled_and_carry_the_window_means(tmp_path):
    clock = Clock()
    m = make(tmp_path, clock, min_interval_s=1.0)
    m.step(1, 4.0)
    for step, loss in ((2, 3.0), (3, 2.0), (4, 1.0)):
        clock.t += 0.3
        with m.compute():
            clock.t += 0.1
        m.step(step, loss)
    # 0.4 s per step: steps 2 and 3 wait in memory, step 4 (1.2 s after the first write) writes
    assert m.writes == 2
    got = parse(m.path)
    assert got["gpufleet_training_step"][0] == 4
    assert got["gpufleet_training_loss"][0] == pytest.approx(2.0)  # mean of 3, 2, 1
    assert got["gpufleet_training_step_seconds"][0] == pytest.approx(0.4)
    assert got["gpufleet_training_compute_seconds"][0] == pytest.approx(0.1)
    clock.t += 0.1
    m.step(5, 0.5, step_time_s=0.05)
    assert m.writes == 2 and m.flush() and parse(m.path)["gpufleet_training_step_seconds"][0] == 0.05
    assert m.flush() is False  # nothing new


def test_nan_loss_stays_nan_and_non_numbers_become_nan(tmp_path):
    clock = Clock()
    m = make(tmp_path, clock, min_interval_s=10)
    m.step(1, 1.0)
    m.step(2, float("nan"))
    m.step(3, 1.0)
    m.flush()
    assert math.isnan(parse(m.path)["gpufleet_training_loss"][0])
    assert "gpufleet_training_loss{" in open(m.path).read() and " NaN\n" in open(m.path).read()
    m.step(4, "not a number")
    m.flush()
    assert math.isnan(parse(m.path)["gpufleet_training_loss"][0])


def test_rss_fallback_without_torch(tmp_path, monkeypatch):
    monkeypatch.delitem(__import__("sys").modules, "torch", raising=False)
    sample = gm.memory_sample()
    assert sample["memory"] == "rss" and 0 < sample["allocated"] <= sample["max_reserved"] * 2
    m = gm.TrainingMetrics(str(tmp_path), job="j", rank=0, local_rank=0)
    m.step(1, 1.0)
    assert parse(m.path)["gpufleet_training_memory_allocated_bytes"][1]["memory"] == "rss"


def test_cuda_figures_come_from_torch_when_the_script_imported_it(tmp_path, monkeypatch):
    class Cuda:
        @staticmethod
        def is_available():
            return True

        @staticmethod
        def is_initialized():
            return True

        @staticmethod
        def memory_allocated():
            return 123

        @staticmethod
        def max_memory_reserved():
            return 456

    class Torch:
        cuda = Cuda

    monkeypatch.setitem(__import__("sys").modules, "torch", Torch)
    assert gm.memory_sample() == {"memory": "cuda", "allocated": 123, "max_reserved": 456}

    class Broken(Cuda):
        @staticmethod
        def memory_allocated():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    Torch.cuda = Broken
    assert gm.memory_sample()["memory"] == "rss"


def test_environment_names_the_job_ranks_and_directory(tmp_path, monkeypatch):
    for key, value in (("GPUFLEET_TRAINING_METRICS_DIR", str(tmp_path)), ("GPUFLEET_JOB", "a b/c"), ("RANK", "5"),
                       ("LOCAL_RANK", "1"), ("WORLD_SIZE", "8")):
        monkeypatch.setenv(key, value)
    m = gm.TrainingMetrics()
    m.step(7, 0.1)
    assert os.path.basename(m.path) == "gpufleet_training_a_b_c_local1.prom"
    assert parse(m.path)["gpufleet_training_step"][1] == {"training_job": "a b/c", "rank": "5", "local_rank": "1"}


def test_unwritable_directory_is_counted_never_raised(tmp_path):
    m = gm.TrainingMetrics(str(tmp_path / "missing"), job="j", rank=0, local_rank=0)
    m.step(1, 1.0)
    assert m.write_errors == 1 and "missing" in m.last_error


def test_close_finished_empties_the_file(tmp_path):
    clock = Clock()
    m = make(tmp_path, clock)
    m.step(1, 1.0)
    assert m.close(finished=True)
    assert open(m.path).read() == ""
    assert list(text_string_to_metric_families("")) == []
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
