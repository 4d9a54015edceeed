"""A report judges its nodes in forked processes (report.evaluate_fleet processes=N): the same nodes in the same order
as one after the other, and one after the other again when the pool cannot be had."""

import copy
import json
import multiprocessing
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.plugin_utils import report

REPO = Path(__file__).resolve().parents[3]
BURN = json.loads((REPO / "tests" / "fixtures" / "report" / "sim_burn_in.json").read_text())["hosts"]


def fleet():
    """The recorded burn-in's nodes, twice over under other names (18 nodes, every verdict of the demo)."""
    hosts = {}
    for round_ in ("a", "b"):
        for name, hv in BURN.items():
            hosts["%s-%s" % (name, round_)] = copy.deepcopy(hv)
    return hosts


def test_forked_judges_give_the_same_nodes_in_the_same_order():
    hosts = fleet()
    names = sorted(hosts, reverse=True)
    play = set(names[3:])  # three nodes dropped out of the play before they finished: unreachable
    for name in names[:3]:
        hosts[name].pop("gpufleet_completed", None)
        hosts[name]["gpufleet_stage"] = "burn"
    serial = report.evaluate_fleet(names, hosts, play)
    forked = report.evaluate_fleet(names, hosts, play, processes=3)
    assert forked == serial
    assert [n["host"] for n in forked] == names
    assert {n["verdict"] for n in forked} >= {"pass", "fail", "error", "unreachable"}


def test_without_fork_or_with_a_broken_pool_the_nodes_are_judged_here(monkeypatch):
    hosts = fleet()
    names = sorted(hosts)
    serial = report.evaluate_fleet(names, hosts)

    def no_fork(_method):
        raise ValueError("cannot find context for 'fork'")

    monkeypatch.setattr(multiprocessing, "get_context", no_fork)
    assert report.evaluate_fleet(names, hosts, processes=4) == serial
    monkeypatch.undo()

    class BrokenPool:
        def __init__(self, _n):
            raise OSError("fork: Resource temporarily unavailable")

    monkeypatch.setattr(multiprocessing.get_context("fork"), "Pool", BrokenPool)
    assert report.evaluate_fleet(names, hosts, processes=4) == serial
    assert report._FORKED_HOSTVARS == {}  # nothing of the run left behind


def test_the_processes_are_the_cores_this_run_may_use():
    assert 1 <= report.judge_processes() <= 8
