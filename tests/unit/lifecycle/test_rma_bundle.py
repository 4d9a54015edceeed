"""The RMA evidence bundle on a simulated node (nvidia-bug-report.sh, nvidia-smi and dcgmi stand-ins in the real
tools' formats): every file listed in a manifest that matches its JSON Schema with the right sha256, secrets planted
where the bug report reads (kernel command line, os-release) never reach it, and the size stays bounded."""

import gzip
import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path

import jsonschema
from helpers.module_runner import run_module

REPO = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((REPO / "plugins" / "plugin_utils" / "schemas" / "rma_manifest.json").read_text())
SECRETS = ("Sup3rS3cret!", "tok-8f7e6d5c4b3a", "MIIEowIBAAKCAQEA", "AKIAIOSFODNN7EXAMPLE", "hunter2")


def _node(tmp_path):
    state = tmp_path / "node"
    env = {"GPUFLEET_SIM_SCENARIO": "ecc_leak", "GPUFLEET_SIM_STATE": str(state), "GPUFLEET_SIM_TIME_SCALE": "0.001",
           "GPUFLEET_SIM_NODE": "sim-node07"}
    # the simulator starts a node's state from scratch on its first command: plant after it
    subprocess.run([str(REPO / "sim" / "bin" / "nvidia-smi"), "-L"], env=dict(os.environ, **env), check=True,
                   capture_output=True)
    planted = state / "bug_report"
    (planted / "proc").mkdir(parents=True, exist_ok=True)
    (planted / "etc").mkdir(exist_ok=True)
    (planted / "proc" / "cmdline").write_text("BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 ipmi.password=Sup3rS3cret! "
                                              "url=https://admin:hunter2@bmc.example/redfish\n")
    (planted / "etc" / "os-release").write_text('NAME="Debian GNU/Linux"\nAPI_TOKEN="tok-8f7e6d5c4b3a"\n'
                                                "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE\n-----BEGIN RSA PRIVATE KEY-----"
                                                "\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\n")
    return env


