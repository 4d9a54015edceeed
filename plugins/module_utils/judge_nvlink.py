# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge an nvlink_facts read: the fabric manager, each GPU's fabric registration, each NVLink's state and speed, and
the NVLink error counters' rise during the run (stdlib only: runs on the node and on the controller).

On an NVSwitch machine nothing that uses CUDA works until the fabric manager, at exactly the driver's version, has
registered every GPU with the fabric (CUDA error 802 "system not yet initialized" otherwise); a link that is down or
trained at a lower speed only shows as a slow all_reduce. Counter policy from NVIDIA's DCGM health watch
(dcgm_gpu_hardware_limits.h, DcgmHealthWatch.cpp): any replay or recovery error is a failure; CRC errors matter at
100 per second and above, fewer only warn. A node without NVLink and without NVSwitches has nothing to judge here.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.fabric_manager import upstream_version
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding, gpu_label
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door

CHECK = "nvlink"
# The thresholds (inventory names, module_utils/thresholds.py) this judge reads: what a module passes it.
THRESHOLDS = ("gpufleet_nvlink_crc_fail_per_s", "gpufleet_nvlink_replay_recovery_fail",
              "gpufleet_nvlink_min_link_speed_gbps", "gpufleet_nvlink_links_per_gpu")

# Every finding this judge can return: code -> (severity, what it means). docs/rules.md is generated from these.
CODES = {
    "FABRIC_MANAGER_MISSING": ("fail", "an NVSwitch machine without the fabric manager package and service: CUDA "
                                       "cannot initialise (error 802)"),
    "FABRIC_MANAGER_STOPPED": ("fail", "the fabric manager is installed but its service is not running"),
    "FABRIC_MANAGER_NOT_ENABLED": ("warn", "the fabric manager runs but is not enabled: it will not start after a "
                                           "reboot"),
    "FABRIC_MANAGER_VERSION_MISMATCH": ("fail", "the fabric manager's version differs from the driver's (it exits at "
                                                "start), from its package or its own journal; the versions and the "
                                                "package to install shown"),
    "FABRIC_NSCQ_VERSION_MISMATCH": ("warn", "libnvidia-nscq differs from the driver's version: DCGM cannot read the "
                                             "NVSwitches"),
    "FABRIC_MANAGER_UNREADABLE": ("error", "the fabric manager's service or package state could not be read"),
    "FABRIC_STATE_INCOMPLETE": ("fail", "a GPU's fabric state is not Completed with Success: it is not registered with "
                                        "the NVLink fabric"),
    "FABRIC_HEALTH_UNHEALTHY": ("fail", "a GPU registered with the fabric (Completed, Success) whose fabric health is "
                                        "Unhealthy: a route unhealthy or recovering, an access timeout recovery, an "
                                        "incorrect configuration"),
    "FABRIC_BANDWIDTH_DEGRADED": ("fail", "a GPU registered with the fabric whose fabric bandwidth is degraded "
                                          "(Health Summary Limited Capacity, Bandwidth Degraded)"),
    "NVLINK_LINK_DOWN": ("fail", "an NVLink is down (or missing next to the GPU's peers): the GPU pair and link named"),
    "NVLINK_LINK_SLOW": ("fail", "an NVLink runs below its rated speed (gpufleet_nvlink_min_link_speed_gbps, else the "
                                 "node's fastest link of the same GPU model)"),
    "NVLINK_ERRORS_RISING": ("warn", "NVLink CRC errors rose during the run, below gpufleet_nvlink_crc_fail_per_s"),
    "NVLINK_ERRORS_HIGH": ("fail", "NVLink replay/recovery errors rose by gpufleet_nvlink_replay_recovery_fail or more, "
                                   "or CRC errors at gpufleet_nvlink_crc_fail_per_s or more, during the run"),
    "NVLINK_UNREADABLE": ("error", "an NVSwitch machine whose NVLink or fabric state could not be read"),
}
SPEED_TOLERANCE = 0.01  # 26.562 and 26.56 are the same rate


def _gpus(result):
    return [g for g in result.get("gpus") or [] if isinstance(g, dict)]


