#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: job_evidence
short_description: Collect what a hung training job left on a node, read-only, in one round trip
description:
  - Gathers, for the post-mortem of a PyTorch job that hung or timed out (kentino.gpufleet.job_postmortem), everything
    this node knows about it, and judges nothing.
  - The PyTorch watchdog and torchrun lines of the job's log files (O(logs), plain or gzip) and of the journal of
    systemd units (O(journal_units)), parsed on the node - timeouts with rank, sequence, op and duration, process-group
    status lines, heartbeat-monitor kills, the elastic summary, and which global rank ran as which local rank.
  - The flight-recorder dumps C(<prefix><rank>) of every O(dump_prefixes) (the training_env role sets
    C(TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/var/tmp/gpufleet-nccl-dumps/nccl_trace_rank_)), returned as base64 bytes up to
    O(max_dump_bytes) each. They are never unpickled on the node; the controller reads them with a restricted
    unpickler. Run through the collection's action plugin (as every task does), the bytes are kept in a private
    file on the controller (C(data_file)) instead of the task's result, so they never reach the console or C(-v).
  - Logs and dumps are opened without following a symbolic link and read only when they are regular files of the
    job's user (O(job_user)); a link, a device or a file of another user is an error naming it, never read. The dump
    directory is writable by every user, so this is what keeps a planted C(nccl_trace_rank_0 -> /etc/shadow) out.
  - The XIDs and lost GPUs of the kernel log since O(since) (or O(lookback)), read with the same parser as
    kentino.gpufleet.xid_facts; the GPUs nvidia-smi sees (index, PCI, UUID, current throttle reasons) and the lost
    ones; and, for a job still hanging, the rank and device variables of its live worker processes (only those
    variables; nothing else of their environment is read into the result).
  - Never fails for a missing log, dump, tool or permission; each problem is in C(errors) with the file or tool and
    the fix. Invalid options fail before anything is read.
version_added: "0.1.0"
author: kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.node_module
  - kentino.gpufleet.node_module.read_only
options:
  logs:
    description: Log files of the job on this node (paths or globs, plain or gzip), e.g. the files of C(torchrun --tee).
    type: list
    elements: str
    default: []
  journal_units:
    description: systemd units whose journal holds the job's output (C(journalctl -u UNIT)).
    type: list
    elements: str
    default: []
  dump_prefixes:
    description:
      - Flight-recorder dump prefixes (C(TORCH_NCCL_DEBUG_INFO_TEMP_FILE) / C(TORCH_FR_DUMP_TEMP_FILE)); files are
        C(<prefix><rank>).
    type: list
    elements: str
    default: [/var/tmp/gpufleet-nccl-dumps/nccl_trace_rank_]
  since:
    description:
      - Start of the job's window (ISO 8601, C(@epoch) or relative such as C(-2h)). Log lines and dumps before it are
        left out; the kernel log is read from here.
      - Without it, logs are read whole and the kernel log from O(lookback); the controller cuts the window around the
        last timeout.
    type: str
  until:
    description: End of the job's window (same forms as O(since)).
    type: str
  lookback:
    description: How far back the kernel log and journal units are read when O(since) is not given.
    type: str
    default: -24h
  kernel_log:
    description: Where to read XIDs; C(auto) is the journal when journalctl answers, else dmesg; C(none) skips it.
    type: str
    choices: [auto, journal, dmesg, none]
    default: auto
  nvidia_smi:
    description: Read the GPU map (index, PCI, UUID, lost GPUs, throttle reasons) with nvidia-smi.
    type: bool
    default: true
  scan_processes:
    description: Read the rank and device variables of live torchrun workers from C(/proc/<pid>/environ).
    type: bool
    default: true
  job_user:
    description:
      - The user the job ran as (a name or a numeric uid); its logs and dumps must be owned by it, any other file is
        refused. The elastic_training role's user is C(gpufleet-train).
      - Without it, files of any owner are read, except that a module running as root (C(become)) refuses files owned
        by root (give C(job_user=root) for a job that ran as root).
    type: str
  max_dump_bytes:
    description: Largest dump sent to the controller (bytes); larger dumps are listed, not sent.
    type: int
    default: 67108864
  max_dumps_total_bytes:
    description: Most dump bytes this node sends in all.
    type: int
    default: 268435456
  max_log_bytes:
    description: Bytes read per log file; of a larger plain file the end is read (where the job died).
    type: int
    default: 2147483648
  timeout:
    description: Seconds each tool (journalctl, dmesg, nvidia-smi) may run.
    type: int
    default: 60
notes:
  - "Read-only; runs in check mode. Logs and dumps of a job run by another user need C(become: true), and so does the
    system journal; the post-mortem playbook becomes root only when C(job_postmortem_become=true) says so."
seealso:
  - module: kentino.gpufleet.job_postmortem
  - module: kentino.gpufleet.xid_facts
