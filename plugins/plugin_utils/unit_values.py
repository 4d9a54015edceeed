# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""What an inventory value may be before a role writes it into a systemd unit, a drop-in, a script or a path.

Every check reads the WHOLE value (no "^...$", whose "$" matches before a trailing newline): the tests clean_path,
system_directory and plain_text, and the filter systemd_arg that quotes one word of an Exec line, are views of
these functions (plugins/test/unit_values.py, plugins/filter/systemd.py).
"""

from __future__ import annotations

import posixpath
import re

# Letters, digits and . _ - + @ , = between slashes: nothing a unit, a shell or a glob reads specially.
_PATH = re.compile(r"/[A-Za-z0-9._+@,=/-]*")
# Directories of the operating system: never the place a role creates, chowns or opens up for a service.
SYSTEM_DIRECTORIES = frozenset((
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt", "/opt",
    "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/include",
    "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/local", "/usr/local/bin", "/usr/local/lib",
    "/usr/local/sbin", "/usr/local/share", "/usr/sbin", "/usr/share", "/usr/src", "/var", "/var/backups",
    "/var/cache", "/var/lib", "/var/local", "/var/lock", "/var/log", "/var/mail", "/var/opt", "/var/run",
    "/var/spool", "/var/tmp",
))
# Trees that hold only the system's own files or the kernel's: nothing inside them either.
SYSTEM_TREES = ("/boot", "/dev", "/etc", "/proc", "/root", "/run", "/sys", "/bin", "/sbin", "/lib", "/lib32",
                "/lib64", "/libx32")
# Control characters (newline and tab included), quotes, backslash, and what systemd or a shell expands.
_NOT_PLAIN = re.compile(r"[\x00-\x1f\x7f-\x9f\"'\\%$`]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean_path(value):
    """An absolute path written the way it is meant (no `.` or `..` component, no doubled or trailing slash) in the
    safe characters: the same path for the role's checks, for systemd and for the file system."""
    return (isinstance(value, str) and _PATH.fullmatch(value) is not None and posixpath.normpath(value) == value
            and not value.startswith("//"))


def system_directory(value):
    """Whether a path (normalised first: /var/lib/../../etc is /etc) is a directory of the operating system or
    inside one of its own trees."""
    if not isinstance(value, str) or not value.startswith("/"):
        return False
    path = posixpath.normpath("/" + value.lstrip("/"))
    return path in SYSTEM_DIRECTORIES or any(path.startswith(tree + "/") for tree in SYSTEM_TREES)


def plain_text(value):
    """Text that means itself wherever a role writes it: no control character (newline included), no quote,
    backslash, percent sign, dollar sign or backquote."""
    return isinstance(value, str) and _NOT_PLAIN.search(value) is None


def systemd_arg(value):
    """One word of an Exec*= command line, double-quoted: backslash and quote escaped, % and $ doubled (systemd
    expands specifiers and variables even inside quotes). A control character has no safe spelling: ValueError."""
    text = str(value)
    if _CONTROL.search(text):
        raise ValueError("%r: a control character cannot be written into a systemd command line" % text[:80])
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return '"%s"' % escaped
