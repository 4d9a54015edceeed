"""The node module's verdict is the report's: computed from the same inputs (every threshold the report judges that
check with, and the node's GPU models and interconnect for NCCL), for every check and every recorded run.

On main the stages gave the modules some thresholds (NCCL one of three, never the interconnect), so the node said
fail where the report said warn."""

import ast
import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.kentino.gpufleet.plugins.filter.check_thresholds import _check_thresholds
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_nccl
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import module_fields, worst
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import THRESHOLDS
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import report
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.node_verdict import MODULE_JUDGES

REPO = Path(__file__).resolve().parents[3]
STAGES = REPO / "roles" / "gpufleet" / "tasks" / "stages"
FIXTURES = sorted((REPO / "tests" / "fixtures" / "report").glob("sim_*.json"))
# The report's checks a module's own verdict covers: an audit's health_snapshot judges its parts on the node too (in
# mode identity, as burn-ins and preflights run it, it reads no part of its own).
REPORT_CHECKS = {"health_snapshot": ("health_snapshot", "gpu_facts", "xid_facts", "gpu_sample", "checkpoint_storage",
                                     "training_env_facts")}


def test_every_judge_declares_every_threshold_it_reads():
    """THRESHOLDS of a judge is what the stage gives its module: a name the judge reads but does not declare would
    be the default on the node and the inventory's in the report."""
    for judges in MODULE_JUDGES.values():
        for judge in judges:
            tree = ast.parse(Path(judge.__file__).read_text())
            read = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in THRESHOLDS}
            assert read == set(judge.THRESHOLDS), (judge.__name__, sorted(read ^ set(judge.THRESHOLDS)))


ROLE_VARS = yaml.safe_load((STAGES.parent.parent / "vars" / "main.yml").read_text())


def _role_var(value):
    """Options given as a role variable ("{{ __gpufleet_nccl_args ... }}", vars/main.yml): that variable's value."""
    found = re.match(r"\s*\{\{\s*(\w+)", value) if isinstance(value, str) else None
    return ROLE_VARS.get(found.group(1), value) if found else value


def _stage_tasks():
    for path in sorted(STAGES.glob("*.yml")):
        for task in yaml.safe_load(path.read_text()) or []:
            for block in [task] + list(task.get("block") or []):
                for key, options in block.items():
                    if not key.startswith("kentino.gpufleet."):
                        continue
                    if key == "kentino.gpufleet.job_wait" and (options or {}).get("start"):  # started and waited for
                        key, options = options["start"]["module"], _role_var(options["start"].get("args"))
                    options = options or {}
                    if key.split(".")[-1] in MODULE_JUDGES:
                        yield path.name, key.split(".")[-1], options
                    if key == "kentino.gpufleet.dcgm_diag" and options.get("nccl_after"):  # NCCL in the dcgm job
                        yield path.name, "nccl_test", _role_var(options["nccl_after"])
                    if key == "kentino.gpufleet.gpu_burn" and options.get("sample"):  # the sampler in the burn's job
                        yield path.name, "gpu_sample", options["sample"]


def test_every_stage_gives_its_module_every_threshold_and_the_context():
    found = set()
    for stage, module, options in _stage_tasks():
        found.add(module)
        if any(j.THRESHOLDS for j in MODULE_JUDGES[module]):
            assert options.get("thresholds") == (
                "{{ hostvars[inventory_hostname] | kentino.gpufleet.check_thresholds('%s') }}" % module), (stage, module)
            own = {k for k in options if k != "thresholds" and ("gpufleet_" + k) in THRESHOLDS}
            assert not own, "%s: %s also passes thresholds one by one: %s" % (stage, module, own)
        if module == "nccl_test":
            assert "gpufleet_nvlink" in options.get("interconnect", "") and "gpufleet_gpus" in options.get("gpu_names", "")
    assert {"gpu_sample", "nccl_test", "checkpoint_storage", "training_env_facts", "train_dryrun",
            "health_snapshot"} <= found, found


