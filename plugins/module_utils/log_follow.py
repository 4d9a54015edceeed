# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Follow a growing log: a file (with rotation and truncation) or a long-running tool's stdout (stdlib only: runs on
the node). Used by the XID watcher; the parsing stays in kernel_log.py.

Both followers hand out whole lines as bytes and never hold more than max_line_bytes of one line: a longer line is
cut (counted in ``overlong``) and the rest of it skipped, so a 1 MB line or a file of random bytes without newlines
costs bounded memory. Nothing here decodes text: bytes that are not UTF-8 pass through untouched.

Waiting costs nothing while nothing is written: a tool's stdout is selected on, a file is watched with inotify
(FileChanges, through ctypes: the stdlib has no inotify) and only a Python without ctypes or a kernel without inotify
falls back to polling.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fcntl
import os
import select
import signal
import struct
import subprocess
import time

from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import file_position, resume

MAX_LINE_BYTES = 1024 * 1024
READ_BYTES = 1024 * 1024


def bounded_lines(fh, max_line_bytes=MAX_LINE_BYTES):
    """Lines of a binary file object as (line, true length, terminated): a line longer than max_line_bytes comes as
    its first max_line_bytes only (the caller sees true length > len(line)) and the rest of it is read in pieces and
    dropped, so a file without newlines costs max_line_bytes of memory, never its size."""
    while True:
        line = fh.readline(max_line_bytes + 1)
        if not line:
            return
        if len(line) <= max_line_bytes or line.endswith(b"\n"):
            yield line, len(line), line.endswith(b"\n")
            continue
        head, size = line[:max_line_bytes], len(line)
        while not line.endswith(b"\n"):
            line = fh.readline(READ_BYTES)
            if not line:
                break
            size += len(line)
        yield head, size, line.endswith(b"\n")


class LineSplitter:
    """Bytes in, complete lines out; a line longer than max_line_bytes is cut there and the rest of it dropped."""

    def __init__(self, max_line_bytes=MAX_LINE_BYTES):
        self.max_line_bytes = max_line_bytes
        self.partial = b""
        self.skipping = False  # inside the dropped rest of an overlong line
        self.overlong = 0

    def feed(self, data):
        """Complete lines (without newline) found in data after what was buffered."""
        lines = []
        start = 0
        size = len(data)
        while start < size:
            nl = data.find(b"\n", start)
            if nl < 0:
                if not self.skipping:
                    room = self.max_line_bytes - len(self.partial)
                    chunk = data[start:]
                    if len(chunk) > room:
                        lines.append(self.partial + chunk[:room])  # hand out the head now, drop the rest
                        self.partial = b""
                        self.skipping = True
                        self.overlong += 1
                    else:
                        self.partial += chunk
                break
            if self.skipping:
                self.skipping = False
            else:
                line = self.partial + data[start:nl]
                if len(line) > self.max_line_bytes:
                    line = line[:self.max_line_bytes]
                    self.overlong += 1
                lines.append(line)
            self.partial = b""
            start = nl + 1
        return lines

    def flush(self):
        """The unterminated rest as a last line (the writer is gone: a rotated file, an exited tool)."""
        line, self.partial, self.skipping = self.partial, b"", False
        return [line] if line else []

    @property
    def pending_bytes(self):
        return len(self.partial)


