"""find_marker is bytes.find(b"NVRM") made fast (memchr on the marker's rarest byte): it must answer exactly as the
plain search, at every bound, in logs where that byte is rare, common, or cut at the edges."""

from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import MARKER, XidScanner, find_marker
from hypothesis import given, settings
from hypothesis import strategies as st

# Pieces that make the hard cases likely: the marker, its parts, its probe byte alone, and newlines.
PIECES = st.sampled_from([b"NVRM", b"NV", b"VRM", b"V", b"N", b"RM", b"\n", b"x", b"VVVV", b"NVRNVRM", b"igb eno1 "])


@settings(max_examples=800, deadline=None)
@given(st.lists(PIECES, max_size=60).map(b"".join), st.integers(0, 400), st.integers(0, 400))
def test_same_answer_as_the_plain_search(data, start, end):
    for buf in (data, bytearray(data)):
        assert find_marker(buf, start, end) == buf.find(MARKER, start, end)


def test_a_log_full_of_the_probe_byte_falls_back_and_still_finds_the_marker():
    buf = b"V" * 5000 + b"NVRM: Xid" + b"V" * 100
    assert find_marker(buf, 0, len(buf)) == 5000
    assert find_marker(buf, 5001, len(buf)) == -1


def test_the_scanner_finds_the_same_lines_in_a_block():
    noise = b"Nov 30 10:00:00 node kernel: VFS: Mounted root, Very Verbose Volume\n" * 50
    line = b"Nov 30 10:00:01 node kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, " \
           b"GPU has fallen off the bus.\n"
    scanner = XidScanner()
    scanner.scan_lines(noise + line + noise + line.replace(b"3b:00", b"5e:00") + noise)
    assert sorted(e["pci"] for e in scanner.take_new()["events"]) == ["0000:3b:00", "0000:5e:00"]
