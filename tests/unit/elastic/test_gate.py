"""The health gate on the simulated nodes (stand-in nvidia-smi, journalctl, gpu_burn in the real tools' formats): a
healthy node passes; a lost GPU, a neighbour process, a read-only checkpoint mount, unreadable tools and a drain
marker each keep the node out with the collection's own finding; bad tool output never raises."""

import os
import subprocess

import elasticlib
import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import elastic_gate


@pytest.fixture
def node(tmp_path, monkeypatch):
    """node(scenario) -> the sim state dir, with the stand-ins on PATH for this test."""
    def make(scenario):
        state = tmp_path / ("node-" + scenario)
        for key, value in elasticlib.sim_env(scenario, state).items():
            monkeypatch.setenv(key, value)
        subprocess.run([str(elasticlib.SIM_BIN / "gpufleet-sim"), "init"], check=True, capture_output=True)
        return state
    return make


def cfg(ckpt, **over):
    base = {"checkpoint_dir": str(ckpt), "checkpoint_size_gb": 0.001, "keep": 2, "timeout_s": 20}
    base.update(over)
    return base


def codes(result):
    return [f["code"] for f in result["refusing"]]


def test_healthy_node_passes_every_check(node, tmp_path):
    node("healthy_rtx5090")
    r = elastic_gate.evaluate(cfg(tmp_path), "node01")
    assert r["verdict"] == "pass" and r["findings"] == [], r["findings"]
    assert r["checks"]["gpus"] == {"gpus": 8, "lost": 0, "findings": 0}
    assert r["checks"]["xid"]["source"] == "journal"
    assert r["checks"]["storage"]["read_only"] is False


def test_lost_gpu_keeps_the_node_out_and_says_which(node, tmp_path):
    node("riser_xid79")
    burn = subprocess.run(["gpu_burn", "100"], capture_output=True, text=True, timeout=120)
    assert "GPU 3: FAULTY" in burn.stdout
    r = elastic_gate.evaluate(cfg(tmp_path), "node03")
    assert r["verdict"] == "refuse" and codes(r) == ["GPU_LOST"]
    lost = r["refusing"][0]
    assert lost["gpu"] == 3 and lost["pci"] == "0000:61:00" and "reseat the riser" in lost["action"]
    assert any("Xid" in line for line in lost["evidence"]), lost["evidence"]


def test_only_nvidia_smi_says_lost_without_the_kernel_log(node, tmp_path):
    node("riser_xid79")
    subprocess.run(["gpu_burn", "100"], capture_output=True, timeout=120)
    r = elastic_gate.evaluate(cfg(tmp_path, checks=["gpus"]), "node03")
    assert codes(r) == ["GPU_LOST"] and "nvidia-smi" in r["refusing"][0]["message"]


def test_neighbour_process_is_a_busy_gpu_refusal(node, tmp_path):
    node("neighbour_process")
    r = elastic_gate.evaluate(cfg(tmp_path, checks=["busy"]), "node07")
    assert codes(r) == ["GPU_BUSY"] and r["refusing"][0]["gpu"] == 4 and "48213" in r["refusing"][0]["message"]
    # the inventory may tolerate it (a display server): then it only warns and the node joins
    r = elastic_gate.evaluate(cfg(tmp_path, checks=["busy"], thresholds={"gpufleet_busy_gpu_severity": "warn"}),
                              "node07")
    assert r["verdict"] == "pass" and [f["code"] for f in r["findings"]] == ["GPU_BUSY"]


def test_read_only_checkpoint_mount_refuses(node, tmp_path):
    state = node("checkpoint_readonly")
    r = elastic_gate.evaluate(cfg(state / "checkpoint", checks=["storage"], mounts_file=str(state / "mounts")),
                              "node08")
    assert codes(r) and set(codes(r)) == {"STORAGE_FAIL"}
    assert any("read-only mount" in f["message"] for f in r["refusing"])


def test_full_checkpoint_storage_refuses(tmp_path):
    r = elastic_gate.evaluate(cfg(tmp_path, checks=["storage"], checkpoint_size_gb=10 ** 9), "n1")
    assert codes(r) == ["STORAGE_FAIL"] and "GB free" in r["refusing"][0]["message"]
    r = elastic_gate.evaluate(cfg(tmp_path / "missing", checks=["storage"]), "n1")
    assert codes(r) == ["STORAGE_FAIL"] and "does not exist" in r["refusing"][0]["message"]


def test_tools_that_cannot_run_refuse_as_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, journalctl or dmesg
    r = elastic_gate.evaluate(cfg(tmp_path, checks=["gpus", "xid"]), "n1")
    assert r["verdict"] == "refuse"
    assert sorted(codes(r)) == ["CHECK_ERROR", "GPU_FACTS_UNREADABLE"]
    assert all(f["severity"] == "error" for f in r["refusing"])
    # refuse_on without error: a node whose tools are missing may join (the operator's choice)
    r = elastic_gate.evaluate(cfg(tmp_path, checks=["gpus", "xid"], refuse_on=["fail"]), "n1")
    assert r["verdict"] == "pass" and len(r["findings"]) == 2


def test_garbage_nvidia_smi_output_is_an_error_not_a_crash(node, tmp_path):
    node("nvidia_smi_junk")
    r = elastic_gate.evaluate(cfg(tmp_path, checks=["gpus"]), "n1")
    assert r["verdict"] == "refuse" and set(codes(r)) <= {"GPU_FACTS_UNREADABLE", "GPU_MISSING", "GPU_LOST"}, r


def test_drain_marker_refuses_first(tmp_path):
    marker = tmp_path / "drain"
    marker.write_text("{}")
    r = elastic_gate.evaluate(cfg(tmp_path, checks=[], drain_file=str(marker)), "n1")
    assert codes(r) == ["NODE_DRAINED"] and str(marker) in r["refusing"][0]["message"]
    os.unlink(marker)
    assert elastic_gate.evaluate(cfg(tmp_path, checks=[], drain_file=str(marker)), "n1")["verdict"] == "pass"