class BlockSplitter:
    """Bytes in, whole lines out as pieces of the bytes read, never copied (no per-line Python work and no per-byte
    work either: the caller scans pieces with bytes.find, and counts bytes, not lines).

    A piece is (buf, start, end): buf[start:end] is whole lines, the last ending with a newline. Only the
    unterminated tail is buffered, at most max_line_bytes of it: a longer line is handed out cut at that length
    (counted in overlong) and the rest of it dropped, so a file of random bytes without newlines costs bounded memory.
    """

    def __init__(self, max_line_bytes=MAX_LINE_BYTES):
        self.max_line_bytes = max_line_bytes
        self.partial = b""
        self.skipping = False
        self.overlong = 0

    def feed(self, data):
        """The pieces of whole lines in data after what was buffered."""
        last_nl = data.rfind(b"\n")
        if last_nl < 0:
            return self._tail(data)
        pieces = []
        start = 0
        if self.skipping:  # the rest of an overlong line, dropped
            start = data.find(b"\n") + 1
            self.skipping = False
        elif self.partial:  # the line begun in the last read: the only bytes joined
            start = data.find(b"\n") + 1
            line = self.partial + data[:start]
            pieces.append((line, 0, len(line)))
        self.partial = b""
        if start <= last_nl:
            pieces.append((data, start, last_nl + 1))
        return pieces + self._tail(data[last_nl + 1:])

    def _tail(self, rest):
        if self.skipping or not rest:
            return []
        if len(self.partial) + len(rest) > self.max_line_bytes:
            head = (self.partial + rest)[:self.max_line_bytes] + b"\n"
            self.partial = b""
            self.skipping = True
            self.overlong += 1
            return [(head, 0, len(head))]
        self.partial += rest
        return []

    def flush(self):
        """The unterminated rest as a last line (the writer is gone: a rotated file)."""
        line, self.partial, self.skipping = self.partial, b"", False
        return [(line + b"\n", 0, len(line) + 1)] if line else []

    @property
    def pending_bytes(self):
        return len(self.partial)


class FileFollower:
    """Follow a plain-text log file by polling (no inotify in the stdlib; a poll a fraction of a second is cheap).

    read_block() returns pieces of whole lines (BlockSplitter). position: {"path", "inode", "dev", "offset", "head_bytes",
    "head_sha256"} of the last run, or None. The saved offset is always at a line start, so a restart neither repeats
    nor loses a line. Rotation (the path now names another inode): the old file is read to its end first, through the
    descriptor still open or, after a restart, the rotated sibling found by inode; then the new file from its start.
    Truncation (size below the offset) or a new file that reuses the inode number (different first bytes): read from
    the start. Each of these is said in notes (the watcher logs them).
    """

    def __init__(self, path, position=None, max_line_bytes=MAX_LINE_BYTES, read_bytes=READ_BYTES):
        self.path = os.path.abspath(path)
        self.max_line_bytes = max_line_bytes
        self.splitter = BlockSplitter(max_line_bytes)
        self.read_bytes = read_bytes
        self.fh = None
        self.st = None
        self.offset = 0  # bytes of the current file handed out as whole lines
        self.notes = []
        self._old = None  # file object of a file rotated away that still has unread bytes
        self._pending_prev = position or {}
        self._open_initial()

    # ---- opening --------------------------------------------------------------------------------------------
    def _open(self, path):
        fh = open(path, "rb")
        return fh, os.fstat(fh.fileno())

    def _open_initial(self):
        prev = self._pending_prev
        try:
            fh, st = self._open(self.path)
        except (IOError, OSError) as exc:
            if not self.notes or "cannot open" not in self.notes[-1]:
                self.notes.append("cannot open %s yet: %s (retrying)" % (self.path, exc.strerror or exc))
            return
        self._pending_prev = {}
        offset = 0
        if prev.get("path") == self.path and prev.get("inode") is not None:
            offset, old, note = resume(self.path, st, prev)
            if note:
                self.notes.append(note)
            if old is not None:
                try:
                    self._old, _ost = self._open(old)
                    self._old.seek(int(prev.get("offset") or 0))
                except (IOError, OSError):
                    self._old = None
        fh.seek(offset)
        self.fh, self.st, self.offset = fh, st, offset

    # ---- reading --------------------------------------------------------------------------------------------
    def read_block(self):
        """(pieces of whole lines written since the last call (see BlockSplitter), the bytes of the file they took
        up, with the dropped rest of an overlong line); ([], 0) when nothing is new.

        At most read_bytes (plus one line) per call, so a caller can work in bounded steps. Never raises for I/O
        problems: they go to notes.
        """
        if self._old is not None:
            pieces, size = self._drain(self._old, count_offset=False)
            if pieces:
                return pieces, size
            self._old.close()
            self._old = None
            pieces, size = self._flush()
            if pieces:
                return pieces, size
        if self.fh is None:
            self._open_initial()
            if self.fh is None:
                return [], 0
        pieces, size = self._drain(self.fh)
        if pieces:
            return pieces, size
        try:
            st = os.stat(self.path)
        except OSError:
            return [], 0  # rotated away, the new file not yet created: keep the old one open
        if st.st_ino != self.st.st_ino or st.st_dev != self.st.st_dev:
            pieces, size = self._drain(self.fh)  # written to the old file between the read above and the rename
            if pieces:
                return pieces, size
            pieces, size = self._flush()  # the old file is read to its end: its unterminated last line
            self.fh.close()
            try:
                self.fh, self.st = self._open(self.path)
            except (IOError, OSError) as exc:
                self.notes.append("cannot open %s after its rotation: %s (retrying)" % (self.path, exc.strerror or exc))
                self.fh, self.st = None, None
                return pieces, size
            self.offset = 0
            self.notes.append("%s was rotated: following the new file" % self.path)
            return pieces, size
        if st.st_size < self.offset + self.splitter.pending_bytes:
            self.notes.append("%s was truncated (size %d, read up to %d): reading it from the start"
                              % (self.path, st.st_size, self.offset))
            self.splitter = BlockSplitter(self.max_line_bytes)
            self.fh.seek(0)
            self.offset = 0
            return self._drain(self.fh)
        return [], 0

    def _flush(self):
        size = self.splitter.pending_bytes
        return self.splitter.flush(), size

    def _drain(self, fh, count_offset=True):
        size = 0
        while True:
            try:
                data = fh.read(self.read_bytes)
            except (IOError, OSError) as exc:
                self.notes.append("read error on %s: %s" % (self.path, exc))
                return [], size
            if not data:
                return [], size
            before = self.splitter.pending_bytes
            pieces = self.splitter.feed(data)
            taken = before + len(data) - self.splitter.pending_bytes
            size += taken
            if count_offset:
                self.offset += taken
            if pieces:
                return pieces, size

    def position(self):
        """Where a restart resumes: the start of the first line not yet handed out."""
        if self.st is None:
            return dict(self._pending_prev) if self._pending_prev else None
        return file_position(self.path, self.st, self.offset)

    def close(self):
        for fh in (self.fh, self._old):
            if fh is not None:
                fh.close()


