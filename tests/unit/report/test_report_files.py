"""report.json against its schema, the renderers (md, html, junit), atomic writes and inventory type errors."""

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import thresholds
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import (
    render_html,
    render_junit,
    render_md,
    report,
    rules,
)
from helpers import sample_fleet


@pytest.fixture(scope="module")
def doc():
    data = sample_fleet.hosts()
    nodes = report.evaluate_fleet(list(data), data, sample_fleet.in_play())
    return report.build_report(nodes, "20261129T090000Z", playbook="burn_in", started="2026-11-29T09:00:00+00:00",
                               finished="2026-11-29T10:12:00+00:00")


@pytest.fixture(scope="module")
def hosts():
    return list(sample_fleet.hosts())


# --- schema ----------------------------------------------------------------------------------------------------------

def test_fixture_report_is_valid(doc):
    assert report.validation_errors(doc) == []
    assert doc["summary"]["verdicts"] == {"pass": 2, "warn": 0, "error": 2, "fail": 5, "unreachable": 1}
    assert doc["summary"]["gate"]["failed"] is True and "sim-node01" not in doc["summary"]["gate"]["nodes"]


def _broken(doc, path, value):
    broken = json.loads(json.dumps(doc))
    target = broken
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return broken


@pytest.mark.parametrize("path,value", [
    (("schema_version",), "0.9"),
    (("run_id",), "../escape"),
    (("nodes", 0, "verdict"), "maybe"),
    (("nodes", 0, "findings", 0, "action"), ""),
    (("nodes", 0, "findings", 0, "severity"), "pass"),
    (("nodes", 0, "host"), KeyError),
    (("nodes", 1, "gpus", 0, "index"), "zero"),
    (("nodes", 1, "checks", "nccl_test", "verdict"), "unreachable"),
    (("summary", "gate", "failed"), "yes"),
    (("nodes", 0, "surprise"), 1),
], ids=lambda v: "/".join(map(str, v)) if isinstance(v, tuple) else None)
def test_broken_report_fails_validation(doc, path, value):
    broken = _broken(doc, path, value)
    assert report.validation_errors(broken)
    with pytest.raises(report.ReportError):
        report.write_report(broken, "/nonexistent-never-written")


def test_pass_node_with_findings_is_invalid(doc):
    node = next(i for i, n in enumerate(doc["nodes"]) if n["verdict"] == "fail")
    assert report.validation_errors(_broken(doc, ("nodes", node, "verdict"), "pass"))


# --- rendering ---------------------------------------------------------------------------------------------------------

def test_markdown_has_every_node_and_the_table(doc, hosts):
    md = render_md.render(doc)
    table = render_md.summary_table(doc)
    assert "| node | verdict | stage | worst finding | action |" in table
    for host in hosts:
        assert "| %s |" % host in table and "## %s:" % host in md
    assert "replace/check PSU B" in table and "Gate (fail_on=fail): FAILED" in table


def test_a_run_the_history_did_not_record_says_so_beside_the_gate_in_every_rendering(doc):
    error = ("this run is NOT recorded: history /srv/h/gpufleet-history.sqlite3: is damaged (PRAGMA quick_check: "
             "Page 38: btreeInitPage() returns error code 11); restore it from a backup")
    broken = dict(json.loads(json.dumps(doc)), history={"enabled": True, "path": "/srv/h/gpufleet-history.sqlite3",
                                                          "error": error, "recorded": False})
    report.validate_report(broken)
    assert "History: " + error in render_md.summary_table(broken).splitlines()
    assert "History: " + error in render_md.render(broken)
    assert 'id="history-error"' in render_html.render(broken) and "is damaged (PRAGMA quick_check" in \
        render_html.render(broken)
    assert "History:" not in render_md.summary_table(doc) and 'id="history-error"' not in render_html.render(doc)


def test_html_is_self_contained_and_has_every_node(doc, hosts):
    html = render_html.render(doc)
    for host in hosts:
        assert 'data-host="%s"' % host in html
    assert 'id="fleet-overview"' in html and "<svg" in html and "XID timeline" in html
    lowered = html.lower()
    for external in ('src="http', "src='http", 'href="http', "@import", "url(http", "<link ", 'src="//'):
        assert external not in lowered, external
    assert "<script src" not in lowered


def test_html_escapes_data(doc):
    evil = json.loads(json.dumps(doc))
    evil["nodes"][0]["findings"][0]["message"] = "<script>alert(1)</script>"
    evil["nodes"][0]["host"] = "<b>x</b>"
    html = render_html.render(evil)
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html and "<b>x</b>" not in html


def test_junit_parses_and_has_a_case_per_node_and_check(doc, hosts):
    root = ET.fromstring(render_junit.render(doc).encode())
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert sorted(suites) == sorted(hosts)
    ok = suites["sim-node02"]
    names = {c.get("name") for c in ok.iter("testcase")}
    assert {"gpu_burn", "dcgm_diag", "nccl_test", "checkpoint_storage", "gpu_sample", "xid_facts"} <= names
    assert not list(ok.iter("failure")) and not list(ok.iter("error"))
    assert float(ok.get("time")) > 0 and all(c.get("time") is not None for c in ok.iter("testcase"))
    psu = suites["sim-node04"]
    failures = [f for f in psu.iter("failure")]
    assert failures and any("PSU_RAIL_LOSS" in (f.text or "") and "NVRM: Xid" in (f.text or "") for f in failures)
    down = suites["sim-node09"]
    assert any(c.get("name") == "reachability" and c.find("error") is not None for c in down.iter("testcase"))
    assert int(root.get("tests")) == sum(int(s.get("tests")) for s in suites.values())
    assert int(root.get("failures")) >= 5 and float(root.get("time")) > 0


