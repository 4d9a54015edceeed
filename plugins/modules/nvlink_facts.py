#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nvlink_facts
short_description: Gather NVSwitch, fabric manager, fabric state, NVLink and topology facts of a GPU node
description:
  - "Reads what decides whether the GPUs of an NVSwitch machine (HGX/DGX A100, H100, H200, B200) can talk to each
    other: whether the node has NVSwitches (NVIDIA PCI devices of class 0680, or the NVLink 5 switch-management
    bridges), the fabric manager's package version, systemd state and journal, each GPU's registration with the
    NVLink fabric (the C(Fabric) section of C(nvidia-smi -q): State, Status and Health), each NVLink's state and speed
    (C(nvidia-smi nvlink -s)), each NVLink's error counters (C(nvidia-smi nvlink -e): CRC, replay, recovery) and the
    connection matrix (C(nvidia-smi topo -m))."
  - Observations only; judgement is kentino.gpufleet's judge_nvlink (in the fleet report). Every figure is named with
    its unit or meaning (C(nvlink_links_up), C(nvlink_crc_errors_total), C(fabric_state)), so a history can read them
    from the schema C(plugins/plugin_utils/schemas/nvlink_facts.json).
  - GPUs are joined across the tools by UUID and PCI address (C(--query-gpu=index,pci.bus_id,uuid)), never by the
    order of their blocks.
  - A node without NVLink is not an error (its GPUs have C(nvlink_present) false); a tool that is missing, fails or
    times out is a problem in the result, never a module failure.
version_added: "0.2.0"
author:
  - kentino.gpufleet contributors
extends_documentation_fragment:
  - kentino.gpufleet.check_common
  - kentino.gpufleet.node_module
  - kentino.gpufleet.node_module.read_only
  - kentino.gpufleet.node_module.facts
options:
  gather:
    description:
      - What to read. V(platform) (NVSwitch detection from sysfs/procfs), V(fabric_manager) (systemctl and dpkg-query),
        V(gpus) (the GPU identities), V(fabric) (C(nvidia-smi -q)), V(nvlink) (C(nvidia-smi nvlink -s)), V(counters)
        (C(nvidia-smi nvlink -e)), V(topology) (C(nvidia-smi topo -m)).
      - V(fabric), V(nvlink), V(counters) and V(topology) read V(gpus) too.
    type: list
    elements: str
    choices: [platform, fabric_manager, gpus, fabric, nvlink, counters, topology]
    default: [platform, fabric_manager, gpus, fabric, nvlink, counters, topology]
  fabric_manager_service:
    description: The fabric manager's systemd unit.
    type: str
    default: nvidia-fabricmanager
  sysfs_root:
    description: Where sysfs is mounted (the simulated fleet points it at a prepared tree).
    type: path
    default: /sys
  procfs_root:
    description: Where procfs is mounted.
    type: path
    default: /proc
  baseline:
    description:
      - An earlier read of this module (its RV(ansible_facts.gpufleet_nvlink)), e.g. the one taken before a burn.
        Its error counters are kept in the result (C(baseline) in RV(ansible_facts.gpufleet_nvlink)) so that one
        result holds the counters before and after, and the rise between them can be judged.
    type: dict
notes:
  - O(executable) defaults to C(nvidia-smi) on E(PATH); O(timeout) applies to each call and defaults to 60 seconds.
  - C(systemctl), C(dpkg-query) and C(journalctl) are looked up on E(PATH); without them the fabric manager's state is
    reported as unknown with the reason. Its journal needs root or the C(systemd-journal) group.
seealso:
  - module: kentino.gpufleet.gpu_facts
  - name: The kentino.gpufleet.fabric_manager role
    description: Installs the fabric manager at the driver's version on NVSwitch machines and verifies the fabric.
    link: https://example.invalid/kentino/gpufleet/blob/main/docs/roles.md#fabric_manager