def _contents(bundle, entry):
    data = (bundle / entry["name"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"]
    return (gzip.decompress(data) if entry["name"].endswith(".gz") else data).decode()


def test_the_bundle_has_every_file_in_its_manifest_and_no_secret(tmp_path):
    result = run_module("rma_bundle", {"dest": str(tmp_path / "rma"), "dcgm_level": 1}, env=_node(tmp_path),
                        path_prepend=[REPO / "sim" / "bin"])
    assert not result.get("failed"), result
    bundle = Path(result["bundle"])
    assert oct(os.stat(bundle).st_mode)[-3:] == "700"
    manifest = json.loads((bundle / "manifest.json").read_text())
    jsonschema.validate(manifest, SCHEMA)
    names = [f["name"] for f in manifest["files"]]
    assert names == ["dcgmi-diag.json", "identity.json", "nvidia-bug-report.log.gz", "nvidia-smi-q.xml"]
    assert sorted(p.name for p in bundle.iterdir()) == sorted(names + ["manifest.json"])
    texts = {f["name"]: _contents(bundle, f) for f in manifest["files"]}
    for secret in SECRETS:
        assert not any(secret in t for t in texts.values()), secret
    report = texts["nvidia-bug-report.log.gz"]
    assert "Start of NVIDIA bug report log file." in report and "ipmi.password=REDACTED" in report
    assert next(f for f in manifest["files"] if f["name"] == "nvidia-bug-report.log.gz")["secrets_redacted"] >= 5
    identity = json.loads(texts["identity.json"])
    assert "GPU-" in identity["gpus_csv"] and identity["host"] and "dmi" in identity
    assert json.loads(texts["dcgmi-diag.json"])


def test_the_bundle_is_bounded_and_says_what_it_cut_or_could_not_collect(tmp_path):
    result = run_module("rma_bundle", {"dest": str(tmp_path / "rma"), "dcgm_level": 0, "max_bytes": 16384},
                        env=_node(tmp_path), path_prepend=[REPO / "sim" / "bin"])
    bundle = Path(result["bundle"])
    manifest = result["manifest"]
    assert sum(f["bytes"] for f in manifest["files"]) <= 16384
    cut = next(f for f in manifest["files"] if f["name"] == "nvidia-bug-report.log.gz")
    assert cut["cut_bytes"] > 0 and "bytes cut from the middle" in _contents(bundle, cut)
    assert manifest["skipped"] == [{"name": "dcgmi-diag.json", "reason": "not asked (dcgm_level=0)"}]


def test_check_mode_writes_nothing_and_a_bad_dest_is_refused(tmp_path):
    result = run_module("rma_bundle", {"dest": str(tmp_path / "rma")}, env=_node(tmp_path), check_mode=True,
                        path_prepend=[REPO / "sim" / "bin"])
    assert not (tmp_path / "rma").exists() and result["planned"][0][-2:] == ["--output-file",
                                                                            "<tmp>/nvidia-bug-report.log"]
    result = run_module("rma_bundle", {"dest": "relative/dir\n"}, env=_node(tmp_path))
    assert result["failed"] and "absolute path" in result["msg"]


def test_the_controller_adds_the_nodes_xid_ecc_and_remap_history_to_the_manifest(tmp_path):
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import rma
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.lifecycle import transition
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import FILE_NAME, History

    result = run_module("rma_bundle", {"dest": str(tmp_path / "rma"), "dcgm_level": 0, "bug_report": False},
                        env=_node(tmp_path), path_prepend=[REPO / "sim" / "bin"])
    with History(tmp_path / FILE_NAME) as h:
        h.record({"run_id": "a1", "playbook": "audit", "ts": 1.8e9, "verdict": "fail"}, [{
            "host": "n1", "ts": 1.8e9, "verdict": "fail", "reachable": 1,
            "gpus": [{"pci": "0000:07:00", "idx": 2, "uuid": "GPU-2", "ts": 1.8e9, "verdict": "fail",
                      "ecc_corr_agg": 48211, "remap_corr": 508, "remap_pending": 1}],
            "xids": [{"pci": "0000:07:00", "xid": 63, "ts": 1.8e9, "severity": "warning", "digest": "x63"}]}])
        transition(h, "n1", "quarantined", "XID 63", "audit", code="XID_CRITICAL", gpu="2", now=1.8e9)
    manifest = rma.add_history(result["bundle"], tmp_path / FILE_NAME, "n1")
    jsonschema.validate(manifest, SCHEMA)
    entry = next(f for f in manifest["files"] if f["name"] == "history.json")
    doc = json.loads(_contents(Path(result["bundle"]), entry))
    assert doc["xid_events"][0]["xid"] == 63 and doc["gpus"][0]["readings"][0]["remap_pending"] == 1
    assert doc["lifecycle"][0]["to_state"] == "quarantined"


def test_the_bundle_is_named_after_the_inventory_name_not_the_machines_hostname(tmp_path):
    # The inventory name identifies the node in the report, the history and the fetched path; the machine's own
    # hostname (here this test machine's) is kept as evidence in identity.json only.
    result = run_module("rma_bundle", {"dest": str(tmp_path / "rma"), "dcgm_level": 0, "bug_report": False,
                                       "host": "gpu-rack3-07"}, env=_node(tmp_path),
                        path_prepend=[REPO / "sim" / "bin"])
    assert not result.get("failed"), result
    bundle = Path(result["bundle"])
    assert bundle.name.startswith("gpufleet-rma-gpu-rack3-07-"), bundle.name
    assert result["manifest"]["host"] == "gpu-rack3-07"
    identity = json.loads((bundle / "identity.json").read_text())
    assert identity["host"] == "gpu-rack3-07" and identity["hostname"] == socket.gethostname()
    result = run_module("rma_bundle", {"dest": str(tmp_path / "rma"), "host": "../gpu07\n"}, env=_node(tmp_path))
    assert result["failed"] and "host" in result["msg"] and not list((tmp_path / "rma").glob("*gpu07*"))
