# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""Action kentino.gpufleet.fabric_search: one step of a fabric search on the controller (start, or record a round
and plan the next). Documentation and the argument_spec live in plugins/modules/fabric_search.py."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_fabric
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import resolve
from ansible_collections.kentino.gpufleet.plugins.modules.fabric_search import ARGUMENT_SPEC
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.fabric import pair_test, search
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.hostvars import read_host

DEFAULT_SLOTS = 8
DEFAULT_TIMEOUT_S = 300
# Settings of the whole search, the same on every host: (name, default, lowest, highest).
SEARCH_SETTINGS = (("gpufleet_fabric_max_rounds", 4, 1, 20), ("gpufleet_fabric_seed", 0, 0, 2 ** 31 - 1))


def _thresholds(data):
    """The fabric thresholds every host agrees on; AnsibleActionFail naming the hosts that differ or are invalid."""
    seen, errors = {}, []
    for host, hv in data.items():
        t, _sources, bad = resolve(hv, host)
        errors += [e for e in bad if "gpufleet_fabric_" in e]
        seen.setdefault(tuple((k, t[k]) for k in judge_fabric.THRESHOLDS), []).append(host)
    if errors:
        raise AnsibleActionFail("; ".join(errors))
    if len(seen) > 1:
        raise AnsibleActionFail("one fabric search judges every pair by one rule, but the hosts' fabric thresholds "
                                "differ: %s; set them for the whole group" % "; ".join(
                                    "%s on %s" % (dict(k), ", ".join(sorted(v)[:5])) for k, v in seen.items()))
    return dict(next(iter(seen)))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        state = args.get("search")
        if state is None:
            state = self._start([str(h) for h in args["hosts"]], task_vars.get("hostvars") or {}, args["ib"])
        elif state.get("group_plan") is None:
            answers = pair_test.answers(args["launched"], args["finished"])
            rails = pair_test.rail_answers(self._plan(state), args["rail_servers"], args["rail_clients"])
            for answer in answers:
                if tuple(answer["nodes"]) in rails:
                    answer["rails"] = rails[tuple(answer["nodes"])]
            t = complete(state["thresholds"])
            search.record(state, answers, t, state["max_rounds"])
            if not state["plan"]:  # the pair rounds are done: the bisection over the leaves' groups follows
                search.start_groups(state, judge_fabric.analyse(state, t)["floor"])
        else:
            floor = judge_fabric.analyse(state, complete(state["thresholds"]))["floor"]
            search.record_groups(state, pair_test.answers(args["launched"], args["finished"]), floor,
                                 state["max_rounds"])
        plan = self._plan(state)
        if state["plan"]:
            msg = "round %d: %d pair test(s)" % (state["rounds"] + 1, len(plan))
        elif plan:
            msg = "group round %d: %d group test(s)" % (state["group_rounds"] + 1, len(plan))
        else:
            msg = "search done after %d round(s), %d pair test(s), %d group test(s)" % (
                state["rounds"] + state.get("group_rounds", 0), len(state["pairs"]), len(state.get("groups") or []))
        result.update({"changed": False, "search": state, "plan": plan,
                       "round": state["rounds"] + state.get("group_rounds", 0) + 1, "msg": msg})
        return result

    @staticmethod
    def _plan(state):
        """The launches of the next round: the pair tests while the pair rounds go on, then the bisection's groups."""
        return [pair_test.launch(p, state["mpi_hosts"], state["slots"], state["timeouts"], state["mpirun_args"],
                                 state["envs"], state["sizes"], state["hcas"], state["rail_timeouts"])
                for p in state["plan"] or state.get("group_plan") or []]

    @staticmethod
    def _start(hosts, hostvars, ib_results):
        hosts = list(dict.fromkeys(hosts))
        if len(hosts) < 2:
            raise AnsibleActionFail("a fabric search needs at least two nodes, got %s" % (hosts or "none"))
        data = dict((h, read_host(hostvars, h)) for h in hosts)

        def each(name, default):
            return dict((h, default(h) if callable(default) else default) if data[h].get(name) is None
                        else (h, data[h][name]) for h in hosts)

        leaves = each("gpufleet_fabric_leaf", None)
        mpi_hosts = each("gpufleet_fabric_mpi_host", lambda h: h)
        slots = each("gpufleet_fabric_ranks_per_node", DEFAULT_SLOTS)
        timeouts = each("gpufleet_fabric_pair_timeout_s", DEFAULT_TIMEOUT_S)
        mpirun_args = each("gpufleet_fabric_mpirun_args", [])
        envs = each("gpufleet_fabric_env", {})
        lows = each("gpufleet_fabric_min_bytes", pair_test.DEFAULT_SIZES[0])
        highs = each("gpufleet_fabric_max_bytes", pair_test.DEFAULT_SIZES[1])
        sizes = dict((h, (lows[h], highs[h])) for h in hosts)
        rail_timeouts = each("gpufleet_fabric_rail_timeout_s", pair_test.DEFAULT_RAIL_TIMEOUT_S)
        errors = search.leaf_errors(leaves) + pair_test.host_errors(mpi_hosts, slots, timeouts, mpirun_args, envs,
                                                                    sizes, rail_timeouts)
        settings = {}
        for name, default, low, high in SEARCH_SETTINGS:
            values = each(name, default)
            bad = sorted(h for h, v in values.items() if isinstance(v, bool) or not isinstance(v, int)
                         or not low <= v <= high)
            errors += ["host %s: %s=%r must be a whole number from %d to %d" % (h, name, values[h], low, high)
                       for h in bad]
            if not bad and len(set(values.values())) > 1:
                errors.append("%s differs between the hosts of one search (%s): set it for the whole group" % (
                    name, ", ".join("%s=%s" % (h, v) for h, v in sorted(values.items())[:6])))
            settings[name] = values[hosts[0]]
        if errors:
            raise AnsibleActionFail("; ".join(errors))
        state = search.start(leaves, settings["gpufleet_fabric_seed"])
        state.update({"thresholds": _thresholds(data), "mpi_hosts": mpi_hosts, "slots": slots,
                      "timeouts": timeouts, "mpirun_args": mpirun_args, "envs": envs, "sizes": sizes,
                      "rail_timeouts": rail_timeouts, "hcas": pair_test.hcas_found(ib_results),
                      "max_rounds": settings["gpufleet_fabric_max_rounds"]})
        return state