"""

EXAMPLES = r"""
- name: Read NVLink, fabric and topology facts
  kentino.gpufleet.nvlink_facts:

- name: Only decide whether this is an NVSwitch machine (no driver needed)
  kentino.gpufleet.nvlink_facts:
    gather: [platform]

- name: Read the counters again after a burn, keeping the earlier read for the rise
  kentino.gpufleet.nvlink_facts:
    baseline: "{{ gpufleet_nvlink_before.ansible_facts.gpufleet_nvlink }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts about the node's NVLink fabric.
  returned: always
  type: dict
  contains:
    gpufleet_nvlink:
      description:
        - "read_at (epoch seconds), gathered (what was read), driver_version, interconnect (V(nvswitch), V(nvlink),
          V(pcie), V(mixed) or null: how the node's GPUs reach each other), platform ({nvswitch, nvlink5, generation,
          nvswitch_pci, nvswitch_driver_devices, nvlink5_bridges, evidence}), fabric_manager ({service, load_state,
          active_state, sub_state, unit_file_state, exec_main_status, package, version, upstream_version,
          nscq_package, nscq_version, packages, errors, journal}), gpus, topology, baseline, problems, unparsed."
        - "fabric_manager.journal: {read, error, lines, events} from the unit's journal of this boot (the last
          300 entries of C(journalctl -u)); events: V(driver_version_mismatch) (the daemon's version and the
          driver's, as its start-up line names them) and V(no_nvswitch) (C(NV_WARN_NOTHING_TO_DO)), each with the
          raw line."
        - "Each GPU: index, pci (V(dddd:bb:dd)), uuid, name, fabric_state (V(completed), V(in_progress),
          V(not_started) ..., null when the GPU is not in an NVSwitch fabric), fabric_status (e.g. V(Success)),
          fabric_clique_id, fabric_cluster_uuid, fabric_health_summary (V(Healthy), V(Unhealthy), V(Limited Capacity)),
          fabric_health_bandwidth (V(Full), V(Degraded)), fabric_health_route_recovery, fabric_health_route_unhealthy,
          fabric_health_access_timeout_recovery (V(True), V(False)), fabric_health_incorrect_configuration
          (V(None) or the fault; null where the driver prints no such row), nvlink_present,
          nvlink_all_inactive, nvlink_links_total, nvlink_links_up, nvlink_links ([{link, up, speed_gbps}]),
          nvlink_counters ([{link, crc_errors, replay_errors, recovery_errors, counters}]), nvlink_crc_errors_total,
          nvlink_replay_errors_total, nvlink_recovery_errors_total, evidence (the raw lines)."
      type: dict
      sample:
        interconnect: nvswitch
        platform: {nvswitch: true, nvlink5: false, generation: nvswitch}
        fabric_manager: {service: nvidia-fabricmanager, active_state: active, package: nvidia-fabricmanager-570,
                         upstream_version: "570.172.08"}
        gpus:
          - index: 0
            pci: "0000:18:00"
            fabric_state: completed
            fabric_status: Success
            nvlink_links_total: 18
            nvlink_links_up: 18
            nvlink_crc_errors_total: 0
nvidia_smi:
  description: Evidence of how the facts were read.
  returned: always
  type: dict
  contains:
    calls:
      description: Each tool invocation (argv, rc, timed_out, duration_s, error).
      type: list
      elements: dict
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kentino.gpufleet.plugins.module_utils import fabric_manager, nvswitch_platform
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import check_argument_spec, resolve_timeout
from ansible_collections.kentino.gpufleet.plugins.module_utils.fabric_manager_log import parse_fabric_manager_log
from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import journal_record
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi import parse_q
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_nvlink import (
    FABRIC_HEALTH,
    link_totals,
    parse_nvlink_errors,
    parse_nvlink_status,
    q_fabric,
)
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_query import QueryGpu, public_problems
from ansible_collections.kentino.gpufleet.plugins.module_utils.nvidia_smi_topo import parse_topo_matrix
from ansible_collections.kentino.gpufleet.plugins.module_utils.pci import normalize_pci
from ansible_collections.kentino.gpufleet.plugins.module_utils.tool_runner import find_tool, run_tool