def wait_readable(fds, timeout_s):
    """The fds of `fds` readable within timeout_s (None: no limit); [] on timeout. A signal handler that writes to one
    of them (the watcher's stop) ends the wait: select is retried after a signal (PEP 475) and finds it readable."""
    try:
        ready, _w, _x = select.select(list(fds), [], [], None if timeout_s is None else max(0.0, timeout_s))
    except (OSError, ValueError) as exc:
        if getattr(exc, "errno", None) == errno.EINTR:
            return []
        raise
    return ready


class FileChanges:
    """Wakes when a followed file may have new bytes: inotify on the file (writes, even after it was renamed away by
    a rotation) and on its directory (a new file under its name). None of this decides what is read: after a wake
    the follower reads and checks the file as after a poll, so a missed or extra event costs a read, never a line.

    FileChanges.create(path) returns None where inotify cannot be used (no ctypes, not Linux, the watch limit
    reached): the caller polls then.
    """

    IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
    IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
    IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW = 0x400, 0x800, 0x4000
    FILE_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF
    DIR_MASK = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE
    _EVENT = struct.Struct("iIII")

    def __init__(self, libc, fd, path):
        self._libc, self.fd, self.path = libc, fd, path
        self.name = os.fsencode(os.path.basename(path))
        self.dir_wd = self._watch(os.path.dirname(path), self.DIR_MASK)
        self.file_wd = None
        self.file_ino = None
        self.rearm()

    @classmethod
    def create(cls, path):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (ImportError, OSError, AttributeError):
            return None
        if fd < 0:
            return None
        try:
            watch = cls(libc, fd, os.path.abspath(path))
        except OSError:
            os.close(fd)
            return None
        return watch

    def _watch(self, path, mask):
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            import ctypes

            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return wd

    def rearm(self):
        """Watch the file now at the path (after a rotation: the new one; the old one's watch stays)."""
        try:
            ino = os.stat(self.path).st_ino
        except OSError:
            return
        if ino != self.file_ino:
            try:
                self.file_wd = self._watch(self.path, self.FILE_MASK)
                self.file_ino = ino
            except OSError:
                pass  # the directory's watch still sees the file come back

    def wait(self, timeout_s, extra_fds=()):
        """True when the file may have changed, False on timeout or when one of extra_fds became readable."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            ready = wait_readable([self.fd] + list(extra_fds), None if deadline is None else
                                  deadline - time.monotonic())
            if not ready or self.fd not in ready:
                return False
            if self._relevant():
                self.rearm()
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def _relevant(self):
        """Drain the queued events: any on the file, or on the directory for the file's own name."""
        hit = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                    return hit
                raise
            pos = 0
            while pos + self._EVENT.size <= len(data):
                wd, mask, _cookie, size = self._EVENT.unpack_from(data, pos)
                name = data[pos + self._EVENT.size:pos + self._EVENT.size + size].rstrip(b"\0")
                pos += self._EVENT.size + size
                if wd != self.dir_wd or name == self.name or mask & self.IN_Q_OVERFLOW:
                    hit = True

    def close(self):
        try:
            os.close(self.fd)
        except OSError:
            pass