def is_nvswitch(result):
    platform = result.get("platform") or {}
    return bool(platform.get("nvswitch") or result.get("interconnect") == "nvswitch"
                or any(g.get("fabric_state") for g in _gpus(result)))


def has_nvlink(result):
    return is_nvswitch(result) or any(g.get("nvlink_present") for g in _gpus(result))


def not_applicable(result):
    """Why there is nothing to judge (None when there is)."""
    if not isinstance(result, dict):
        return None
    if has_nvlink(result):
        return None
    if not _gpus(result) and "gpus" in (result.get("gathered") or []):
        return None  # nvidia-smi listed no GPU: unknown, not "no NVLink"
    return "no NVLink and no NVSwitch on this node (%s)" % (result.get("interconnect") or "PCIe only")


def _label(host, gpu):
    return gpu_label(host, gpu.get("index"), gpu.get("pci"))


def _evidence(gpu, extra=()):
    return list(extra) + list(gpu.get("evidence") or [])[:8]


def _fm_findings(result, host):
    fm = result.get("fabric_manager")
    nvlink5 = bool((result.get("platform") or {}).get("nvlink5"))
    if not isinstance(fm, dict):
        return [], None
    driver = result.get("driver_version")
    unit = fm.get("service") or "nvidia-fabricmanager"
    state = "%s: LoadState=%s ActiveState=%s SubState=%s UnitFileState=%s" % (
        unit, fm.get("load_state"), fm.get("active_state"), fm.get("sub_state"), fm.get("unit_file_state"))
    packages = ["%s %s %s" % (p.get("package"), p.get("version"), p.get("status")) for p in fm.get("packages") or []
                if isinstance(p, dict)]
    evidence = [state] + packages
    install = ("install the fabric manager at exactly the driver's version %s with kentino.gpufleet.fabric_manager "
               "(ansible-playbook kentino.gpufleet.provision --tags fabric_manager), which also holds it with the "
               "driver" % (driver or "(unknown: load the driver first)"))
    out = []
    installed = fm.get("package") is not None
    if fm.get("errors") and not installed and fm.get("active_state") is None:
        out.append(finding("error", "FABRIC_MANAGER_UNREADABLE", "%s: the fabric manager's state could not be read: %s"
                           % (host, "; ".join(fm["errors"])), "make systemctl and dpkg-query runnable for the user "
                           "the checks run as on %s, then rerun" % host, fm["errors"] + evidence))
        return out, "unknown"
    if not installed and fm.get("active_state") != "active" and fm.get("load_state") in (None, "not-found"):
        out.append(finding("fail", "FABRIC_MANAGER_MISSING", "%s: NVSwitch machine without the fabric manager (no "
                           "package, no %s unit): CUDA cannot initialise its GPUs (error 802, system not yet "
                           "initialized)" % (host, unit), install, evidence))
        return out, "missing"
    verdict = "active" if fm.get("active_state") == "active" else "stopped"
    # Its own journal says why it exited (only while it is not running: an older line was fixed since).
    logged = [e for e in (fm.get("journal") or {}).get("events") or [] if isinstance(e, dict)] \
        if verdict == "stopped" else []
    logged_mismatch = next((e for e in reversed(logged) if e.get("kind") == "driver_version_mismatch"), None)
    fm_version = fm.get("upstream_version") or upstream_version(fm.get("version"))
    if installed and driver and fm_version and fm_version != driver:
        out.append(finding("fail", "FABRIC_MANAGER_VERSION_MISMATCH", "%s: fabric manager %s %s does not match the "
                           "driver %s (the fabric manager refuses to run with another driver version)" % (
                               host, fm.get("package"), fm_version, driver),
                           "%s: %s=%s-*, then systemctl restart %s (or bring the driver back to %s)" % (
                               install, fm.get("package"), driver, unit, fm_version),
                           evidence + ([logged_mismatch["line"]] if logged_mismatch else [])))
        verdict = "mismatch"
    elif logged_mismatch:
        wanted = logged_mismatch.get("driver_version") or driver
        out.append(finding("fail", "FABRIC_MANAGER_VERSION_MISMATCH", "%s: the fabric manager exited at start: its "
                           "driver interface version %s does not match the driver %s (its journal says so)" % (
                               host, logged_mismatch.get("fabric_manager_version"), wanted),
                           "install the fabric manager at exactly the driver's version %s (kentino.gpufleet."
                           "fabric_manager, or the fabric manager package or container of driver %s), then systemctl "
                           "restart %s; or bring the driver back to %s" % (
                               wanted, wanted, unit, logged_mismatch.get("fabric_manager_version")),
                           [logged_mismatch["line"]] + evidence))
        verdict = "mismatch"
    nothing_to_do = next((e for e in reversed(logged) if e.get("kind") == "no_nvswitch"), None)
    nscq = upstream_version(fm.get("nscq_version"))
    if driver and nscq and nscq != driver:
        out.append(finding("warn", "FABRIC_NSCQ_VERSION_MISMATCH", "%s: %s %s does not match the driver %s: DCGM "
                           "cannot monitor the NVSwitches" % (host, fm.get("nscq_package"), nscq, driver),
                           "install %s=%s-* (kentino.gpufleet.fabric_manager installs it with the fabric manager)" % (
                               fm.get("nscq_package"), driver), evidence))
    if fm.get("active_state") != "active" and nothing_to_do:
        out.append(finding("fail", "FABRIC_MANAGER_STOPPED", "%s: the fabric manager (%s) is %s/%s: it found no "
                           "NVSwitch to manage (NV_WARN_NOTHING_TO_DO) on a machine that has them, so the GPUs cannot "
                           "register with the NVLink fabric and CUDA fails with error 802" % (
                               host, unit, fm.get("active_state"), fm.get("sub_state")),
                           "%s, then systemctl restart %s on %s" % (
                               "install and start NVLSM (nvlsm, with infiniband-diags; kentino.gpufleet.fabric_manager "
                               "does on NVLink 5 machines): the NVSwitches are managed through it"
                               if nvlink5 else "check that the NVSwitch driver lists the switches "
                               "(/proc/driver/nvidia-nvswitch/devices; lspci -d 10de: shows them) and that its "
                               "version is the driver's", unit, host),
                           [nothing_to_do["line"]] + evidence))
    elif fm.get("active_state") != "active":
        out.append(finding("fail", "FABRIC_MANAGER_STOPPED", "%s: the fabric manager (%s) is %s/%s: the GPUs cannot "
                           "register with the NVLink fabric and CUDA fails with error 802" % (
                               host, unit, fm.get("active_state"), fm.get("sub_state")),
                           "systemctl enable --now %s on %s; if it exits again, journalctl -u %s says why (a version "
                           "other than the driver's; on NVLink 5 machines NVLSM missing)" % (unit, host, unit),
                           evidence + [e["line"] for e in logged[-2:]]))
    elif fm.get("unit_file_state") not in (None, "enabled", "static", "enabled-runtime", "alias"):
        out.append(finding("warn", "FABRIC_MANAGER_NOT_ENABLED", "%s: %s runs but is %s: after a reboot the GPUs stay "
                           "unregistered" % (host, unit, fm.get("unit_file_state")),
                           "systemctl enable %s on %s (kentino.gpufleet.fabric_manager does)" % (unit, host),
                           evidence))
    return out, verdict