def test_junit_warn_fails_only_with_fail_on_warn(doc):
    def warn_case(d):
        return [c for s in ET.fromstring(render_junit.render(d).encode()).iter("testsuite")
                if s.get("name") == "sim-node05" for c in s.iter("testcase")
                if c.get("name") == "gpu_sample" and c.find("failure") is not None]

    assert warn_case(doc) == []
    assert warn_case(dict(doc, fail_on="warn"))


# --- atomic writes -----------------------------------------------------------------------------------------------------

def test_write_report_creates_files_and_latest(doc, tmp_path):
    out = report.write_report(doc, tmp_path)
    run = tmp_path / doc["run_id"]
    assert sorted(p.name for p in run.iterdir()) == ["junit.xml", "report.html", "report.json", "report.md"]
    assert os.readlink(tmp_path / "latest") == doc["run_id"]
    assert json.loads((run / "report.json").read_text()) == json.loads(json.dumps(doc))
    assert out["files"]["report.html"] == str(run / "report.html")


def test_interrupted_write_leaves_previous_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    report.write_atomic(target, "previous\n")
    real_replace = os.replace

    def crash(src, dst):
        assert Path(src).read_bytes() == b"new and complete\n", "the temp file is complete before the rename"
        raise OSError("simulated power cut between temp write and replace")

    monkeypatch.setattr(report.os, "replace", crash)
    with pytest.raises(OSError):
        report.write_atomic(target, "new and complete\n")
    monkeypatch.setattr(report.os, "replace", real_replace)
    assert target.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"], "the temp file is cleaned up"


def test_interrupted_run_keeps_latest_on_the_previous_run(doc, tmp_path, monkeypatch):
    report.write_report(doc, tmp_path)
    second = dict(doc, run_id="second-run")
    calls = []

    def crash_on_json(path, text):
        calls.append(Path(path).name)
        if Path(path).name == "report.json":
            raise OSError("disk full")
        return original(path, text)

    original = report.write_atomic
    monkeypatch.setattr(report, "write_atomic", crash_on_json)
    with pytest.raises(OSError):
        report.write_report(second, tmp_path)
    assert os.readlink(tmp_path / "latest") == doc["run_id"]
    assert (tmp_path / doc["run_id"] / "report.json").is_file()
    assert calls[-1] == "report.json"


def test_latest_link_swap_is_atomic_replace(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    report.swap_link(tmp_path / "latest", "a")
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(report.os, "replace", lambda s, d: (seen.append((os.readlink(s), d)), real_replace(s, d)))
    report.swap_link(tmp_path / "latest", "b")
    assert seen == [("b", str(tmp_path / "latest"))] and os.readlink(tmp_path / "latest") == "b"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_bad_run_id_and_fail_on_are_refused(doc):
    with pytest.raises(report.ReportError, match="run_id"):
        report.build_report(doc["nodes"], "../../etc")
    with pytest.raises(report.ReportError, match="fail_on"):
        report.build_report(doc["nodes"], "ok", fail_on="sometimes")


# --- inventory type errors ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,value,expected", [
    ("gpufleet_temp_max_c", "85C", "a number"),
    ("gpufleet_temp_max_c", True, "a number"),
    ("gpufleet_nccl_min_busbw_gbps", "400GB/s", "a number"),
    ("gpufleet_nccl_min_busbw_fraction", 70, "in (0, 1]"),
    ("gpufleet_psu_rails", {"A": "0-3"}, "a mapping of rail name to a list of GPU indices"),
    ("gpufleet_rma_xids", "48,63", "a list of integers"),
    ("gpufleet_expected_gpus", 7.5, "an integer"),
    ("gpufleet_busy_gpu_severity", "page", "one of warn, fail"),
    ("gpufleet_nccl_reference_busbw_gbps", {"RTX 5090": "fast"}, "a mapping of GPU name to GB/s"),
])
def test_inventory_type_error_names_host_variable_and_type(name, value, expected):
    values, _sources, errors = thresholds.resolve({name: value}, "gpu-07")
    assert len(errors) == 1
    assert "gpu-07" in errors[0] and name in errors[0] and expected in errors[0] and repr(value) in errors[0]
    assert values[name] == thresholds.DEFAULTS[name], "a bad value keeps the default"
    node = rules.evaluate_node("gpu-07", {name: value, "gpufleet_stage": "done"})
    assert node["verdict"] == "error" and node["findings"][0]["code"] == "CONFIG_INVALID"


def test_valid_overrides_are_used_and_sourced():
    values, sources, errors = thresholds.resolve({"gpufleet_temp_max_c": 80, "gpufleet_expected_gpus": "8",
                                                  "gpufleet_psu_rails": {"A": [0, 1], "B": [2, 3]}}, "gpu-07")
    assert errors == [] and values["gpufleet_temp_max_c"] == 80.0 and values["gpufleet_expected_gpus"] == 8
    assert sources["gpufleet_temp_max_c"] == "inventory gpufleet_temp_max_c"
    assert sources["gpufleet_temp_sustained_s"] == "default"


def test_every_threshold_is_documented():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "rules.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in doc.splitlines() if line.startswith("| `gpufleet_")}
    for name, (default, _kind, _meaning, _source) in thresholds.THRESHOLDS.items():
        assert "`%s`" % name in rows, name
        assert "`%s`" % json.dumps(default) in rows["`%s`" % name], "docs/rules.md default of %s" % name