GATHER = ("platform", "fabric_manager", "gpus", "fabric", "nvlink", "counters", "topology")
IDENTITY_SPEC = (("index", ("index",)), ("pci", ("pci.bus_id",)), ("uuid", ("uuid",)), ("name", ("name",)),
                 ("driver_version", ("driver_version",)))
MAX_EVIDENCE = 40
# The fabric manager's journal of this boot: its start is at the top, its repeated restarts at the end.
JOURNAL_LINES = 300


def _problem(kind, message, pci=None, index=None):
    return {"kind": kind, "message": message, "pci": pci, "index": index}


class Reader:
    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.calls = []
        self.problems = []
        self.unparsed = {}

    def run(self, argv, what):
        result = run_tool(argv, self.params["timeout"])
        self.calls.append(result.as_dict())
        if result.error is not None or result.timed_out:
            self.problems.append(_problem("tool_error", "%s: %s" % (what, result.error or "timed out after %ss (a hung "
                                          "driver or a lost GPU)" % self.params["timeout"])))
            return None
        return result

    # ---- the fabric manager: systemd and dpkg ------------------------------------------------------------------
    def fabric_manager(self):
        unit = self.params["fabric_manager_service"]
        out = {"service": unit, "load_state": None, "active_state": None, "sub_state": None, "unit_file_state": None,
               "exec_main_status": None, "package": None, "version": None, "upstream_version": None,
               "nscq_package": None, "nscq_version": None, "packages": [], "errors": []}
        systemctl = find_tool(self.module, "systemctl")
        if systemctl is None:
            out["errors"].append("systemctl not found: the service state is unknown")
        else:
            argv = [systemctl, "show", unit] + ["--property=%s" % p for p in fabric_manager.SHOW_PROPERTIES]
            res = self.run(argv, "systemctl show %s" % unit)
            if res is not None:
                props = fabric_manager.parse_systemctl_show(res.stdout)
                if res.rc != 0 or not props:
                    out["errors"].append("systemctl show %s exited %s: %s" % (unit, res.rc, (res.stderr or res.stdout)
                                                                               .strip()[:200]))
                out.update({"load_state": props.get("LoadState") or None, "active_state": props.get("ActiveState")
                            or None, "sub_state": props.get("SubState") or None,
                            "unit_file_state": props.get("UnitFileState") or None,
                            "exec_main_status": props.get("ExecMainStatus") or None})
        if out["load_state"] != "not-found":
            out["journal"] = self.fabric_manager_journal(unit)
        dpkg = find_tool(self.module, "dpkg-query")
        if dpkg is None:
            out["errors"].append("dpkg-query not found: the installed package versions are unknown")
            return out
        res = self.run([dpkg, "-W", "-f=" + fabric_manager.DPKG_FORMAT.replace("\\t", "\t").replace("\\n", "\n")]
                       + list(fabric_manager.DPKG_PATTERNS), "dpkg-query")
        if res is None:
            return out
        packages = fabric_manager.parse_dpkg_query(res.stdout)
        out["packages"] = packages
        fm, nscq = fabric_manager.installed_fabric_manager(packages)
        if fm:
            out.update({"package": fm["package"], "version": fm["version"],
                        "upstream_version": fabric_manager.upstream_version(fm["version"])})
        if nscq:
            out.update({"nscq_package": nscq["package"], "nscq_version": nscq["version"]})
        return out

    def fabric_manager_journal(self, unit):
        """What the fabric manager logged this boot (its last JOURNAL_LINES entries): why it exited at start."""
        out = {"read": False, "error": None, "lines": 0, "events": []}
        journalctl = find_tool(self.module, "journalctl")
        if journalctl is None:
            out["error"] = "journalctl not found: the fabric manager's journal was not read"
            return out
        res = self.run([journalctl, "-u", unit, "-b", "-n", str(JOURNAL_LINES), "-o", "json", "--no-pager", "--all",
                        "--output-fields=MESSAGE"], "journalctl -u %s" % unit)
        if res is None:
            out["error"] = "journalctl -u %s did not answer (see problems)" % unit
            return out
        if res.rc != 0:
            out["error"] = "journalctl -u %s exited %s: %s" % (unit, res.rc, (res.stderr or "").strip()[:200])
            return out
        if "not seeing messages from other users and the system" in (res.stderr or ""):
            out["error"] = ("the fabric manager's journal is not readable by this user (run the check with become: "
                            "true, or add the user to the systemd-journal group)")
        messages = []
        for line in res.stdout.splitlines():
            rec = journal_record(line)
            when = rec.realtime_us / 1e6 if rec.realtime_us is not None else None
            messages += [(m, when) for m in rec.messages]
        parsed = parse_fabric_manager_log(messages)
        out.update({"read": out["error"] is None, "lines": parsed["lines"], "events": parsed["events"]})
        return out

    # ---- nvidia-smi ----------------------------------------------------------------------------------------------
    def gpus(self, executable):
        query = QueryGpu(executable, IDENTITY_SPEC, self.params["timeout"])
        answer = query.run()
        self.calls.extend(query.calls)
        self.problems.extend(public_problems(answer["problems"]))
        self.unparsed["query_gpu"] = answer["unparsed"]
        gpus = []
        for row in answer["gpus"]:
            gpus.append({"index": row.get("index"), "pci": row.get("pci"), "uuid": row.get("uuid"),
                         "name": row.get("name"), "driver_version": row.get("driver_version")})
        return gpus

    def smi(self, executable, args, what, parser, key):
        res = self.run([executable] + args, "nvidia-smi %s" % " ".join(args))
        if res is None:
            return None
        parsed = parser(res.stdout)
        self.problems.extend(public_problems(parsed["problems"]))
        self.unparsed[key] = parsed["unparsed"]
        if res.rc != 0 and not parsed.get("gpus") and not parsed.get("devices"):
            self.problems.append(_problem("tool_error", "nvidia-smi %s exited %s: %s" % (
                " ".join(args), res.rc, (res.stderr or res.stdout).strip()[:300] or "no output")))
            return None
        return parsed