# The fabric health rows (nvidia-smi -q Fabric > Health; nvidia_smi_nvlink.FABRIC_HEALTH) as -q labels them.
_HEALTH_ROWS = (("fabric_health_summary", "Summary"), ("fabric_health_bandwidth", "Bandwidth"),
                ("fabric_health_route_recovery", "Route Recovery in progress"),
                ("fabric_health_route_unhealthy", "Route Unhealthy"),
                ("fabric_health_access_timeout_recovery", "Access Timeout Recovery"),
                ("fabric_health_incorrect_configuration", "Incorrect Configuration"))
_HEALTH_CONDITIONS = (("fabric_health_route_unhealthy", "route unhealthy"),
                      ("fabric_health_route_recovery", "route recovery in progress"),
                      ("fabric_health_access_timeout_recovery", "access timeout recovery in progress"))


def _word(gpu, key):
    return " ".join(str(gpu.get(key) or "").split())


def _health_finding(gpu, host):
    """The finding of a registered GPU's fabric health, or None when it is healthy or not reported (older drivers
    print no Summary, or Bandwidth alone)."""
    summary = _word(gpu, "fabric_health_summary")
    conditions = [name for key, name in _HEALTH_CONDITIONS if _word(gpu, key).lower() in ("true", "yes")]
    config = _word(gpu, "fabric_health_incorrect_configuration")
    if config and config.lower() not in ("none", "not supported"):
        conditions.append("incorrect configuration %s" % config)
    degraded = summary.lower() == "limited capacity" or _word(gpu, "fabric_health_bandwidth").lower() == "degraded"
    if summary.lower() != "unhealthy" and not conditions and not degraded:
        return None
    evidence = _evidence(gpu, ["Fabric health: " + ", ".join("%s=%s" % (label, gpu.get(key)) for key, label in
                                                            _HEALTH_ROWS if gpu.get(key) is not None)])
    where = _label(host, gpu)
    index = gpu.get("index")
    if summary.lower() == "unhealthy" or conditions:
        if conditions and all("recover" in c for c in conditions):
            action = ("the fabric is recovering: rerun the check on %s in a few minutes; if GPU %s stays Unhealthy, "
                      "read journalctl -u nvidia-fabricmanager and nvidia-smi nvlink -s -i %s, reset the GPU or "
                      "reboot" % (host, index, index))
        elif any(c.startswith("incorrect configuration") for c in conditions):
            action = ("the fabric's configuration does not fit GPU %s (%s): check its NVLink partition, the "
                      "chassis serial and the GPU firmware against the fabric manager's log (journalctl -u "
                      "nvidia-fabricmanager) before it runs jobs" % (index, config))
        else:
            action = ("read nvidia-smi nvlink -s and -e -i %s on %s for links down or erroring and journalctl -u "
                      "nvidia-fabricmanager; reset the GPU or reboot; if it stays Unhealthy, service its NVLink path "
                      "(GPU module, NVSwitch baseboard or tray)" % (index, host))
        return finding("fail", "FABRIC_HEALTH_UNHEALTHY", "%s: registered with the NVLink fabric (Completed, "
                       "Success) but its fabric health is %s%s" % (
                           where, summary or "not summarised", (": " + ", ".join(conditions)) if conditions else ""),
                       action, evidence, gpu=index, pci=gpu.get("pci"))
    return finding("fail", "FABRIC_BANDWIDTH_DEGRADED", "%s: its NVLink fabric bandwidth is degraded (Summary %s, "
                   "Bandwidth %s): collectives through it run below the platform's rate" % (
                       where, summary or "not printed", _word(gpu, "fabric_health_bandwidth") or "not printed"),
                   "nvidia-smi nvlink -s -i %s on %s shows which links are down or slow; reset the GPU or reboot to "
                   "retrain them; if it stays degraded, reseat or service the GPU module or the NVSwitch baseboard"
                   % (index, host), evidence, gpu=index, pci=gpu.get("pci"))


