"""The training alert rules (monitoring/prometheus/gpufleet-training-alerts.yml): generated (--check), valid for
promtool, with a runbook section each; and each fires on series recorded from the helper's REAL output.

A real training job (tests/fixtures/elastic/toy_train.py under the real torchrun, CPU gloo, 2 ranks) writes its
gpufleet_metrics textfiles; a scraper reads them every PERIOD seconds as node_exporter would. The recording is
replayed to `promtool test rules` on a compressed time axis: one scrape = one minute, so the rules' minute-scale
windows see a few seconds of training; timestamps and durations in the values are mapped onto the same axis.
- a rank keeping tensors in a list fires TrainingMemoryLeak; a NaN loss TrainingLossNaN; a constant learning rate of
  0 TrainingLossPlateau;
- a rank that sleeps in its own work fires TrainingStraggler (rank 1 only), then, when it stops, TrainingStalled for
  every rank (the others wait for it in the all-reduce);
- a healthy run fires nothing; the elastic launcher's state and restart series fire TrainingRestarting,
  TrainingNodeRefused and TrainingOutOfRestarts.
"""

import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time

import elasticlib
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

REPO = elasticlib.REPO
RULES = REPO / "monitoring" / "prometheus" / "gpufleet-training-alerts.yml"
GEN = REPO / "hack" / "gen_training_alerts.py"
TOY = REPO / "tests" / "fixtures" / "elastic" / "toy_train.py"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: apt-get install prometheus")
needs_torch = pytest.mark.skipif(not elasticlib.TORCHRUN.exists(), reason=".venv-torch absent: make torch-venv")
ALERTS = ("TrainingLossNaN", "TrainingLossPlateau", "TrainingMemoryLeak", "TrainingStalled", "TrainingStraggler",
          "TrainingRestarting", "TrainingNodeRefused", "TrainingOutOfRestarts")
NODE = {"instance": "n1:9100", "job": "gpufleet-node"}
PERIOD = 0.1  # real seconds between scrapes of the recording


def test_the_shipped_rules_are_generated():
    res = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_drifted_file_is_caught(tmp_path):
    out = tmp_path / "rules.yml"
    assert subprocess.run([sys.executable, str(GEN), "--output", str(out)]).returncode == 0
    out.write_text(out.read_text().replace("> 0\n", "> 1\n"))
    assert subprocess.run([sys.executable, str(GEN), "--check", "--output", str(out)]).returncode == 1


@needs_promtool
def test_promtool_check_rules_and_every_alert_has_a_runbook_section():
    res = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert res.returncode == 0 and "SUCCESS: 8 rules found" in res.stdout, res.stdout + res.stderr
    doc = yaml.safe_load(RULES.read_text())
    training_md = (REPO / "docs" / "training.md").read_text()
    names = []
    for rule in doc["groups"][0]["rules"]:
        names.append(rule["alert"])
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["runbook_url"].endswith("docs/training.md#" + rule["alert"].lower())
        assert "\n### %s\n" % rule["alert"] in training_md, "docs/training.md has no section for %s" % rule["alert"]
    assert tuple(names) == ALERTS


# ---- recording real metrics ---------------------------------------------------------------------------------------
class Recording:
    def __init__(self, scrapes, log):
        self.scrapes = scrapes  # [(real time, {(name, labels tuple): value})]
        self.log = log  # toy_train step lines
        self.times = [t for t, _ in scrapes]
        self.t0 = self.times[0]
        self.scale = 60.0 * (len(self.times) - 1) / (self.times[-1] - self.t0)

    def minute(self, real_t):
        """Promtool seconds of a real time: linear between the scrapes around it."""
        times = self.times
        if real_t <= times[0]:
            return (real_t - times[0]) * self.scale
        for i in range(len(times) - 1):
            if real_t < times[i + 1]:
                return 60.0 * (i + (real_t - times[i]) / (times[i + 1] - times[i]))
        return 60.0 * (len(times) - 1) + (real_t - times[-1]) * self.scale

    def value(self, name, v):
        if name.endswith("_timestamp_seconds"):
            return self.minute(v)
        if name in ("gpufleet_training_step_seconds", "gpufleet_training_compute_seconds"):
            return v * self.scale
        return v

    def input_series(self):
        keys = sorted({k for _t, sample in self.scrapes for k in sample})
        out = []
        for name, labels in keys:
            values = []
            for _t, sample in self.scrapes:
                v = sample.get((name, labels))
                if v is None:
                    values.append("_")
                elif math.isnan(v):
                    values.append("NaN")
                else:
                    values.append(repr(round(self.value(name, v), 6)))
            full = dict(NODE, **dict(labels))
            out.append({"series": "%s{%s}" % (name, ",".join('%s="%s"' % kv for kv in sorted(full.items()))),
                        "values": " ".join(values)})
        return out