def _gpu_entry(ident):
    return {"index": ident["index"], "pci": ident["pci"], "uuid": ident["uuid"], "name": ident["name"],
            "fabric_state": None, "fabric_status": None, "fabric_clique_id": None, "fabric_cluster_uuid": None,
            "fabric_health_summary": None, "fabric_health_bandwidth": None, "fabric_health_route_recovery": None,
            "fabric_health_route_unhealthy": None, "fabric_health_access_timeout_recovery": None,
            "fabric_health_incorrect_configuration": None, "nvlink_present": None,
            "nvlink_all_inactive": None, "nvlink_links_total": None, "nvlink_links_up": None, "nvlink_links": None,
            "nvlink_counters": None, "nvlink_crc_errors_total": None, "nvlink_replay_errors_total": None,
            "nvlink_recovery_errors_total": None, "evidence": []}


def _match(entries, block):
    """The GPU entry of a block from another tool: by UUID, else by index (both name nvidia-smi's own GPUs)."""
    if block.get("uuid"):
        found = next((g for g in entries if g["uuid"] and g["uuid"] == block["uuid"]), None)
        if found is not None:
            return found
    return next((g for g in entries if g["index"] == block.get("index")), None)


def _apply_status(entries, parsed, problems):
    for block in parsed["gpus"]:
        gpu = _match(entries, block)
        if gpu is None:
            problems.append(_problem("unknown_gpu", "nvidia-smi nvlink -s names GPU %s (%s) that --query-gpu did not "
                                     "list" % (block["index"], block.get("uuid")), index=block["index"]))
            continue
        links = [{"link": link["link"], "up": link["up"], "speed_gbps": link["speed_gbps"]} for link in block["links"]]
        gpu["nvlink_links"] = links
        gpu["nvlink_all_inactive"] = block["all_inactive"]
        gpu["nvlink_present"] = bool(links) or block["all_inactive"]
        gpu["nvlink_links_total"] = len(links) if links else None
        gpu["nvlink_links_up"] = sum(1 for link in links if link["up"]) if links else (0 if block["all_inactive"]
                                                                                        else None)
        gpu["evidence"].extend(block["lines"])
    for gpu in entries:
        if gpu["nvlink_present"] is None:
            gpu["nvlink_present"] = False  # the tool answered and listed no link of this GPU: no NVLink