def _fabric_findings(result, host, fm_verdict):
    out = []
    for gpu in _gpus(result):
        state, status = gpu.get("fabric_state"), gpu.get("fabric_status")
        if state == "completed" and (status or "").lower() == "success":
            health = _health_finding(gpu, host)
            out += [health] if health else []
            continue
        if state is None and status is None:
            continue  # the driver reports no fabric for this GPU (older driver, or -q not read)
        if fm_verdict in ("missing", "stopped", "mismatch"):
            action = ("fix the fabric manager first (the finding above); GPU %s registers with the fabric once it "
                      "runs" % gpu.get("index"))
        else:
            action = ("the fabric manager runs but GPU %s did not register: read journalctl -u nvidia-fabricmanager "
                      "for the GPU's NVLink training errors (on NVLink 5 machines check that NVLSM runs), then reset "
                      "the GPU or reboot; if it repeats, reseat the GPU module or service the baseboard" % gpu.get(
                          "index"))
        out.append(finding("fail", "FABRIC_STATE_INCOMPLETE", "%s: fabric state %s, status %s: the GPU is not "
                           "registered with the NVLink fabric (CUDA on it fails with error 802)" % (
                               _label(host, gpu), state or "unknown", status or "unknown"),
                           action, _evidence(gpu), gpu=gpu.get("index"), pci=gpu.get("pci")))
    return out


