"""A node's baselines over several burn-ins, through the history step and a real history file: the reference is the
median of its good runs, a single low figure against too few runs is noted and not flagged, a low figure that repeats
or lies beyond the runs' spread is BELOW_BASELINE.

The case that made the demo's healthy nodes WARN: a checkpoint write of 453 MB/s on a quiet machine became the whole
baseline, and 70 MB/s in a busy moment was flagged at once."""

import copy

from ansible_collections.kentino.gpufleet.plugins.plugin_utils import report
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import FILE_NAME, History
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import history as history_rules
from helpers import sample_fleet

DAY = 86400.0
HOST = "sim-node02"


class Fleet:
    def __init__(self, path):
        self.path = path
        self.data = sample_fleet.hosts()
        self.nodes = report.evaluate_fleet([HOST], {HOST: self.data[HOST]}, sample_fleet.in_play())
        self.day = 0

    def burn_in(self, write_mb_per_s=None, gflops=None, playbook="burn_in", reset=False):
        """One run of sim-node02 with these figures; returns its judged node."""
        node = copy.deepcopy(self.nodes[0])
        if write_mb_per_s is not None:
            node["checks"]["checkpoint_storage"]["figures"]["write_mb_per_s"] = write_mb_per_s
        if gflops is not None:
            for gpu in node["gpus"]:
                gpu["metrics"]["burn_gflops"] = gflops[gpu["index"]] if isinstance(gflops, dict) else gflops
        self.day += 1
        ts = 1.8e9 + self.day * DAY
        with History(self.path / FILE_NAME) as history:
            recs = history_rules.annotate([node], {HOST: self.data[HOST]}, history, ts, playbook,
                                          reset_baselines=reset)
            for rec in recs:
                rec["ts"] = ts
                for gpu in rec["gpus"]:
                    gpu["ts"] = ts
            history.record({"run_id": "%s-%02d" % (playbook, self.day), "playbook": playbook, "ts": ts,
                            "verdict": node["verdict"]}, recs)
        return node


def below(node):
    return [f for f in node["findings"] if f["code"] == "BELOW_BASELINE"]


def test_one_busy_measurement_is_not_an_alarm_a_repeated_one_is(tmp_path):
    fleet = Fleet(tmp_path)
    first = fleet.burn_in(write_mb_per_s=453.0)
    assert first["checks"]["baseline"]["figures"]["recorded"] > 0 and below(first) == []
    busy = fleet.burn_in(write_mb_per_s=70.0)  # one busy moment against a one-run baseline: noted, not flagged
    assert below(busy) == [] and busy["checks"]["baseline"]["verdict"] == "pass"
    fleet.burn_in(write_mb_per_s=440.0)
    again = fleet.burn_in(write_mb_per_s=70.0)
    assert below(again) == []  # the previous run was fine: still one low reading
    (f,) = below(fleet.burn_in(write_mb_per_s=65.0))  # low twice in a row: the node's drive really is slower
    assert f["gpu"] is None and "checkpoint write speed 65.0 MB/s is 85% below its own baseline 446.5 MB/s" in \
        f["message"] and "the median of 2 good burn-in(s) since run burn_in-01" in f["message"]
    assert "low in the previous run too" in f["message"]


def test_a_drop_beyond_the_spread_of_several_runs_is_flagged_at_once(tmp_path):
    fleet = Fleet(tmp_path)
    for gflops in (51000.0, 51200.0, 50900.0, 51100.0):
        assert below(fleet.burn_in(gflops=gflops)) == []
    slow = fleet.burn_in(gflops={0: 40800.0, 1: 51050.0, 2: 51000.0, 3: 51100.0, 4: 51000.0, 5: 50950.0,
                                 6: 51150.0, 7: 51000.0})
    (f,) = below(slow)
    assert f["gpu"] == 0 and "20% below its own baseline 51050.0 Gflop/s (the median of 4 good burn-in(s)" in \
        f["message"] and "beyond 3 times its spread" in f["message"]
    assert "runs=4" in f["evidence"][0]
    # A reset starts the baseline again from this run: the slower figure is the new reference.
    assert below(fleet.burn_in(gflops=40800.0, reset=True)) == []
    assert below(fleet.burn_in(gflops=40700.0)) == []


def test_audits_compare_and_count_for_the_repeat_but_are_no_samples(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.burn_in(write_mb_per_s=450.0)
    assert below(fleet.burn_in(write_mb_per_s=60.0, playbook="preflight")) == []
    (f,) = below(fleet.burn_in(write_mb_per_s=62.0, playbook="preflight"))
    assert "the median of 1 good burn-in(s)" in f["message"]
    with History(tmp_path / FILE_NAME, readonly=True) as history:
        base = history.baselines(HOST)[("", "storage_write_mb_per_s", "")]
    assert base["samples"] == [450.0] and base["last"] == "low" and base["run_id"] == "burn_in-01"