def _apply_counters(entries, parsed, problems):
    for block in parsed["gpus"]:
        gpu = _match(entries, block)
        if gpu is None:
            problems.append(_problem("unknown_gpu", "nvidia-smi nvlink -e names GPU %s (%s) that --query-gpu did not "
                                     "list" % (block["index"], block.get("uuid")), index=block["index"]))
            continue
        counters = []
        sums = {"crc": None, "replay": None, "recovery": None}
        for link in sorted(block["links"]):
            totals = link_totals(block["links"][link])
            counters.append({"link": link, "crc_errors": totals["crc"], "replay_errors": totals["replay"],
                             "recovery_errors": totals["recovery"], "counters": block["links"][link]})
            for kind in sums:
                if totals[kind] is not None:
                    sums[kind] = (sums[kind] or 0) + totals[kind]
        gpu["nvlink_counters"] = counters
        gpu["nvlink_crc_errors_total"] = sums["crc"]
        gpu["nvlink_replay_errors_total"] = sums["replay"]
        gpu["nvlink_recovery_errors_total"] = sums["recovery"]
        # The counter lines are many (3 per link): keep the non-zero ones as evidence.
        gpu["evidence"].extend(line for line in block["lines"] if not line.rstrip().endswith(": 0"))


def _apply_fabric(entries, parsed):
    by_pci = dict((normalize_pci(b["pci"]), b) for b in parsed["gpus"] if b.get("pci"))
    for gpu in entries:
        block = by_pci.get(gpu["pci"])
        if block is None:
            continue
        fabric = q_fabric(block["entries"])
        gpu.update({"fabric_state": fabric["state"], "fabric_status": fabric["status"],
                    "fabric_clique_id": fabric["clique_id"], "fabric_cluster_uuid": fabric["cluster_uuid"]})
        gpu.update(("fabric_" + row, fabric[row]) for row in FABRIC_HEALTH)
        if fabric["raw"]:
            gpu["evidence"].append("Fabric: " + ", ".join("%s=%s" % kv for kv in sorted(fabric["raw"].items())))


def _topology(parsed):
    if parsed is None:
        return None
    return {"devices": parsed["devices"], "gpus": parsed["gpus"],
            "matrix": dict((row, dict(cells)) for row, cells in parsed["matrix"].items()),
            "pairs": parsed["pairs"], "nics": parsed["nics"], "interconnect": parsed["interconnect"],
            "affinity": dict((str(k), v) for k, v in parsed["affinity"].items())}


def _baseline(value, problems):
    """The counters of an earlier read (this module's fact), or None when there is none or it is malformed."""
    if not value:
        return None
    try:
        gpus = []
        for gpu in value.get("gpus") or []:
            counters = [{"link": int(c["link"]), "crc_errors": c.get("crc_errors"), "replay_errors":
                         c.get("replay_errors"), "recovery_errors": c.get("recovery_errors")}
                        for c in gpu.get("nvlink_counters") or []]
            gpus.append({"index": gpu.get("index"), "pci": gpu.get("pci"), "uuid": gpu.get("uuid"),
                         "nvlink_counters": counters if gpu.get("nvlink_counters") is not None else None})
        return {"read_at": float(value["read_at"]), "gpus": gpus}
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        problems.append(_problem("baseline_invalid", "baseline is not an earlier nvlink_facts read (%s: %s): the "
                                 "counters' rise cannot be computed" % (type(exc).__name__, exc)))
        return None


