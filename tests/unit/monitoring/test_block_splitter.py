"""The watcher's file follower hands out whole lines as pieces of the bytes it read, without copying them: whatever
the reads' sizes, the pieces joined are the lines of the file, the bytes taken are the file's, and an overlong line
is cut once and the rest of it dropped."""

import os

from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log import XidScanner
from ansible_collections.kentino.gpufleet.plugins.module_utils.log_follow import BlockSplitter, FileFollower
from hypothesis import given, settings
from hypothesis import strategies as st

LINES = st.lists(st.sampled_from([b"", b"a", b"igb eno1: Reset adapter", b"NVRM: Xid (PCI:0000:3b:00): 13, x",
                                  b"y" * 40]), max_size=40)


def joined(pieces):
    return b"".join(bytes(buf[start:end]) for buf, start, end in pieces)


def feed_in_reads(splitter, data, sizes):
    out, pos = [], 0
    for size in sizes:
        if pos >= len(data):
            break
        out += splitter.feed(data[pos:pos + size])
        pos += size
    if pos < len(data):
        out += splitter.feed(data[pos:])
    return out


@settings(max_examples=400, deadline=None)
@given(LINES, st.lists(st.integers(1, 64), max_size=30), st.booleans())
def test_pieces_are_the_whole_lines_whatever_the_reads(lines, sizes, terminated):
    data = b"\n".join(lines) + (b"\n" if terminated else b"")
    splitter = BlockSplitter(max_line_bytes=1000)
    pieces = feed_in_reads(splitter, data, sizes)
    for buf, start, end in pieces:
        assert 0 <= start < end <= len(buf) and buf[end - 1:end] == b"\n"
    whole = data[:data.rfind(b"\n") + 1]
    assert joined(pieces) == whole
    assert splitter.pending_bytes == len(data) - len(whole)
    assert joined(pieces + splitter.flush()) == whole + (data[len(whole):] + b"\n" if data[len(whole):] else b"")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30), st.lists(st.integers(1, 25), max_size=20))
def test_a_line_longer_than_the_bound_never_buffers_more_than_the_bound(extra, sizes):
    """A line that arrives whole in one read is handed out whole (the scanner bounds what it parses); one that is
    still unterminated past the bound is cut there, once, and the rest of it dropped."""
    long_line = b"z" * (16 + extra)
    data = b"before\n" + long_line + b"\nafter\n"
    splitter = BlockSplitter(max_line_bytes=16)
    out, pos = [], 0
    for size in sizes + [len(data)]:
        out += splitter.feed(data[pos:pos + size])
        assert splitter.pending_bytes <= 16
        pos += size
    assert joined(out) in (data, b"before\n" + b"z" * 16 + b"\nafter\n")
    assert splitter.overlong == (0 if joined(out) == data else 1)


def test_the_big_block_is_handed_out_in_place_not_copied():
    data = b"first line\n" * 1000 + b"unterminated"
    splitter = BlockSplitter()
    splitter.feed(b"begun ")
    pieces = splitter.feed(data)
    assert pieces[0][0] == b"begun first line\n"  # the one line joined with what was buffered
    assert pieces[1][0] is data and pieces[1][1:] == (11, 11000)


def test_the_follower_reports_the_bytes_it_took_and_the_scanner_reads_pieces(tmp_path):
    log = tmp_path / "kern.log"
    xid = b"Nov 30 10:00:01 node kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    log.write_bytes(b"noise\n" * 5000 + xid + b"noise\n" * 10 + b"half a li")
    follower = FileFollower(str(log), read_bytes=4096)
    scanner = XidScanner()
    taken = 0
    while True:
        pieces, size = follower.read_block()
        if not pieces and not size:
            break
        taken += size
        for buf, start, end in pieces:
            scanner.scan_lines(buf, start, end)
    assert taken == os.path.getsize(log) - len(b"half a li")
    assert follower.position()["offset"] == taken
    assert [e["pci"] for e in scanner.take_new()["events"]] == ["0000:3b:00"]
    assert scanner.bytes_read == taken
