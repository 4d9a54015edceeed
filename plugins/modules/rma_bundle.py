#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: rma_bundle
short_description: Collect the evidence a GPU vendor asks for into one bundle, secrets scrubbed
description:
  - Writes a directory C(gpufleet-rma-<host>-<time>) under O(dest) (mode 0700), named after O(host) with the output of
    C(nvidia-bug-report.sh), C(nvidia-smi -q -x), C(dcgmi diag -r 3 -j) where DCGM is installed, and the node's
    identity (board and GPU serials, UUIDs, VBIOS, driver, kernel, BIOS), then C(manifest.json) with the sha256 and
    size of every file and why anything is missing.
  - Every file is scrubbed of secrets (passwords, tokens, API keys, Authorization headers, private keys, URL
    passwords, AWS key ids; the count is in the manifest) and bounded to a share of O(max_bytes) (head and tail kept,
    the cut said in the file and the manifest).
  - Made before the first repair step (docs/lifecycle.md); the controller adds the node's XID, ECC and row-remap
    history to it.
version_added: "0.3.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.node_module
attributes:
  check_mode:
    support: full
    details: Nothing is run or written; RV(planned) lists the commands.
options:
  dest:
    description: Absolute directory the bundle directory is created in.
    type: path
    required: true
  host:
    description:
      - The node's inventory name, which names the bundle and its manifest (the report, the history and the
        controller's C(rma/<node>/) directory use it). The machine's own hostname is kept in C(identity.json).
      - Without it, the machine's short hostname.
    type: str
  dcgm_level:
    description: The C(dcgmi diag) level to run (0 skips it). Level 3 takes about 15 minutes.
    type: int
    default: 3
    choices: [0, 1, 2, 3, 4]
  bug_report:
    description: Run C(nvidia-bug-report.sh) (needs root).
    type: bool
    default: true
  max_bytes:
    description: Size limit of the bundle in bytes; each of its four files gets a quarter.
    type: int
    default: 67108864
  timeout:
    description: Seconds each tool may take.
    type: int
    default: 1800
"""

EXAMPLES = r"""
- name: Keep the evidence before the first repair step
  kentino.gpufleet.rma_bundle:
    dest: /var/lib/gpufleet/rma
    host: "{{ inventory_hostname }}"
  become: true
  register: __bundle
"""

RETURN = r"""
bundle:
  description: The bundle's directory on the node.
  returned: success, not in check mode
  type: str
manifest:
  description: The manifest (files with name, bytes, sha256, source, secrets_redacted, cut_bytes; skipped with why).
  returned: success, not in check mode
  type: dict
planned:
  description: The commands the bundle runs, as argv lists.
  returned: always
  type: list
  elements: list