"""

EXAMPLES = r"""
- name: Evidence of the job that hung in the last two hours
  kentino.gpufleet.job_evidence:
    logs: ["/srv/train/logs/*.log"]
    since: -2h
  become: true
  register: gpufleet_job_evidence

- name: A job run as a systemd service, dumps in torch's default place
  kentino.gpufleet.job_evidence:
    journal_units: [train.service]
    dump_prefixes: [/tmp/nccl_trace_rank_]
  become: true
  register: gpufleet_job_evidence
"""

RETURN = r"""
host:
  description: The node's hostname, its clock (C(now), epoch seconds) and UTC offset (C(utc_offset_s)).
  returned: always
  type: str
now:
  description: The node's clock when the module ran (epoch seconds); the controller compares clocks.
  returned: always
  type: float
utc_offset_s:
  description: The node's local time offset from UTC in seconds (log lines carry local time).
  returned: always
  type: int
window:
  description: The window read (since, until, epoch seconds or null) and whether since came from O(lookback).
  returned: always
  type: dict
logs:
  description:
    - One entry per log file or journal unit - source (file or journal), path, unit, bytes, mtime, error, notes and
      parsed (the torch_watchdog result - timeouts, pg_status, heartbeat_kills, desync, terminate, elastic_summary,
      local_ranks, ranks_reporting, time_first, time_last, evidence - and what the same lines hold in other formats,
      desync_reports (torch's TORCH_NCCL_DESYNC_DEBUG report), ras (C(ncclras) output - communicators whose ranks
      launched different operation counts, dead processes), fr_analysis (C(torchfrtrace) output - missing ranks,
      culprit ranks)).
  returned: always
  type: list
  elements: dict
dumps:
  description:
    - One entry per dump file - path, prefix, rank, bytes, mtime, data_b64, skipped, error.
    - Through the action plugin, data_b64 is null and data_file names the controller-side file that holds the bytes
      (mode 0600 in a private directory; kentino.gpufleet.job_postmortem deletes it once read).
  returned: always
  type: list
  elements: dict
kernel:
  description:
    - source (journal, dmesg or none), error, events (XID events as kentino.gpufleet.xid_facts returns them, with
      time), lost_gpus, gpu_ids, unparsed.
  returned: always
  type: dict
gpus:
  description:
    - GPUs nvidia-smi reads - index, pci (dddd:bb:dd), uuid, name, throttle_reasons (now, not during the job), lost.
    - A lost GPU (its error printed in place of its row) is listed with lost=true and the index of that row.
  returned: always
  type: list
  elements: dict
gpu_problems:
  description: nvidia-smi problems, lost GPUs among them (kind, pci, message).
  returned: always
  type: list
  elements: dict
processes:
  description: Live torchrun workers - pid, command, env (only the rank and device variables).
  returned: always
  type: list
  elements: dict
errors:
  description: What could not be read, one message each naming the file or tool and the fix.
  returned: always
  type: list
  elements: str
notes:
  description: Remarks (nothing matched a glob, a log was read partly, a journal without --grep).
  returned: always
  type: list
  elements: str