def _peers(result, gpu, nvswitch):
    """Words naming the GPU pairs a link of this GPU carries: every peer through the switches, or the direct NVLink
    peers from the topology matrix (the one with fewest bonded links first: the pair that lost one)."""
    index = gpu.get("index")
    topology = result.get("topology") or {}
    row = (topology.get("matrix") or {}).get("GPU%s" % index) or {}
    peers = []
    for col, code in sorted(row.items()):
        if not col.startswith("GPU") or col == "GPU%s" % index or not str(code).strip().startswith("NV"):
            continue
        try:
            peers.append((int(str(code).strip()[2:]), col, str(code).strip()))
        except ValueError:
            continue
    if nvswitch:
        others = sorted(g.get("index") for g in _gpus(result) if g.get("index") != index)
        return ("through the NVSwitches, every pair GPU %s-GPU x (x = %s) loses bandwidth" % (
            index, ",".join(str(o) for o in others) or "none")), peers
    if not peers:
        return "no direct NVLink peer in the topology matrix", peers
    low = min(p[0] for p in peers)
    suspects = [p for p in peers if p[0] == low] if len(set(p[0] for p in peers)) > 1 else peers
    return "the NVLink pair(s) %s" % ", ".join("GPU %s-%s (%s)" % (index, p[1], p[2]) for p in suspects), peers


def _expected(result, links_t, speed_t):
    """(links per GPU, rated speed GB/s), each with where it came from, per GPU model name."""
    by_model = {}
    for gpu in _gpus(result):
        if gpu.get("nvlink_links_total"):
            m = by_model.setdefault(gpu.get("name"), {"links": 0, "speed": 0.0})
            m["links"] = max(m["links"], gpu["nvlink_links_total"])
            speeds = [link.get("speed_gbps") for link in gpu.get("nvlink_links") or [] if link.get("speed_gbps")]
            m["speed"] = max([m["speed"]] + speeds)
    out = {}
    for name, m in by_model.items():
        out[name] = (links_t if links_t else m["links"],
                     "gpufleet_nvlink_links_per_gpu" if links_t else "the most links a %s of this node shows" % name,
                     float(speed_t) if speed_t else m["speed"],
                     "gpufleet_nvlink_min_link_speed_gbps" if speed_t else
                     "the fastest link of this node's %s GPUs" % name)
    return out


def _link_findings(result, host, t, nvswitch):
    out = []
    expected = _expected(result, t.get("gpufleet_nvlink_links_per_gpu"), t.get("gpufleet_nvlink_min_link_speed_gbps"))
    for gpu in _gpus(result):
        if not gpu.get("nvlink_present"):
            continue
        where, _peers_found = _peers(result, gpu, nvswitch)
        base = ("reseat GPU %s's SXM module and check the baseboard's NVLink connectors, then reboot and rerun; if the "
                "link stays down, RMA the baseboard (HGX) or the GPU" % gpu.get("index")) if nvswitch else (
            "reseat (or replace) the NVLink bridge of %s, then rerun" % where.replace("the NVLink pair(s) ", ""))
        links = gpu.get("nvlink_links") or []
        down = [link["link"] for link in links if not link.get("up")]
        total = gpu.get("nvlink_links_total") or 0
        model = expected.get(gpu.get("name"))
        if gpu.get("nvlink_all_inactive") and not links:
            out.append(finding("fail", "NVLINK_LINK_DOWN", "%s: every NVLink is down (nvidia-smi: all links are "
                               "inactive); %s" % (_label(host, gpu), where), base, _evidence(gpu),
                               gpu=gpu.get("index"), pci=gpu.get("pci")))
            continue
        if down:
            out.append(finding("fail", "NVLINK_LINK_DOWN", "%s: NVLink %s down (%d of %d up); %s" % (
                _label(host, gpu), ",".join(str(d) for d in down), total - len(down), total, where),
                base, _evidence(gpu, ["Link %s: <inactive>" % d for d in down]), gpu=gpu.get("index"),
                pci=gpu.get("pci")))
        if model and total and total < model[0]:
            out.append(finding("fail", "NVLINK_LINK_DOWN", "%s: only %d NVLinks listed, %d expected (%s); %s" % (
                _label(host, gpu), total, model[0], model[1], where), base, _evidence(gpu),
                gpu=gpu.get("index"), pci=gpu.get("pci")))
        if model and model[2]:
            slow = [link for link in links if link.get("up") and link.get("speed_gbps") is not None
                    and link["speed_gbps"] < model[2] * (1 - SPEED_TOLERANCE)]
            if slow:
                out.append(finding("fail", "NVLINK_LINK_SLOW", "%s: NVLink %s at %s GB/s, below %s GB/s (%s); %s" % (
                    _label(host, gpu), ",".join(str(link["link"]) for link in slow),
                    ",".join("%g" % link["speed_gbps"] for link in slow), "%g" % model[2], model[3], where),
                    base, _evidence(gpu), gpu=gpu.get("index"), pci=gpu.get("pci")))
    return out