def record(tmp_path, args, scrapes=120, stop_when=None, period=PERIOD):
    tree = elasticlib.install_tree(tmp_path / "tree")
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    env = dict(os.environ, GPUFLEET_TRAINING_METRICS_DIR=str(metrics), GPUFLEET_JOB="toy",
               GPUFLEET_CHECKPOINT_DIR=str(tmp_path / "ckpt"), TOY_LOG=str(tmp_path / "steps.jsonl"),
               OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(tree / "python"), str(tree / "lib")]))
    proc = subprocess.Popen([str(elasticlib.TORCHRUN), "--standalone", "--nproc-per-node=2", str(TOY),
                             "--steps", "100000", "--ckpt-every", "100000", "--metrics-interval", "0.02"] + args,
                            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "torchrun.log", "w"),
                            start_new_session=True)
    try:
        elasticlib.wait_for(lambda: len(list(metrics.glob("*.prom"))) == 2, 120, "both ranks' metric files",
                            diagnose=lambda: (tmp_path / "torchrun.log").read_text()[-3000:])
        out = []
        next_t = time.time()
        while len(out) < scrapes:
            sample = {}
            for path in metrics.glob("*.prom"):
                for fam in text_string_to_metric_families(path.read_text()):
                    for s in fam.samples:
                        sample[(s.name, tuple(sorted(s.labels.items())))] = s.value
            out.append((time.time(), sample))
            next_t += period
            time.sleep(max(0.0, next_t - time.time()))
    finally:
        elasticlib.kill_tree(proc.pid)
        proc.wait(30)
    log = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines() if line.strip()]
    return Recording(out, log)


def rules_for_test(tmp_path):
    """The shipped rules with a 1m scrape interval (the compressed axis) and without annotations (the tests compare
    labels; the annotation templates are checked by promtool check rules)."""
    path = tmp_path / "rules.yml"
    subprocess.run([sys.executable, str(GEN), "--scrape-interval", "1m", "--output", str(path)], check=True)
    doc = yaml.safe_load(path.read_text())
    for rule in doc["groups"][0]["rules"]:
        rule.pop("annotations")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def promtool(tmp_path, inputs, checks):
    spec = {"rule_files": [str(rules_for_test(tmp_path))], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": checks}]}
    path = tmp_path / "tests.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, width=1 << 20))
    res = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]


def labels(rank, severity, **extra):
    return dict(NODE, training_job="toy", rank=str(rank), local_rank=str(rank), severity=severity, **extra)


def fires(name, minute, *labelsets):
    return {"eval_time": "%dm" % minute, "alertname": name, "exp_alerts": [{"exp_labels": ls} for ls in labelsets]}


def silent(name, minute):
    return {"eval_time": "%dm" % minute, "alertname": name, "exp_alerts": []}


@pytest.mark.slow
@needs_promtool
@needs_torch
def test_healthy_run_fires_nothing(tmp_path):
    rec = record(tmp_path, ["--lr", "0.0005", "--momentum", "0", "--step-sleep", "0.02"])
    steps = [s for s in rec.log if s["rank"] == 0]
    assert all(s["restart"] == 0 for s in steps)
    # It trained all through the recording: steps in each quarter of it (a count of steps would depend on load).
    quarters = [rec.t0 + (rec.times[-1] - rec.t0) * q / 4 for q in range(5)]
    per_quarter = [sum(1 for s in steps if lo <= s["t"] < hi) for lo, hi in itertools.pairwise(quarters)]
    assert all(n >= 3 for n in per_quarter), per_quarter
    promtool(tmp_path, rec.input_series(), [silent(name, minute) for name in ALERTS for minute in (30, 60, 90, 118)])


@pytest.mark.slow
@needs_promtool
@needs_torch
def test_leaking_rank_fires_memory_leak(tmp_path):
    rec = record(tmp_path, ["--leak-mb", "2", "--step-sleep", "0.02", "--lr", "0.0005", "--momentum", "0"],
                 scrapes=80)
    promtool(tmp_path, rec.input_series(), [
        silent("TrainingMemoryLeak", 25),  # not yet 30 minutes of history to compare with
        fires("TrainingMemoryLeak", 78, labels(0, "warning", memory="rss"), labels(1, "warning", memory="rss")),
        silent("TrainingStalled", 78), silent("TrainingStraggler", 78)])


@pytest.mark.slow
@needs_promtool
@needs_torch
def test_sleeping_rank_fires_straggler_then_stalled(tmp_path):
    rec = record(tmp_path, ["--straggler-rank", "1", "--straggler-s", "0.05", "--stall-rank", "1", "--stall-at", "60",
                            "--stall-s", "600", "--step-sleep", "0.02"], scrapes=90)
    stalled_at = max(s["t"] for s in rec.log)  # the last step any rank finished
    stall_m = rec.minute(stalled_at) / 60.0
    assert 15 <= stall_m <= 70, "the stall should start mid-recording (minute %.1f)" % stall_m
    # Stalled: 10x the median step time (about 40 s per step here) and at least 3 scrape intervals
    promtool(tmp_path, rec.input_series(), [
        silent("TrainingStraggler", 3),
        fires("TrainingStraggler", int(stall_m) - 1, labels(1, "warning")),
        silent("TrainingStalled", int(stall_m) - 1),
        fires("TrainingStalled", int(stall_m) + 14, labels(0, "critical"), labels(1, "critical")),
    ])


