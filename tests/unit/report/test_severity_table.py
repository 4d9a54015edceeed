"""One severity per finding code (plugins/plugin_utils/rules/codes.py): every code is declared in one CODES table, and
every finding the code makes has that severity, checked literally in the source and as judged on the recorded runs.

On main a code's severity was written in CODES and again in each finding() call, unchecked; XID_OTHER and GPU_BUSY
were "fail or warn", and a hung dry run re-used the failure codes at severity error."""

import ast
import json
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import VERDICT_ORDER
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import THRESHOLDS
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import report
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.rules import codes

REPO = Path(__file__).resolve().parents[3]
SOURCES = sorted((REPO / "plugins" / "module_utils").glob("judge_*.py")) + sorted(
    (REPO / "plugins" / "plugin_utils" / "rules").glob("*.py"))
FIXTURES = sorted((REPO / "tests" / "fixtures" / "report").glob("sim_*.json"))
MAKERS = ("finding", "add", "_storage")


def test_every_code_is_declared_once_with_one_severity():
    table = codes.table()
    for code, severity in table.items():
        if severity.startswith("gpufleet_"):
            assert THRESHOLDS[severity][1].startswith("choice:"), (code, severity)
            continue
        assert severity in VERDICT_ORDER and severity not in ("pass", "skipped"), (code, severity)


def _calls():
    for path in SOURCES:
        for call in ast.walk(ast.parse(path.read_text())):
            name = getattr(getattr(call, "func", None), "id", None) or getattr(getattr(call, "func", None), "attr", None)
            if isinstance(call, ast.Call) and name in MAKERS and len(call.args) >= 2:
                yield path.relative_to(REPO), call


def _derived_prefix(severity, code):
    """'DCGM_' for a code written 'DCGM_' + <severity>.upper(): the code follows from the severity."""
    if (isinstance(code, ast.BinOp) and isinstance(code.left, ast.Constant) and isinstance(code.right, ast.Call)
            and ast.unparse(code.right) == "%s.upper()" % ast.unparse(severity)):
        return code.left.value
    return None


def test_every_finding_written_in_the_code_has_its_table_s_severity():
    table = codes.table()
    checked, wrong = 0, []
    for where, call in _calls():
        name = getattr(call.func, "id", None) or call.func.attr
        severity, code = call.args[0], call.args[1]
        if name == "_storage":  # judge_storage's helper: the code is "STORAGE_" + severity.upper()
            severity, code = call.args[0], ast.BinOp(ast.Constant("STORAGE_"), ast.Add(),
                                                        ast.parse("%s.upper()" % ast.unparse(call.args[0])).body[0].value)
        prefix = _derived_prefix(severity, code)
        if prefix:
            derived = {c: s for c, s in table.items() if c.startswith(prefix) and c[len(prefix):].lower() in VERDICT_ORDER}
            assert derived and all(c == prefix + s.upper() for c, s in derived.items()), (where, derived)
            checked += 1
        elif isinstance(code, ast.Constant) and isinstance(code.value, str) and code.value.isupper():
            declared = table.get(code.value)
            if isinstance(severity, ast.Constant):
                ok = severity.value == declared
            else:  # a site-chosen severity: the expression reads the threshold the table names
                ok = declared is not None and declared.startswith("gpufleet_") and declared in ast.unparse(severity)
            if not ok:
                wrong.append("%s:%d %s written %s, declared %s" % (where, call.lineno, code.value,
                                                                   ast.unparse(severity), declared))
            checked += 1
        elif name in ("finding", "_storage"):
            wrong.append("%s:%d a finding whose code the table cannot check: %s" % (where, call.lineno,
                                                                                   ast.unparse(call)[:120]))
    assert not wrong, "\n".join(wrong)
    assert checked > 120, checked


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_every_finding_of_the_recorded_runs_has_its_table_s_severity(fixture):
    data = json.loads(fixture.read_text())
    nodes = report.evaluate_fleet(list(data["hosts"]), data["hosts"])
    seen = set()
    for node in nodes:
        for f in node["findings"]:
            assert f["severity"] == codes.severity_of(f["code"], node["thresholds"]), (node["host"], f)
            seen.add(f["code"])
    assert len(seen) >= 10, seen
