"""No input makes an nvidia-smi parser raise: random text, bytes and mutated fixtures go in, a dict comes out."""

import math
import re
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils import nvidia_smi as n
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import FACTS_SPEC
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia_smi"
SEEDS = [(FIXTURES / name).read_text() for name in ("h100/q.txt", "csv/na_spellings.csv", "h100/compute_apps.csv")]
FIELDS = [candidates[0] for _key, candidates in FACTS_SPEC]
# Pieces of the real formats, so the fuzzer reaches deep branches rather than only "unparsed".
ALPHABET = st.sampled_from([
    ", ", ",", "\n", "\r", "    ", " : ", ":", "[N/A]", "N/A", "[Unknown Error]", "[GPU is lost]", "0x", "0x44", "00000000:C1:00.0",
    "GPU ", "GPU 00000000:18:00.0\n", "Clocks Event Reasons\n", "        Idle : Active\n", "Remapped Rows : N/A\n",
    '"pci.bus_id" or "gpu_bus_id"\n', 'Field "x" is not a valid field to query.', "Unable to determine the device handle for GPU",
    "GPU is lost", "Yes", "No", "Enabled", "16x", "-1", "1e9", "9" * 30, "\x00", "\t", "é", "index, pci.bus_id\n",
])
TEXT = st.one_of(st.text(), st.lists(ALPHABET, max_size=60).map("".join))
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_shape(result, *keys):
    assert isinstance(result, dict)
    for key in keys:
        assert key in result


@SETTINGS
@given(TEXT, st.one_of(st.none(), st.lists(st.sampled_from(FIELDS + ["name", "process_name"]), max_size=8)))
def test_query_gpu_never_raises(text, fields):
    result = n.parse_query_gpu(text, fields)
    _check_shape(result, "gpus", "problems", "unparsed", "rejected_fields")
    assert result["problems"] == [] or all(p["kind"] != "parser_error" for p in result["problems"])


@SETTINGS
@given(TEXT)
def test_compute_apps_never_raises(text):
    result = n.parse_compute_apps(text)
    _check_shape(result, "processes", "problems", "unparsed")
    assert all(p["kind"] != "parser_error" for p in result["problems"])


@SETTINGS
@given(TEXT)
def test_q_never_raises(text):
    result = n.parse_q(text)
    _check_shape(result, "gpus", "problems", "unparsed", "driver_version")
    assert all(p["kind"] != "parser_error" for p in result["problems"])


@SETTINGS
@given(st.binary(max_size=400))
def test_bytes_never_raise(data):
    for result in (n.parse_query_gpu(data), n.parse_compute_apps(data), n.parse_q(data),
                   n.parse_help_query_gpu(data), n.parse_tool_messages(data)):
        assert isinstance(result, dict)


@SETTINGS
@given(TEXT)
def test_help_and_messages_never_raise(text):
    assert isinstance(n.parse_help_query_gpu(text)["fields"], list)
    assert isinstance(n.parse_tool_messages(text)["problems"], list)


@SETTINGS
@given(st.data())
def test_mutated_fixture_never_raises(data):
    text = data.draw(st.sampled_from(SEEDS))
    cut = data.draw(st.integers(0, len(text)))
    junk = data.draw(TEXT)
    mutated = text[:cut] + junk + text[cut + data.draw(st.integers(0, 50)):]
    for result in (n.parse_query_gpu(mutated), n.parse_q(mutated), n.parse_compute_apps(mutated)):
        assert all(p["kind"] != "parser_error" for p in result["problems"])


NUMERIC_FIELDS = sorted(name for name, kind in n.FIELD_KINDS.items() if kind in ("int", "float") and name != "index")
WHOLE = re.compile(r"\s*([0-9]+)(?:\.([0-9]+))?\s*(\S*)\s*")
CELLS = st.one_of(
    st.integers(-10 ** 20, 10 ** 20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.tuples(st.integers(0, 10 ** 6), st.sampled_from(n.NUMBER_UNITS + ("", " "))).map(lambda t: "%d %s" % t),
    st.text(alphabet="0123456789.-+eExXabf _%MiBW/\u0663\u00b2", max_size=12),
    st.text(max_size=8),
)


@SETTINGS
@given(st.sampled_from(NUMERIC_FIELDS), CELLS)
def test_numeric_fields_are_the_whole_cell_or_unreadable(field, cell):
    """Every numeric field of the query: a value only when the WHOLE cell is a non-negative number (and one of the
    units nvidia-smi prints); otherwise no value and, unless the cell is one of the no-value spellings, a problem."""
    cell = cell.replace(",", "").replace("\n", "").replace("\r", "")
    parsed = n.parse_query_gpu("0, 00000000:01:00.0, %s\n" % cell, ["index", "pci.bus_id", field])
    (row,) = parsed["gpus"]
    value = row["values"][field]
    match = WHOLE.fullmatch(cell)
    if value is None:
        if cell.strip().lower() not in n.NOT_AVAILABLE:
            assert [p["message"] for p in parsed["problems"]] == ["%s: %s" % (field, cell.strip())]
        assert not (match and match.group(3) in n.NUMBER_UNITS + ("",)
                    and (n.FIELD_KINDS[field] == "float" or not (match.group(2) or "").strip("0")))
        return
    assert match and match.group(3) in n.NUMBER_UNITS + ("",), cell
    assert not isinstance(value, bool) and value >= 0 and math.isfinite(value)
    number = match.group(1) + ("." + match.group(2) if match.group(2) else "")
    assert value == (int(match.group(1)) if n.FIELD_KINDS[field] == "int" else float(number))