@pytest.mark.slow
@needs_promtool
@needs_torch
def test_nan_loss_and_plateau(tmp_path):
    rec = record(tmp_path / "nan", ["--nan-at", "40", "--step-sleep", "0.02"], scrapes=40)
    nan_m = rec.minute(min(s["t"] for s in rec.log if s["step"] == 40)) / 60.0
    promtool(tmp_path / "nan", rec.input_series(), [
        silent("TrainingLossNaN", max(int(nan_m) - 2, 0)),
        fires("TrainingLossNaN", 38, labels(0, "critical"), labels(1, "critical"))])
    # A flat loss for real: no learning and the same batch every step (32 batches in turn made the minimum of the
    # last hour dip below the earlier one in some runs). The rule also wants 100 steps in its hour: 60 scrapes.
    flat = record(tmp_path / "flat", ["--lr", "0", "--same-batch", "--step-sleep", "0.01"], scrapes=130, period=0.2)
    last_hour = [s["step"] for s in flat.log if s["rank"] == 0 and flat.minute(s["t"]) >= 60.0 * 68]
    assert len(last_hour) >= 100, "the machine ran %d steps in the plateau's last hour (60 scrapes of 0.2 s): " \
                                  "the rule needs 100" % len(last_hour)
    promtool(tmp_path / "flat", flat.input_series(), [
        silent("TrainingLossPlateau", 50),  # no hour before the window yet
        fires("TrainingLossPlateau", 128, {"training_job": "toy", "severity": "warning"})])


@needs_promtool
def test_restarts_and_launcher_states(tmp_path):
    """The series the helper (restart_count from TORCHELASTIC_RESTART_COUNT) and the launcher (state, attempt) write,
    in their exact label shapes (tests/unit/elastic/test_metrics.py, test_launcher.py)."""
    rank = dict(NODE, training_job="toy", rank="0", local_rank="0")
    job = dict(NODE, training_job="toy")

    def series(name, lab, values):
        return {"series": "%s{%s}" % (name, ",".join('%s="%s"' % kv for kv in sorted(lab.items()))), "values": values}

    inputs = [series("gpufleet_training_restart_count", rank, "0x20 1x40"),
              series("gpufleet_elastic_attempt", job, "1x60"),
              series("gpufleet_elastic_state", dict(job, state="running"), "1x20 0x40"),
              series("gpufleet_elastic_state", dict(job, state="refused"), "0x20 1x10 0x30"),
              series("gpufleet_elastic_state", dict(job, state="out_of_restarts"), "0x40 1x20")]
    restarting = {"instance": NODE["instance"], "training_job": "toy", "severity": "warning"}
    promtool(tmp_path, inputs, [
        silent("TrainingRestarting", 15), fires("TrainingRestarting", 25, restarting),
        fires("TrainingRestarting", 49, restarting), silent("TrainingRestarting", 55),  # 30 min after the restart
        silent("TrainingNodeRefused", 15),
        fires("TrainingNodeRefused", 25, dict(job, state="refused", severity="warning")),
        silent("TrainingOutOfRestarts", 25),
        fires("TrainingOutOfRestarts", 45, dict(job, state="out_of_restarts", severity="critical"))])


@needs_promtool
def test_memory_leak_waits_for_the_warm_up(tmp_path):
    """Memory grows from the first minute (allocator and caches filling up look the same): the rule waits until the
    worker is warm-up (10m) plus four leak windows (40m) old, and a flat series never fires."""
    rank = dict(NODE, training_job="toy", rank="0", local_rank="0")
    mem = dict(rank, memory="cuda")

    def series(name, lab, values):
        return {"series": "%s{%s}" % (name, ",".join('%s="%s"' % kv for kv in sorted(lab.items()))), "values": values}

    grows = [series("gpufleet_training_memory_allocated_bytes", mem, "1000000000+20000000x90"),
             series("gpufleet_training_start_timestamp_seconds", rank, "0x90")]
    promtool(tmp_path / "grows", grows, [silent("TrainingMemoryLeak", 49),
                                         fires("TrainingMemoryLeak", 51, labels(0, "warning", memory="cuda"))])
    flat = [series("gpufleet_training_memory_allocated_bytes", mem, "1000000000 1010000000 " * 45),
            series("gpufleet_training_start_timestamp_seconds", rank, "0x90")]
    promtool(tmp_path / "flat", flat, [silent("TrainingMemoryLeak", m) for m in (51, 70, 89)])
