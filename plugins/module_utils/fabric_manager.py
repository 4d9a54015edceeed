# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The fabric manager's package and service as the node reports them (stdlib only: runs on the node; none raises).

  parse_systemctl_show(text)   `systemctl show <unit> --property=A --property=B`: one KEY=VALUE per line
                               (systemctl(1): "properties are shown in KEY=VALUE form")
  parse_dpkg_query(text)       `dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n' <patterns>`
  upstream_version(version)    "1:570.172.08-1" -> "570.172.08" (epoch and Debian revision dropped)
  package_names(branch, ...)   NVIDIA's package names for a driver branch (docs/roles.md cites the sources)

Package names (NVIDIA's CUDA repository for Debian/Ubuntu, as NVIDIA's GPU driver container installs them,
github.com/NVIDIA/gpu-driver-container ubuntu24.04/install.sh): up to branch 579 `nvidia-fabricmanager-<branch>` and
`libnvidia-nscq-<branch>`; from 580 on `nvidia-fabricmanager` and `libnvidia-nscq`, the version choosing the branch.
Ubuntu's own archive keeps the branch in both names (packages.ubuntu.com: nvidia-fabricmanager-580,
libnvidia-nscq-580). NVLink 5 (Blackwell) baseboards also need NVLSM (`nvlsm`, with `infiniband-diags`) and, for DCGM
to monitor the switches, NVSDM (`libnvsdm-<branch>` from 570, `libnvsdm` from 580; amd64 only).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

SERVICE = "nvidia-fabricmanager"
SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "UnitFileState", "ExecMainStatus")
UNVERSIONED_FROM_BRANCH = 580
NVSDM_FROM_BRANCH = 570
# The packages whose version must equal the driver's (the others, NVLSM and infiniband-diags, have their own).
FM_PACKAGE_RE = re.compile(r"^nvidia-fabricmanager(?:-(\d+))?$")
NSCQ_PACKAGE_RE = re.compile(r"^libnvidia-nscq(?:-(\d+))?$")
NVSDM_PACKAGE_RE = re.compile(r"^libnvsdm(?:-(\d+))?$")
DPKG_FORMAT = "${Package}\\t${Version}\\t${db:Status-Abbrev}\\n"
DPKG_PATTERNS = ("nvidia-fabricmanager*", "libnvidia-nscq*", "libnvsdm*", "nvlsm")


def parse_systemctl_show(text):
    """{KEY: VALUE} of `systemctl show` output (the first value wins); lines without "=" are ignored."""
    out = {}
    try:
        for line in str(text or "").splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and key.strip() not in out:
                out[key.strip()] = value.strip()
    except Exception:  # never raise: an empty answer says "unknown"
        return {}
    return out


def parse_dpkg_query(text):
    """[{package, version, status, installed}] of dpkg-query -W output in DPKG_FORMAT. installed: the package's files
    are on the node (status ii/hi: "i" as the second letter); a known but removed package has installed False."""
    out = []
    try:
        for line in str(text or "").splitlines():
            parts = line.split("\t")
            if len(parts) < 3 or not parts[0].strip():
                continue
            status = parts[2]
            out.append({"package": parts[0].strip(), "version": parts[1].strip() or None, "status": status.strip(),
                        "installed": len(status) >= 2 and status[1] == "i", "held": status[:1] == "h"})
    except Exception:
        return []
    return out


def upstream_version(version):
    """The upstream part of a Debian version: epoch ("1:") and revision ("-1", "-0ubuntu0.22.04.1") dropped."""
    if not version:
        return None
    text = str(version).strip()
    if ":" in text:
        text = text.split(":", 1)[1]
    if "-" in text:
        text = text.rsplit("-", 1)[0]
    return text or None


def branch_of(version):
    """"570.172.08" -> 570 (None when it is not a driver version)."""
    match = re.match(r"^(\d{3,4})\.", str(version or ""))
    return int(match.group(1)) if match else None


def package_names(branch, source="cuda_repo", nvlink5=False, arch="x86_64"):
    """{"pinned": [names at the driver's version], "unpinned": [names of their own version]} for a driver branch.
    source: cuda_repo (NVIDIA's repository) or distribution (Ubuntu's archive)."""
    branch = int(branch)
    suffix = "" if source == "cuda_repo" and branch >= UNVERSIONED_FROM_BRANCH else "-%d" % branch
    pinned = ["nvidia-fabricmanager" + suffix, "libnvidia-nscq" + suffix]
    unpinned = []
    if nvlink5:
        unpinned = ["nvlsm", "infiniband-diags"]
        # NVSDM from NVIDIA's repository only (its names in a distribution's archive were not verified).
        if source == "cuda_repo" and arch in ("x86_64", "amd64") and branch >= NVSDM_FROM_BRANCH:
            pinned.append("libnvsdm" + suffix)
    return {"pinned": pinned, "unpinned": unpinned}


def installed_fabric_manager(packages):
    """(the installed fabric manager package entry or None, the installed NSCQ entry or None)."""
    fm = next((p for p in packages if p["installed"] and FM_PACKAGE_RE.match(p["package"])), None)
    nscq = next((p for p in packages if p["installed"] and NSCQ_PACKAGE_RE.match(p["package"])), None)
    return fm, nscq
