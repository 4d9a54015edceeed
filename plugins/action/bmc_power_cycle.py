# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Action kentino.gpufleet.bmc_power_cycle: the repair ladder's power cycle through a node's BMC, from the controller.

The Redfish requests are community.general's redfish_command and redfish_info (the modules the ansible package
ships), run here one after another: ForceOff, wait until the system reports PowerState Off, On, wait until it reports
On. Every failure is one named state (plugin_utils/bmc.py) with the module's own words; nothing is retried on a
guess. Documentation and the argument_spec live in plugins/modules/bmc_power_cycle.py.
"""

from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible_collections.kentino.gpufleet.plugins.modules.bmc_power_cycle import ARGUMENT_SPEC
from ansible_collections.kentino.gpufleet.plugins.plugin_utils import bmc

COMMAND, INFO = "community.general.redfish_command", "community.general.redfish_info"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        node = args["node"] or task_vars.get("inventory_hostname")
        steps = []
        result.update(changed=False, node=node, steps=steps, power_state=None)

        def stop(state, detail):
            result.update(failed=True, bmc_state=state, msg="node %s: BMC power cycle: %s: %s (%s)" % (
                node, state, detail, bmc.STATES[state]))
            return result

        if not args["url"]:
            return stop("not_configured", "gpufleet_bmc_url is not set")
        baseuri, errors = bmc.endpoint(args["url"], args["username"], args["password"], args["system_id"])
        if errors:
            return stop("bad_input", "; ".join(errors))
        if bad := [o for o in ("timeout", "power_off_wait", "power_on_wait", "poll") if args[o] < 1]:
            return stop("bad_input", "%s must be at least 1 second" % ", ".join(bad))
        loader = self._shared_loader_obj.module_loader
        if not all(loader.find_plugin_with_context(m).resolved for m in (COMMAND, INFO)):
            return stop("missing_collection", "%s and %s are not installed" % (COMMAND, INFO))
        common = {"baseuri": baseuri, "username": args["username"], "password": args["password"],
                  "timeout": args["timeout"], "validate_certs": args["validate_certs"]}
        if args["ca_path"]:
            common["ca_path"] = args["ca_path"]
        result["planned"] = ["ComputerSystem.Reset ForceOff", "wait for PowerState Off (at most %ss)"
                             % args["power_off_wait"], "ComputerSystem.Reset On",
                             "wait for PowerState On (at most %ss)" % args["power_on_wait"]]
        if self._task.check_mode:
            result.update(bmc_state="planned", msg="node %s: would power-cycle the system through %s" % (node, baseuri))
            return result

        def power_state():
            """(PowerState, failed state, message) of the node's system."""
            out = self._execute_module(INFO, dict(common, category="Systems", command=["GetSystemInventory"]),
                                       task_vars=task_vars)
            if out.get("failed"):
                return None, bmc.classify(out.get("msg")), out.get("msg")
            entries = (((out.get("redfish_facts") or {}).get("system") or {}).get("entries")) or []
            systems = [props for _uri, props in entries if not args["system_id"] or props.get("Id") == args["system_id"]]
            if len(systems) != 1:
                return None, "unknown_system", "%d systems match%s (Ids: %s)" % (
                    len(systems), " Id %s" % args["system_id"] if args["system_id"] else "",
                    ", ".join(str(p.get("Id")) for _u, p in entries))
            return systems[0].get("PowerState"), None, None

        def reset(command):
            extra = {"resource_id": args["system_id"]} if args["system_id"] else {}
            out = self._execute_module(COMMAND, dict(common, category="Systems", command=[command], **extra),
                                       task_vars=task_vars)
            if out.get("failed"):
                steps.append("%s %s failed" % (time.strftime("%H:%M:%S"), command))
                return bmc.classify(out.get("msg")), out.get("msg")
            steps.append("%s %s" % (time.strftime("%H:%M:%S"), command))
            return None, None

        def wait_for(want, limit):
            deadline = time.monotonic() + limit
            while True:
                state, failure, detail = power_state()
                if failure:
                    return failure, detail
                result["power_state"] = state
                if not steps or not steps[-1].endswith("PowerState %s" % state):
                    steps.append("%s PowerState %s" % (time.strftime("%H:%M:%S"), state))
                if state == want:
                    return None, None
                if time.monotonic() >= deadline:
                    return "no_power_%s" % want.lower(), "the system still reports PowerState %s after %ss" % (
                        state, limit)
                time.sleep(min(args["poll"], max(deadline - time.monotonic(), 0.1)))

        for command, want, limit in (("PowerForceOff", "Off", args["power_off_wait"]),
                                     ("PowerOn", "On", args["power_on_wait"])):
            failure, detail = reset(command)
            if not failure:
                result["changed"] = True
                failure, detail = wait_for(want, limit)
            if failure:
                return stop(failure, detail)
        result.update(bmc_state="power_cycled", msg="node %s: power-cycled through its BMC %s: %s" % (
            node, baseuri, "; ".join(steps)))
        return result