"""

import gzip
import json
import os
import platform
import re
import socket
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import rma_evidence
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_result import node_name
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import run_tool

IDENTITY_QUERY = "index,pci.bus_id,serial,uuid,name,vbios_version,driver_version"
DMI = ("board_serial", "board_name", "product_name", "product_serial", "bios_version", "sys_vendor")
SAFE_PATH = re.compile(r"\A/[^\x00-\x1f\x7f]*\Z")
# An inventory name as it may appear in a directory name (no path separator, no control character).
SAFE_HOST = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9._:@-]{0,252}\Z")


def _tool_text(result):
    return result.stdout + ("\n[stderr]\n" + result.stderr if result.stderr.strip() else "")


def _dmi():
    out = {}
    for key in DMI:
        try:
            with open("/sys/class/dmi/id/" + key) as fh:
                out[key] = fh.read().strip() or None
        except (OSError, UnicodeDecodeError) as exc:
            out[key] = None
            out.setdefault("unreadable", {})[key] = getattr(exc, "strerror", None) or str(exc)
    return out


def main():
    module = AnsibleModule(argument_spec=dict(
        dest=dict(type="path", required=True), host=dict(type="str"), dcgm_level=dict(type="int", default=3, choices=[0, 1, 2, 3, 4]),
        bug_report=dict(type="bool", default=True), max_bytes=dict(type="int", default=64 << 20),
        timeout=dict(type="int", default=1800),
    ), supports_check_mode=True)
    p = module.params
    if not SAFE_PATH.match(p["dest"] or "") or p["max_bytes"] < 4096 or p["timeout"] < 1:
        module.fail_json(msg="rma_bundle on %s: dest must be an absolute path without control characters (got %r), "
                             "max_bytes at least 4096 and timeout at least 1" % (node_name(), p["dest"]))
    if p["host"] is not None and not SAFE_HOST.match(p["host"]):
        module.fail_json(msg="rma_bundle on %s: host must be the node's inventory name (letters, digits, '._:@-', "
                             "no '/' or control characters), got %r" % (node_name(), p["host"]))
    smi = module.get_bin_path("nvidia-smi")
    dcgmi = module.get_bin_path("dcgmi") if p["dcgm_level"] else None
    bug = module.get_bin_path("nvidia-bug-report.sh") if p["bug_report"] else None
    host = p["host"] or node_name()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    bundle = os.path.join(p["dest"], "gpufleet-rma-%s-%s" % (re.sub(r"[^A-Za-z0-9._-]", "_", host), stamp))
    planned = []
    if bug:
        planned.append([bug, "--output-file", os.path.join("<tmp>", "nvidia-bug-report.log")])
    if smi:
        planned += [[smi, "-q", "-x"], [smi, "--query-gpu=" + IDENTITY_QUERY, "--format=csv,noheader"]]
    if dcgmi:
        planned.append([dcgmi, "diag", "-r", str(p["dcgm_level"]), "-j"])
    if module.check_mode:
        module.exit_json(changed=False, planned=planned)
    try:
        os.makedirs(p["dest"], 0o700, exist_ok=True)
        # Two triggers in the same second (an alert and the audit) each get a bundle of their own.
        base = bundle
        for n in range(2, 100):
            try:
                os.mkdir(bundle, 0o700)
                break
            except FileExistsError:
                bundle = "%s-%d" % (base, n)
        else:
            raise OSError("99 bundles of this second exist already")
    except OSError as exc:
        module.fail_json(msg="rma_bundle on %s: cannot create %s (%s): give gpufleet_rma_dir a directory root can "
                             "write" % (host, bundle, exc.strerror or exc), planned=planned)
    share = p["max_bytes"] // 4
    files, skipped = [], []

    def missing(name, why):
        skipped.append({"name": name, "reason": why})

    if bug:
        with tempfile.TemporaryDirectory(prefix="gpufleet-bugreport.") as tmp:
            argv = [bug, "--output-file", os.path.join(tmp, "nvidia-bug-report.log")]
            result = run_tool(argv, p["timeout"], cwd=tmp)
            log = os.path.join(tmp, "nvidia-bug-report.log.gz")
            if os.path.exists(log):
                with gzip.open(log, "rb") as fh:
                    text = fh.read(4 * share + 1).decode("utf-8", "replace")  # a bomb is cut, not unpacked whole
                files.append(rma_evidence.write_text(bundle, "nvidia-bug-report.log.gz", text, share, argv, gz=True))
            else:
                missing("nvidia-bug-report.log.gz", "nvidia-bug-report.sh wrote no log (rc %s%s): %s" % (
                    result.rc, ", timed out" if result.timed_out else "",
                    (result.error or _tool_text(result)).strip()[-300:]))
    else:
        missing("nvidia-bug-report.log.gz", "not asked (bug_report=false)" if not p["bug_report"] else
                "nvidia-bug-report.sh is not installed (it ships with the NVIDIA driver)")
    identity = {"host": host, "hostname": socket.gethostname(), "kernel": platform.release(), "dmi": _dmi(),
                "gpus_csv": None}
    if smi:
        argv = [smi, "-q", "-x"]
        result = run_tool(argv, min(p["timeout"], 300))
        if result.stdout.strip():
            files.append(rma_evidence.write_text(bundle, "nvidia-smi-q.xml", _tool_text(result), share, argv))
        else:
            missing("nvidia-smi-q.xml", "nvidia-smi -q -x printed nothing (rc %s): %s" % (
                result.rc, (result.error or result.stderr).strip()[-300:]))
        result = run_tool([smi, "--query-gpu=" + IDENTITY_QUERY, "--format=csv,noheader"], min(p["timeout"], 120))
        identity["gpus_csv"] = "index, pci.bus_id, serial, uuid, name, vbios_version, driver_version\n" + \
            _tool_text(result)
    else:
        missing("nvidia-smi-q.xml", "nvidia-smi is not installed")
    if dcgmi:
        argv = [dcgmi, "diag", "-r", str(p["dcgm_level"]), "-j"]
        result = run_tool(argv, p["timeout"])
        if result.stdout.strip():
            files.append(rma_evidence.write_text(bundle, "dcgmi-diag.json", result.stdout, share, argv))
        else:
            missing("dcgmi-diag.json", "dcgmi diag printed nothing (rc %s%s): %s" % (
                result.rc, ", timed out" if result.timed_out else "", (result.error or result.stderr).strip()[-300:]))
    else:
        missing("dcgmi-diag.json", "not asked (dcgm_level=0)" if not p["dcgm_level"] else
                "dcgmi is not installed (DCGM)")
    files.append(rma_evidence.write_text(bundle, "identity.json", json.dumps(identity, indent=1, sort_keys=True),
                                         share, ["nvidia-smi", "--query-gpu=" + IDENTITY_QUERY]))
    manifest = rma_evidence.write_manifest(bundle, {
        "host": host, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "max_bytes": p["max_bytes"],
        "files": files, "skipped": skipped})
    module.exit_json(changed=True, bundle=bundle, manifest=manifest, planned=planned)


if __name__ == "__main__":
    main()