def _key(gpu):
    return gpu.get("uuid") or gpu.get("pci") or gpu.get("index")


def counter_rises(result, baseline):
    """[(gpu, link, {crc, replay, recovery} rises)] between the baseline and this read, joined by GPU UUID (else PCI
    address, else index) and link number; a counter that went down (driver reload) gives no rise for that link."""
    if not isinstance(baseline, dict):
        return []
    before = {}
    for gpu in baseline.get("gpus") or []:
        if isinstance(gpu, dict):
            for c in gpu.get("nvlink_counters") or []:
                before[(_key(gpu), c.get("link"))] = c
    out = []
    for gpu in _gpus(result):
        for c in gpu.get("nvlink_counters") or []:
            old = before.get((_key(gpu), c.get("link")))
            if old is None:
                continue
            rise = {}
            for kind in ("crc", "replay", "recovery"):
                a, b = old.get(kind + "_errors"), c.get(kind + "_errors")
                rise[kind] = b - a if isinstance(a, int) and isinstance(b, int) and b >= a else None
            out.append((gpu, c.get("link"), rise))
    return out


def _window_s(result, baseline):
    try:
        return float(result["read_at"]) - float(baseline["read_at"])
    except (KeyError, TypeError, ValueError):
        return None


def _counter_findings(result, host, t, baseline):
    out = []
    window = _window_s(result, baseline)
    crc_limit = float(t["gpufleet_nvlink_crc_fail_per_s"])
    rr_limit = int(t["gpufleet_nvlink_replay_recovery_fail"])
    by_gpu = {}
    for gpu, link, rise in counter_rises(result, baseline):
        if any(rise.get(k) for k in rise):
            by_gpu.setdefault(id(gpu), (gpu, []))[1].append((link, rise))
    for gpu, rises in by_gpu.values():
        parts, fail = [], False
        for link, rise in rises:
            crc, rr = rise.get("crc") or 0, (rise.get("replay") or 0) + (rise.get("recovery") or 0)
            rate = crc / window if window and window > 0 else None
            if rr >= rr_limit or (rate is not None and rate >= crc_limit):
                fail = True
            parts.append("link %s: CRC +%d%s, replay +%d, recovery +%d" % (
                link, crc, " (%.1f/s)" % rate if rate is not None else "", rise.get("replay") or 0,
                rise.get("recovery") or 0))
        span = " in %.0f s" % window if window else ""
        message = "%s: NVLink error counters rose during the run%s: %s" % (_label(host, gpu), span, "; ".join(parts))
        evidence = ["rise during the run, %s" % p for p in parts] + _evidence(gpu)
        action = ("a marginal NVLink of GPU %s (module seating, baseboard connector): reseat the GPU, rerun the burn; "
                  "if the counters rise again, RMA the baseboard (HGX) or the GPU" % gpu.get("index"))
        if fail:
            out.append(finding("fail", "NVLINK_ERRORS_HIGH", message + " (fail: replay/recovery +%d or more, or CRC "
                               "%g/s or more)" % (rr_limit, crc_limit), action, evidence, gpu=gpu.get("index"),
                               pci=gpu.get("pci")))
        else:
            out.append(finding("warn", "NVLINK_ERRORS_RISING", message + " (below CRC %g/s)" % crc_limit,
                               "watch the next burn: " + action, evidence, gpu=gpu.get("index"), pci=gpu.get("pci")))
    return out