def _report_verdict(node, module, result):
    checks = node["checks"]
    covers = REPORT_CHECKS.get(module, (module,)) if result.get("mode") != "identity" else (module,)
    return worst(checks[c]["verdict"] for c in covers if c in checks)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_the_recorded_node_verdicts_are_the_report_s(fixture):
    """What each module said on the node during the recorded run (the inventory of the simulated fleet) is what the
    report says about the same result."""
    data = json.loads(fixture.read_text())
    nodes = {n["host"]: n for n in report.evaluate_fleet(list(data["hosts"]), data["hosts"])}
    compared = 0
    for host, hv in data["hosts"].items():
        for key, result in hv.items():
            module = key[len("gpufleet_result_"):]
            if key.startswith("gpufleet_result_") and module in MODULE_JUDGES and "verdict" in (result or {}):
                assert result["verdict"] == _report_verdict(nodes[host], module, result), (host, module,
                                                                                           result["reasons"])
                compared += 1
    assert compared >= 20, compared


# Inventories that move every threshold the modules' judges read far enough to change a verdict somewhere.
INVENTORIES = {
    "strict": {"gpufleet_nccl_min_busbw_fraction": 0.99, "gpufleet_nccl_reference_busbw_gbps": {"H100": 2000.0},
               "gpufleet_temp_max_c": 20.0, "gpufleet_temp_sustained_s": 1.0, "gpufleet_load_util_min_pct": 1.0,
               "gpufleet_ecc_corrected_rise": 1, "gpufleet_storage_margin_pct": 100000.0,
               "gpufleet_storage_min_free_inodes": 10 ** 15, "gpufleet_storage_max_overhead_pct": 0.0001,
               "gpufleet_storage_wear_warn_pct": 1, "gpufleet_dryrun_slow_rank_factor": 1.0,
               "gpufleet_env_expected": {"GPUFLEET_SITE_VARIABLE": "1"}},
    "lenient": {"gpufleet_nccl_min_busbw_gbps": 0.1, "gpufleet_temp_max_c": 200.0, "gpufleet_load_util_min_pct": 100.0,
                "gpufleet_ecc_corrected_rise": 1000000, "gpufleet_storage_wear_warn_pct": 1000,
                "gpufleet_env_expected": {}},
}


def _module_verdict(module, result, hv):
    """The module's verdict as the stage runs it: the filter's thresholds, the stage's context options."""
    t = _check_thresholds(hv, module)
    facts = hv.get("ansible_facts") or {}
    kwargs = {}
    if module == "nccl_test":
        kwargs = {"gpu_names": [g["name"] for g in facts.get("gpufleet_gpus") or []],
                  "topology": (facts.get("gpufleet_nvlink") or ((hv.get("gpufleet_result_nvlink_facts") or {})
                                                                .get("ansible_facts") or {}).get("gpufleet_nvlink")
                               or {}).get("interconnect")}
    (judge,) = MODULE_JUDGES[module][:1]
    return module_fields(judge.judge(result, t, "node", **kwargs), result.get("not_run"))["verdict"]


@pytest.mark.parametrize("inventory", sorted(INVENTORIES))
@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_for_any_inventory_the_module_and_the_report_agree(fixture, inventory):
    data = json.loads(fixture.read_text())
    hosts = copy.deepcopy(data["hosts"])
    for hv in hosts.values():
        hv.update(INVENTORIES[inventory])
    nodes = {n["host"]: n for n in report.evaluate_fleet(list(hosts), hosts)}
    changed = 0
    for host, hv in hosts.items():
        for key, result in hv.items():
            module = key[len("gpufleet_result_"):]
            if not key.startswith("gpufleet_result_") or module not in MODULE_JUDGES or module == "health_snapshot" \
                    or "verdict" not in (result or {}):
                continue
            mine = _module_verdict(module, {k: v for k, v in result.items() if k not in ("verdict", "reasons",
                                                                                       "evidence")}, hv)
            assert mine == _report_verdict(nodes[host], module, result), (host, module, inventory)
            changed += mine != result["verdict"]
    assert changed, "the inventory changed no verdict: it proves nothing"


def test_nccl_reads_every_threshold_of_the_report():
    assert set(judge_nccl.THRESHOLDS) == {n for n in THRESHOLDS if n.startswith("gpufleet_nccl_")}
