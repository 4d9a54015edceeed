"""postmortem.json is validated against its schema before anything is written; .md and .html render from it."""

import json

import pytest
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.postmortem import analysis, document
from helpers.job_evidence import fleet

T = 1_765_000_000.0


@pytest.fixture(scope="module")
def doc():
    ev = fleet(T=T, faults={2: {"gpu": 5}})
    ev["node02"] = {"unreachable": True, "msg": "Connection refused"}
    return document.build(analysis.analyse(ev, now=T + 30), "pm-test", created="2025-12-06T06:00:00+00:00")


def test_document_matches_the_schema_and_carries_the_contract(doc):
    assert document.validation_errors(doc) == []
    first = doc["findings"][0]
    assert set(first) == {"severity", "code", "gpu", "pci", "check", "message", "action", "evidence"}
    assert (first["code"], first["severity"], first["gpu"], first["pci"]) == ("JOB_HANG_HARDWARE", "fail", 5,
                                                                               "0000:a1:00")
    codes = [f["code"] for f in doc["findings"]]
    assert "NO_EVIDENCE" in codes and "DUMP_MISSING" in codes
    no_ev = [f for f in doc["findings"] if f["code"] == "NO_EVIDENCE"][0]
    assert no_ev["message"].startswith("node02: unreachable: Connection refused; its ranks (8,9,10,11,12,13,14,15)")
    rows = {r["rank"]: r for r in doc["ranks"]}
    assert rows[21]["role"] == "culprit" and rows[21]["host"] == "node03" and rows[21]["pci"] == "0000:a1:00"
    assert rows[9]["role"] == "no_evidence" and rows[9]["dump"] == "missing" and rows[0]["role"] == "waiting"
    assert doc["job"]["window"]["t_fire_iso"].startswith("2025-12-06T05:46:40")


def test_a_broken_document_is_refused_before_writing(doc, tmp_path):
    bad = json.loads(json.dumps(doc))
    bad["verdict"]["confidence"] = "certain"
    bad["findings"][0]["pci"] = "0000:A1:00.0"
    errors = document.validation_errors(bad)
    assert any(e.startswith("verdict/confidence") for e in errors) and any("findings/0/pci" in e for e in errors)
    with pytest.raises(document.DocumentError):
        document.write(bad, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_files_are_written_and_latest_points_at_them(doc, tmp_path):
    written = document.write(doc, tmp_path / "pm")
    run_dir = tmp_path / "pm" / "pm-test"
    assert sorted(p.name for p in run_dir.iterdir()) == ["postmortem.html", "postmortem.json", "postmortem.md"]
    assert json.loads((tmp_path / "pm" / "latest" / "postmortem.json").read_text()) == json.loads(document.to_json(doc))
    md = (run_dir / "postmortem.md").read_text()
    assert "## Verdict: HARDWARE (confidence high)" in md and "| 21 | node03 | 5 | 5 | 0000:a1:00 |" in md
    html = (run_dir / "postmortem.html").read_text()
    assert "node03 GPU 5 (PCI 0000:a1:00): XID 79 at T-40 s" in html and "<script" not in html
    assert written["latest"].endswith("latest")


def test_html_escapes_what_the_nodes_sent(doc, tmp_path):
    evil = json.loads(json.dumps(doc))
    evil["hosts"][0]["errors"] = ["<img src=x onerror=alert(1)>"]
    html = document.render_html(evil)
    assert "<img src=x" not in html and "&lt;img src=x" in html