@judge_door(CHECK)
def judge(result, t, host, baseline=None):
    """[finding] for one nvlink_facts read. baseline: an earlier read (else result["baseline"]) for the counters' rise.
    Thresholds: gpufleet_nvlink_crc_fail_per_s, gpufleet_nvlink_replay_recovery_fail,
    gpufleet_nvlink_min_link_speed_gbps, gpufleet_nvlink_links_per_gpu."""
    if not_applicable(result):
        return []
    nvswitch = is_nvswitch(result)
    out = []
    problems = [p for p in result.get("problems") or [] if isinstance(p, dict)]
    if nvswitch and not _gpus(result) and "gpus" in (result.get("gathered") or []):
        out.append(finding("error", "NVLINK_UNREADABLE", "%s: NVSwitch machine whose GPUs nvidia-smi did not list: %s"
                           % (host, "; ".join(p.get("message", "") for p in problems[:3]) or "no answer"),
                           "make nvidia-smi work on %s (driver loaded? reboot pending?), then rerun" % host,
                           [p.get("message") for p in problems[:5]]))
    fm, fm_verdict = ([], None)
    if nvswitch:
        fm, fm_verdict = _fm_findings(result, host)
    out += fm
    if nvswitch:
        out += _fabric_findings(result, host, fm_verdict)
    if fm_verdict in ("missing", "stopped", "mismatch"):
        # Without a running fabric manager no NVLink trains: the links are down because of it, not of the baseboard.
        for f in out:
            if f["code"].startswith("FABRIC_MANAGER_") and f["severity"] == "fail":
                f["message"] += "; every NVLink stays down until it runs"
                break
    else:
        out += _link_findings(result, host, t, nvswitch)
    out += _counter_findings(result, host, t, baseline if baseline is not None else result.get("baseline"))
    return out


def _no_figures():
    return {"interconnect": None, "fabric_manager": None, "fabric_complete": None, "links_up": None,
            "links_total": None, "errors_rise": None, "window_s": None, "topology": None}


def topology_text(result):
    """The GPU part of the topology matrix as text rows ("GPU0  X    NV18 ..."), for the report."""
    topology = result.get("topology") or {}
    matrix = topology.get("matrix") or {}
    gpus = ["GPU%s" % i for i in topology.get("gpus") or []]
    if not gpus:
        return None
    rows = [("      " + " ".join("%-5s" % g for g in gpus)).rstrip()]
    for row in gpus:
        cells = matrix.get(row) or {}
        rows.append(("%-5s " % row + " ".join("%-5s" % str(cells.get(col, "?")).strip() for col in gpus)).rstrip())
    return "\n".join(rows)


@judge_door(CHECK, empty=_no_figures)
def figures(result, t=None, baseline=None):
    """What the report shows beside the verdict (strings and numbers)."""
    gpus = _gpus(result)
    fm = result.get("fabric_manager") or {}
    fm_text = None
    if is_nvswitch(result) and fm:
        fm_text = "%s %s (%s)" % (fm.get("package") or "not installed", fm.get("upstream_version") or "",
                                  fm.get("active_state") or "unknown")
    fabric = [g for g in gpus if g.get("fabric_state") is not None]
    rises = counter_rises(result, baseline if baseline is not None else result.get("baseline"))
    rise_total = sum(sum(v for v in r.values() if v) for _g, _l, r in rises) if rises else None
    with_links = [g for g in gpus if g.get("nvlink_links_total") is not None]
    return {
        "interconnect": result.get("interconnect"),
        "fabric_manager": fm_text,
        "fabric_complete": ("%d/%d" % (sum(1 for g in fabric if g.get("fabric_state") == "completed"
                                           and (g.get("fabric_status") or "").lower() == "success"), len(fabric))
                            if fabric else None),
        "links_up": sum(g.get("nvlink_links_up") or 0 for g in with_links) if with_links else None,
        "links_total": sum(g["nvlink_links_total"] for g in with_links) if with_links else None,
        "errors_rise": rise_total,
        "window_s": _window_s(result, baseline if baseline is not None else result.get("baseline")),
        "topology": topology_text(result),
    }
