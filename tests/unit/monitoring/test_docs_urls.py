"""Where the alert rules' runbook_url and the units' Documentation= point: a base a site can set (the rule generators'
--docs-base-url, each role's *_docs_base_url), defaulting to the project's docs pages in its repository (galaxy.yml's
repository), and every page they name exists in docs/."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "hack"))
from generated import docs_base_url  # noqa: E402

GENERATORS = {"gen_alert_rules.py": "monitoring.md", "gen_training_alerts.py": "training.md"}
ROLE_UNITS = {"audit_timer": ["gpufleet-audit.service.j2"],
              "gpu_monitoring": ["gpufleet-xid-watcher.service.j2", "gpufleet-node-health.service.j2"],
              "elastic_training": ["gpufleet-elastic.service.j2"]}
SITE = "https://wiki.example.com/ops/gpufleet-docs"


def generate(tmp_path, script, *args):
    out = tmp_path / (script + ".yml")
    proc = subprocess.run([sys.executable, str(REPO / "hack" / script), "--output", str(out)] + list(args),
                          capture_output=True, text=True, timeout=120)
    return proc, (yaml.safe_load(out.read_text()) if out.exists() else None)


def runbook_urls(doc):
    return [rule["annotations"]["runbook_url"] for group in doc["groups"] for rule in group["rules"]
            if "alert" in rule]


def test_the_default_base_is_the_projects_docs_in_its_repository():
    repository = yaml.safe_load((REPO / "galaxy.yml").read_text())["repository"]
    assert docs_base_url() == repository + "/blob/main/docs"


@pytest.mark.parametrize("script", sorted(GENERATORS))
def test_the_generators_take_a_sites_base(tmp_path, script):
    page = GENERATORS[script]
    proc, doc = generate(tmp_path, script, "--docs-base-url", SITE + "/")
    assert proc.returncode == 0, proc.stderr
    urls = runbook_urls(doc)
    assert urls and all(u.startswith("%s/%s#" % (SITE, page)) for u in urls), urls
    text = (REPO / "docs" / page).read_text()
    for url in urls:
        assert "\n### %s\n" % next(r for r in doc["groups"][0]["rules"] if r.get("annotations", {}).get(
            "runbook_url") == url)["alert"] in text
    shipped = yaml.safe_load((REPO / "monitoring" / "prometheus" / ("gpufleet-alerts.yml" if page == "monitoring.md"
                                                                    else "gpufleet-training-alerts.yml")).read_text())
    assert all(u.startswith("%s/%s#" % (docs_base_url(), page)) for u in runbook_urls(shipped))


@pytest.mark.parametrize("script", sorted(GENERATORS))
@pytest.mark.parametrize("bad", ["https://wiki/a b", "https://wiki/%n", 'https://wiki/"x', "https://wiki/x\nfoo: 1",
                                 "ftp://wiki/x", "wiki.example.com/x"])
def test_the_generators_refuse_a_base_that_is_not_a_plain_url(tmp_path, script, bad):
    proc, doc = generate(tmp_path, script, "--docs-base-url", bad)
    assert proc.returncode == 2 and "argument --docs-base-url" in proc.stderr and doc is None, proc.stderr


@pytest.mark.parametrize("role", sorted(ROLE_UNITS))
def test_each_units_documentation_is_the_roles_base_and_a_page_that_exists(role):
    var = role + "_docs_base_url"
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    assert defaults[var] == spec["argument_specs"]["main"]["options"][var]["default"] == docs_base_url()
    for unit in ROLE_UNITS[role]:
        text = (REPO / "roles" / role / "templates" / unit).read_text()
        pages = re.findall(r"^Documentation=\{\{ %s \}\}/(\S+)$" % var, text, re.M)
        assert len(pages) == 1, "%s: Documentation= is not {{ %s }}/<page>" % (unit, var)
        assert (REPO / "docs" / pages[0]).is_file(), pages[0]


def test_no_documentation_link_is_written_out_in_roles_or_rules():
    base = docs_base_url()
    written = [str(p.relative_to(REPO)) for p in list((REPO / "roles").rglob("*.j2")) + list(
        (REPO / "roles").rglob("tasks/*.yml")) if base.split("/blob/")[0] in p.read_text()]
    assert not written, "use the role's *_docs_base_url: %s" % written