"""

import datetime
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils.job_sources import (
    collect_dumps,
    expand,
    parse_when,
    read_journal_unit,
    read_log_file,
    resolve_user,
    scan_processes,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_reader import ReadError, read_kernel_log
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import QueryGpu, public_problems, spec
from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool

_LOST_ROW = re.compile(r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+)")
GPU_SPEC = spec("index", "pci", "uuid", "name", "throttle_reasons")


def read_kernel(module, mode, since, until, timeout):
    """XID events of the kernel log in [since, until] (journal across boots, else dmesg of this boot). Never fails the
    module: what could not be read is in `error`."""
    out = {"source": "none", "error": None, "events": [], "lost_gpus": [], "gpu_ids": {}, "unparsed": {},
           "tool": None}
    if mode == "none":
        return out
    try:
        read = read_kernel_log(
            mode, journalctl=find_tool(module, "journalctl") if mode in ("auto", "journal") else None,
            dmesg=find_tool(module, "dmesg") if mode in ("auto", "dmesg") else None,
            since=_aware(since), until=_aware(until), timeout_s=timeout, scanner_options={"max_events": 2000})
    except ReadError as exc:
        out["error"] = "; ".join(exc.notes + [str(exc)])
        out["tool"] = exc.tool
        return out
    facts = read.facts()
    out.update({"source": read.source, "tool": read.tool.as_dict() if read.tool is not None else None,
                "events": facts["events"], "lost_gpus": facts["lost_gpus"], "gpu_ids": facts["gpu_ids"],
                "unparsed": facts["unparsed"]})
    return out


def _aware(epoch):
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc) if epoch is not None else None


def read_gpus(module, timeout):
    exe = find_tool(module, "nvidia-smi")
    if not exe:
        return [], [{"kind": "tool_missing", "pci": None, "message": "nvidia-smi not found: no GPU map (install the "
                     "NVIDIA driver)"}]
    answer = QueryGpu(exe, GPU_SPEC, timeout).run()
    gpus = []
    for row in answer["gpus"]:
        gpus.append({"index": row.get("index"), "pci": normalize_pci(row.get("pci")) or row.get("pci"),
                     "uuid": row.get("uuid"), "name": row.get("name"), "throttle_reasons": row.get("throttle_reasons"),
                     "lost": False})
    # nvidia-smi prints a lost GPU's error in place of its row: the line's position is the GPU's index.
    tool = answer.get("tool")
    lines = [line for line in (tool.stdout if tool is not None else "").splitlines() if line.strip()]
    for position, line in enumerate(lines):
        match = _LOST_ROW.search(line)
        if match and not any(g["index"] == position for g in gpus):
            gpus.append({"index": position, "pci": normalize_pci(match.group(1)), "uuid": None, "name": None,
                         "throttle_reasons": None, "lost": True})
    gpus.sort(key=lambda g: (g["index"] is None, g["index"]))
    return gpus, public_problems(answer["problems"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            logs=dict(type="list", elements="str", default=[]),
            journal_units=dict(type="list", elements="str", default=[]),
            dump_prefixes=dict(type="list", elements="str", default=["/var/tmp/gpufleet-nccl-dumps/nccl_trace_rank_"]),
            since=dict(type="str"),
            until=dict(type="str"),
            lookback=dict(type="str", default="-24h"),
            kernel_log=dict(type="str", default="auto", choices=["auto", "journal", "dmesg", "none"]),
            nvidia_smi=dict(type="bool", default=True),
            scan_processes=dict(type="bool", default=True),
            max_dump_bytes=dict(type="int", default=64 * 1024 * 1024),
            max_dumps_total_bytes=dict(type="int", default=256 * 1024 * 1024),
            max_log_bytes=dict(type="int", default=2 * 1024 ** 3),
            timeout=dict(type="int", default=60),
            job_user=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    now = time.time()
    try:
        since, until = parse_when(p["since"], now), parse_when(p["until"], now)
        lookback = parse_when(p["lookback"], now)
        job_uid = resolve_user(p["job_user"])
    except ValueError as exc:
        module.fail_json(msg="job_evidence on %s: %s" % (os.uname()[1], exc))
    for key in ("max_dump_bytes", "max_dumps_total_bytes", "max_log_bytes", "timeout"):
        if p[key] <= 0:
            module.fail_json(msg="job_evidence: %s must be positive, got %s" % (key, p[key]))
    if since is not None and until is not None and until < since:
        module.fail_json(msg="job_evidence: until (%s) is before since (%s)" % (p["until"], p["since"]))
    errors, notes = [], []
    files, glob_notes = expand(p["logs"])
    notes.extend(glob_notes)
    logs = [read_log_file(path, since, until, p["max_log_bytes"], job_uid=job_uid) for path in files]
    jexe = find_tool(module, "journalctl") if p["journal_units"] else None
    if p["journal_units"] and not jexe:
        errors.append("journalctl not found: journal_units %s not read. Fix: install systemd or pass the log files "
                      "in logs" % ", ".join(p["journal_units"]))
    for unit in p["journal_units"] if jexe else []:
        logs.append(read_journal_unit(jexe, unit, since if since is not None else lookback, until, p["timeout"]))
    for log in logs:
        if log["error"]:
            errors.append(log["error"])
        notes.extend(log["notes"])
    dumps, dump_notes = collect_dumps(p["dump_prefixes"], p["max_dump_bytes"], p["max_dumps_total_bytes"], since,
                                      job_uid=job_uid)
    notes.extend(dump_notes)
    errors.extend(d["error"] for d in dumps if d["error"])
    kernel = read_kernel(module, p["kernel_log"], since if since is not None else lookback, until, p["timeout"])
    if kernel["error"]:
        errors.append(kernel["error"])
    gpus, problems = read_gpus(module, p["timeout"]) if p["nvidia_smi"] else ([], [])
    processes = []
    if p["scan_processes"]:
        processes, _denied = scan_processes()
        if processes:
            notes.append("%d torchrun worker process(es) still alive: the job is still hanging" % len(processes))
    offset = -(time.altzone if time.localtime(now).tm_isdst > 0 else time.timezone)
    module.exit_json(changed=False, host=os.uname()[1], now=now, utc_offset_s=offset,
                     window={"since": since, "until": until, "since_from_lookback": since is None,
                             "lookback_since": lookback},
                     logs=logs, dumps=dumps, kernel=kernel, gpus=gpus, gpu_problems=problems, processes=processes,
                     errors=errors, notes=notes)


if __name__ == "__main__":
    main()
