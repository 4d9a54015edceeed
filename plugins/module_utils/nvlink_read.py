# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""NVSwitch, fabric manager, fabric state, NVLink and topology reads of a GPU node (stdlib only: runs on the node).

kentino.gpufleet.nvlink_facts returns read()'s fact; kentino.gpufleet.health_snapshot (mode identity, nvlink_mark)
takes the burn-in's read before the burn (MARK_GATHER) in its own round trip. Observations only: judge_nvlink judges.
GPUs are joined across the tools by UUID, else by nvidia-smi's index, never by the order of their blocks.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.kentino.gpufleet.plugins.module_utils import fabric_manager, nvswitch_platform
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
# What a burn-in reads before the burn: whether this is an NVLink machine at all, the fabric manager (should the read
# after the burn fail, links down because it stopped are judged as that), the links and their error counters (the
# baseline of the read after it). The fabric registration (`nvidia-smi -q`) and the topology (`topo -m`), seconds
# each on an 8-GPU node, are read once, after the burn.
MARK_GATHER = ("platform", "fabric_manager", "gpus", "nvlink", "counters")


def _problem(kind, message, pci=None, index=None):
    return {"kind": kind, "message": message, "pci": pci, "index": index}


class Reader:
    """Runs the tools: params as nvlink_facts' options; timeout: seconds per call, or a function giving them (the
    snapshot's budget cuts each call to what is left)."""

    def __init__(self, module, params, timeout):
        self.module = module
        self.params = params
        self.timeout = timeout if callable(timeout) else (lambda: timeout)
        self.calls = []
        self.problems = []
        self.unparsed = {}

    def run(self, argv, what):
        timeout = self.timeout()
        result = run_tool(argv, timeout)
        self.calls.append(result.as_dict())
        if result.error is not None or result.timed_out:
            self.problems.append(_problem("tool_error", "%s: %s" % (what, result.error or "timed out after %ss (a hung "
                                          "driver or a lost GPU)" % timeout)))
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
        query = QueryGpu(executable, IDENTITY_SPEC, self.timeout())
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


def _matched(entries, parsed, problems, tool):
    """(GPU entry, block) for each block of another tool's output; a block of a GPU --query-gpu did not list is a
    problem, never a guess."""
    for block in parsed["gpus"]:
        gpu = _match(entries, block)
        if gpu is None:
            problems.append(_problem("unknown_gpu", "%s names GPU %s (%s) that --query-gpu did not list" % (
                tool, block["index"], block.get("uuid")), index=block["index"]))
            continue
        yield gpu, block


def _apply_status(entries, parsed, problems):
    for gpu, block in _matched(entries, parsed, problems, "nvidia-smi nvlink -s"):
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
    for gpu, block in _matched(entries, parsed, problems, "nvidia-smi nvlink -e"):
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


def read(module, params, gather, timeout):
    """(the gpufleet_nvlink fact, the tool calls) for params (nvlink_facts' options: executable,
    fabric_manager_service, sysfs_root, procfs_root, baseline) and gather (names of GATHER). Never raises for a tool:
    what could not be read is a problem in the fact."""
    gather = set(gather)
    if gather & {"fabric", "nvlink", "counters", "topology"}:
        gather.add("gpus")
    reader = Reader(module, params, timeout)
    facts = {"read_at": round(time.time(), 3), "gathered": [g for g in GATHER if g in gather], "driver_version": None,
             "interconnect": None, "platform": None, "fabric_manager": None, "gpus": [], "topology": None,
             "baseline": _baseline(params.get("baseline"), reader.problems), "problems": [], "unparsed": {}}
    if "platform" in gather:
        facts["platform"] = nvswitch_platform.detect(params["sysfs_root"], params["procfs_root"])
    if "fabric_manager" in gather:
        facts["fabric_manager"] = reader.fabric_manager()
    executable = None
    if "gpus" in gather:
        executable = find_tool(module, "nvidia-smi", params.get("executable"))
        if executable is None:
            reader.problems.append(_problem("tool_missing", "install the NVIDIA driver (nvidia-smi not found%s)" % (
                " at %s" % params["executable"] if params.get("executable") else " on PATH")))
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
    return facts, reader.calls


def registered(module, params, gather, timeout):
    """nvlink_facts' result for read()'s arguments: the fact and the tool calls. The nvlink_facts module and the burn's
    job (gpu_burn's nvlink_after, the read after the load) return it alike."""
    facts, calls = read(module, params, gather, timeout)
    return {"changed": False, "ansible_facts": {"gpufleet_nvlink": facts}, "nvidia_smi": {"calls": calls}}
