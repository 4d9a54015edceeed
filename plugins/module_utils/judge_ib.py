# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Judge a node's InfiniBand ports: state, rate and width against expected, error counters rising under load.

The input: {"ports": [the ports of ib_sysfs.read_ports() after the load], "baseline": {"<hca>/<port>": {counter:
value}} read before the load (or None), "problems": [...]}. A port is down unless its state is ACTIVE and its
physical state LinkUp; a rate or width below gpufleet_ib_expected_rate_gbps / gpufleet_ib_expected_width is a link
trained down (a bad cable or optic, a port forced down); a link_downed rise during the load is a flap; any other
error counter rising by more than gpufleet_ib_error_rise_max under load is a link going bad. Stdlib only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import finding
from ansible_collections.kentino.gpufleet.plugins.module_utils.ib_sysfs import port_key
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import judge_door

CHECK = "ib_ports"
THRESHOLDS = ("gpufleet_ib_expected_rate_gbps", "gpufleet_ib_expected_width", "gpufleet_ib_error_rise_max")
# How ib_ports says a node has no InfiniBand (its not_run starts with this): nothing to check there, which the report
# shows as skipped with the reason but never counts among the checks a node left out.
NO_INFINIBAND = "no InfiniBand on this node"

CODES = {
    "IB_PORT_DOWN": ("fail", "a port not ACTIVE/LinkUp, or gone after the load"),
    "IB_RATE_LOW": ("fail", "a port's rate below gpufleet_ib_expected_rate_gbps: trained down"),
    "IB_WIDTH_LOW": ("fail", "a port's width below gpufleet_ib_expected_width (lanes lost: cable or optic)"),
    "IB_LINK_FLAPPED": ("fail", "link_downed rose during the load: the link went down and came back"),
    "IB_ERRORS_RISING": ("warn", "an error counter rose by more than gpufleet_ib_error_rise_max during the load"),
    "IB_NO_PORTS": ("error", "no InfiniBand port could be read: nothing judged"),
}
ERROR_COUNTERS_RISING = ("symbol_error", "link_error_recovery", "port_rcv_errors", "port_rcv_remote_physical_errors",
                         "port_xmit_discards", "local_link_integrity_errors", "excessive_buffer_overrun_errors")


def _name(port):
    return "%s port %s" % (port.get("hca"), port.get("port"))


def _action(host, port, what):
    return "on %s %s: %s; then rerun the check under load" % (host, _name(port), what)


@judge_door(CHECK)
def judge(result, t, host):
    if result.get("not_run"):
        return []  # no InfiniBand on the node: the check is skipped with that reason, nothing to judge
    ports = result.get("ports") or []
    if not ports:
        why = "; ".join(p.get("message", "") for p in result.get("problems") or []) or "no port in sysfs"
        return [finding("error", "IB_NO_PORTS", "%s: no InfiniBand port could be read (%s)" % (host, why),
                        "load the HCA driver (mlx5_ib) on %s or leave this check off for nodes without InfiniBand"
                        % host, [why])]
    out = []
    rate_min = t.get("gpufleet_ib_expected_rate_gbps")
    width_min = t.get("gpufleet_ib_expected_width")
    rise_max = int(t.get("gpufleet_ib_error_rise_max") or 0)
    baseline = result.get("baseline") or {}
    for port in ports:
        lines = port.get("lines") or []
        if port.get("state_name") != "ACTIVE" or port.get("phys_state") != "LinkUp":
            out.append(finding("fail", "IB_PORT_DOWN", "%s: %s is %s / %s, not ACTIVE / LinkUp" % (
                host, _name(port), port.get("state_name"), port.get("phys_state")),
                _action(host, port, "check the cable and the switch port, reseat or replace the cable or optic"),
                lines))
            continue
        if rate_min is not None and port.get("rate_gbps") is not None and port["rate_gbps"] < float(rate_min):
            out.append(finding("fail", "IB_RATE_LOW", "%s: %s runs at %g Gb/s, below the expected %g Gb/s" % (
                host, _name(port), port["rate_gbps"], float(rate_min)),
                _action(host, port, "check the cable/optic and the switch port's configured speed"), lines))
        if width_min is not None and port.get("width") is not None and port["width"] < int(width_min):
            out.append(finding("fail", "IB_WIDTH_LOW", "%s: %s trained at %dX, below the expected %dX" % (
                host, _name(port), port["width"], int(width_min)),
                _action(host, port, "lanes are lost: reseat or replace the cable or optic"), lines))
        before = baseline.get(port_key(port))
        if before is None:
            continue
        after = port.get("counters") or {}
        rise = dict((k, after[k] - before[k]) for k in after
                    if isinstance(after.get(k), int) and isinstance(before.get(k), int) and after[k] > before[k])
        evidence = ["%s %s: %s -> %s" % (_name(port), k, before[k], after[k]) for k in sorted(rise)]
        if rise.get("link_downed"):
            out.append(finding("fail", "IB_LINK_FLAPPED", "%s: %s went down %d times during the load" % (
                host, _name(port), rise["link_downed"]),
                _action(host, port, "the link flaps: replace the cable or optic, check the switch port"), evidence))
        rising = dict((k, v) for k, v in rise.items() if k in ERROR_COUNTERS_RISING and v > rise_max)
        if rising:
            out.append(finding("warn", "IB_ERRORS_RISING", "%s: %s error counters rose under load: %s" % (
                host, _name(port), ", ".join("%s +%d" % (k, v) for k, v in sorted(rising.items()))),
                _action(host, port, "symbol and receive errors under load are a marginal cable or optic: clean or "
                                    "replace it"), evidence))
    seen = set(port_key(p) for p in ports)
    for key in sorted(set(baseline) - seen):
        out.append(finding("fail", "IB_PORT_DOWN", "%s: port %s was there before the load and is gone after it" % (
            host, key), "on %s check the HCA %s (dmesg, the driver) and its cable; then rerun the check under load"
            % (host, key.split("/")[0]), ["%s: read before the load, missing after it" % key]))
    return out