def _interconnect(platform, entries, topology):
    if platform and platform.get("nvswitch"):
        return "nvswitch"
    if any(g["fabric_state"] for g in entries):
        return "nvswitch"  # a GPU registers with a fabric only on an NVSwitch machine
    if topology and topology.get("interconnect"):
        return topology["interconnect"]
    if any(g["nvlink_links_up"] for g in entries):
        return "nvlink"
    return None


def main():
    module = AnsibleModule(
        argument_spec=check_argument_spec(
            gather=dict(type="list", elements="str", choices=list(GATHER), default=list(GATHER)),
            fabric_manager_service=dict(type="str", default=fabric_manager.SERVICE),
            sysfs_root=dict(type="path", default="/sys"),
            procfs_root=dict(type="path", default="/proc"),
            baseline=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    resolve_timeout(module, 60)
    gather = set(params["gather"])
    if gather & {"fabric", "nvlink", "counters", "topology"}:
        gather.add("gpus")
    reader = Reader(module)
    facts = {"read_at": round(time.time(), 3), "gathered": [g for g in GATHER if g in gather], "driver_version": None,
             "interconnect": None, "platform": None, "fabric_manager": None, "gpus": [], "topology": None,
             "baseline": _baseline(params["baseline"], reader.problems), "problems": [], "unparsed": {}}
    if "platform" in gather:
        facts["platform"] = nvswitch_platform.detect(params["sysfs_root"], params["procfs_root"])
    if "fabric_manager" in gather:
        facts["fabric_manager"] = reader.fabric_manager()
    executable = None
    if "gpus" in gather:
        executable = find_tool(module, "nvidia-smi", params["executable"])
        if executable is None:
            reader.problems.append(_problem("tool_missing", "install the NVIDIA driver (nvidia-smi not found%s)" % (
                " at %s" % params["executable"] if params["executable"] else " on PATH")))
    topo = None
    if executable:
        idents = reader.gpus(executable)
        entries = [_gpu_entry(i) for i in idents]
        facts["driver_version"] = next((i["driver_version"] for i in idents if i["driver_version"]), None)
        facts["gpus"] = entries
        if entries and "fabric" in gather:
            parsed = reader.smi(executable, ["-q"], "fabric", parse_q, "q")
            if parsed is not None:
                _apply_fabric(entries, parsed)
                facts["driver_version"] = facts["driver_version"] or parsed.get("driver_version")
        if entries and "nvlink" in gather:
            parsed = reader.smi(executable, ["nvlink", "--status"], "nvlink", parse_nvlink_status, "nvlink_status")
            if parsed is not None:
                _apply_status(entries, parsed, reader.problems)
        if entries and "counters" in gather:
            parsed = reader.smi(executable, ["nvlink", "--errorcounters"], "counters", parse_nvlink_errors,
                                "nvlink_errors")
            if parsed is not None:
                _apply_counters(entries, parsed, reader.problems)
        if entries and "topology" in gather:
            topo = _topology(reader.smi(executable, ["topo", "-m"], "topology", parse_topo_matrix, "topo"))
            facts["topology"] = topo
        for gpu in entries:
            gpu["evidence"] = gpu["evidence"][:MAX_EVIDENCE]
    facts["interconnect"] = _interconnect(facts["platform"], facts["gpus"], topo)
    facts["problems"] = public_problems(reader.problems)
    facts["unparsed"] = reader.unparsed
    module.exit_json(changed=False, ansible_facts={"gpufleet_nvlink": facts}, nvidia_smi={"calls": reader.calls})


if __name__ == "__main__":
    main()
