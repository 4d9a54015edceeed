"""Fuzz every parser entry point: random bytes, truncated lines, invalid UTF-8, 1 MB lines, random journald JSON.

No exception may escape, and what could not be read is counted. Example counts stay modest (2 shared cores).
"""

import io
import json

from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import (
    MAX_LINE_CHARS,
    XidScanner,
    parse_journal_json,
    parse_kernel_log,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import journal_record, split_prefix
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

GOOD = ("[ 1843.308145] NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 145, pid='<unknown>', name=<unknown>, "
        "RLW_REMAP  Nonfatal   XC0 i0 Link 05 (0x004f8000 0x00000000)")
PIECES = [GOOD, "NVRM: Xid (", "PCI:", "0000:3b:00", "): ", "79", ", pid=", "'<unknown>'", ", name=", "<unknown>",
          "caused by previous Xid ", "GPU recovery action changed from 0x0 (None) to ", "0x9 (", "Fatal", "Link ",
          "(0x", "NVRM: The NVIDIA GPU ", "fallen off the bus", "NVRM: GPU at PCI:", "GPU Board Serial Number: ",
          "\n", "\r", "\x00", "\udcff", "[", "]", " ", "kern  :warn  : ", "Dec  2 11:38:47 h kernel: "]


def _check(result):
    assert set(result) >= {"events", "lost_gpus", "summary", "highest_severity", "unparsed"}
    assert result["unparsed"]["count"] >= len(result["unparsed"]["samples"])
    assert len(result["unparsed"]["samples"]) <= 5
    json.dumps(result)  # what the module returns must serialise


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes_binary_scan(data):
    scanner = XidScanner()
    consumed = scanner.scan_binary(io.BytesIO(data), chunk_bytes=97)
    assert consumed == len(data)
    _check(scanner.result())


@FUZZ
@given(st.lists(st.sampled_from(PIECES), max_size=60).map("".join))
def test_shuffled_xid_fragments_text(text):
    _check(parse_kernel_log(text))


@FUZZ
@given(st.lists(st.sampled_from(PIECES), max_size=40).map("".join), st.integers(min_value=0, max_value=200))
def test_truncated_lines_invalid_utf8(text, cut):
    data = text.encode("utf-8", "surrogateescape")[:cut] + b"\xff\xfe\xc3\n" + GOOD.encode()[:cut]
    scanner = XidScanner()
    scanner.scan_binary(io.BytesIO(data), chunk_bytes=13)
    _check(scanner.result())
    for line in data.splitlines():
        split_prefix(line.decode("utf-8", "replace"))


def test_one_megabyte_lines_are_bounded_and_reported():
    big = b"[ 1.0] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x, " + b"A" * (1024 * 1024) + b"\n"
    data = big + b"x" * (1024 * 1024) + b"\n" + GOOD.encode() + b"\n"
    scanner = XidScanner()
    scanner.scan_binary(io.BytesIO(data), chunk_bytes=64 * 1024)
    res = scanner.result()
    _check(res)
    assert res["unparsed"]["by_reason"].get("overlong_line") == 1
    assert res["summary"]["by_code"] == {"31": 1, "145": 1}  # the head of the long line still counts; the next line too
    assert all(len(e["message"]) < MAX_LINE_CHARS for e in res["events"])
    text_res = parse_kernel_log(data.decode())
    _check(text_res)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40) | st.sampled_from(["NVRM: Xid (PCI:0000:3b:00): 79, x", GOOD]),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=20,
)
JOURNAL_KEYS = st.sampled_from(["MESSAGE", "__CURSOR", "__REALTIME_TIMESTAMP", "__MONOTONIC_TIMESTAMP", "_BOOT_ID",
                                "_SOURCE_MONOTONIC_TIMESTAMP", "PRIORITY", "X"])


@FUZZ
@given(st.lists(st.dictionaries(JOURNAL_KEYS, JSON_VALUES | st.lists(st.integers(0, 300), max_size=50), max_size=8),
                max_size=10))
def test_random_journald_json(records):
    text = "\n".join(json.dumps(r) for r in records) + "\n{ broken json\n" + "\n"
    res = parse_journal_json(text)
    _check(res)
    assert res["unparsed"]["by_reason"].get("journal_json", 0) >= 1
    for rec in records:
        journal_record(json.dumps(rec))


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes_as_journal(data):
    _check(parse_journal_json(data.decode("utf-8", "replace")))