class ProcessLines:
    """A long-running tool (journalctl -f, dmesg --follow) whose stdout is read as lines without blocking the caller.

    Its stderr is kept (the last 4 KiB) to explain an exit. The tool runs in its own session so stop() ends it with
    everything it started.
    """

    def __init__(self, argv, env=None, max_line_bytes=MAX_LINE_BYTES):
        self.argv = [str(a) for a in argv]
        full_env = dict(os.environ)
        full_env.update({"LC_ALL": "C", "LANG": "C", "SYSTEMD_PAGER": "", "PAGER": "cat"})
        full_env.update(env or {})
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=full_env, start_new_session=True)
        for pipe in (self.proc.stdout, self.proc.stderr):
            flags = fcntl.fcntl(pipe.fileno(), fcntl.F_GETFL)
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self.splitter = LineSplitter(max_line_bytes)
        self.stderr_tail = b""
        self.eof = False

    def fds(self):
        return [] if self.eof else [self.proc.stdout.fileno(), self.proc.stderr.fileno()]

    def read_lines(self, timeout_s):
        """Lines available within timeout_s (returns as soon as any arrived; 0: only what is there now). After the
        tool exits: eof is True."""
        if self.eof:
            return []
        ready = wait_readable(self.fds(), timeout_s)
        lines = []
        if self.proc.stderr.fileno() in ready:
            self._read_stderr()
        if self.proc.stdout.fileno() in ready:
            while True:
                try:
                    data = os.read(self.proc.stdout.fileno(), READ_BYTES)
                except OSError as exc:
                    if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                        break
                    data = b""
                if not data:  # EOF: the tool exited (or closed its stdout)
                    self._finish()
                    lines.extend(self.splitter.flush())
                    break
                lines.extend(self.splitter.feed(data))
                if len(data) < READ_BYTES:
                    break
        return lines

    def _read_stderr(self):
        try:
            data = os.read(self.proc.stderr.fileno(), 65536)
        except OSError:
            return
        self.stderr_tail = (self.stderr_tail + data)[-4096:]

    def _finish(self):
        self.eof = True
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.stop()
        self._read_stderr()

    @property
    def returncode(self):
        return self.proc.returncode

    @property
    def stderr_text(self):
        return self.stderr_tail.decode("utf-8", "replace").strip()

    def stop(self):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                continue
        for pipe in (self.proc.stdout, self.proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass
