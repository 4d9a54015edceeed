"""Per-link figures in the history: each fabric search's pair figures recorded per link (the two nodes), read back
as that link's own median, and a pair that passes the fabric's floor but is well below its own link's past is
FABRIC_LINK_DEGRADED (on both nodes' rows); too few earlier runs judge nothing."""

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_fabric
from ansible_collections.kentino.gpufleet.plugins.module_utils.judge_common import complete
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.records import run_record
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.step import HistoryStep
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History

T = complete({"gpufleet_fabric_pair_busbw_gbps": 46.0})


def doc(run_id, ts_iso, figures):
    pairs = [{"round": 1, "nodes": list(nodes), "busbw_gbps": v, "status": "pass" if v else "error",
              "error": None if v else "rc=1"} for nodes, v in figures]
    return {"run_id": run_id, "started": ts_iso, "finished": ts_iso, "summary": {"verdict": "pass"},
            "fabric": {"pairs": pairs}}


def test_each_search_s_figures_are_kept_per_link_and_read_back_as_its_median(tmp_path):
    step = HistoryStep(str(tmp_path))
    with History(step.path) as h:
        for day, (v1, v2) in enumerate([(52.0, 46.0), (53.0, 45.0), (51.0, None)]):
            iso = "2026-01-%02dT00:00:00+00:00" % (day + 1)
            h.record(run_record(doc("r%d" % day, iso, [(("n2", "n1"), v1), (("n3", "n4"), v2)])), [])
        assert h.link_figures("n1", "n2") == [51.0, 53.0, 52.0]  # newest first; the order of the names is no matter
        assert h.link_figures("n4", "n3") == [45.0, 46.0]  # an errored test measured nothing
    got = step.link_history({"pairs": [{"nodes": ["n1", "n2"]}, {"nodes": ["n4", "n3"]}, {"nodes": ["n5", "n6"]}]})
    assert got == {"n1|n2": {"median_gbps": 52.0, "runs": 3}, "n3|n4": {"median_gbps": 45.5, "runs": 2}}


def search(figure, runs, median=52.0):
    return {"leaves": {"n1": None, "n2": None, "n3": None, "n4": None},
            "pairs": [{"nodes": ["n1", "n2"], "round": 1, "busbw_gbps": figure, "error": None},
                      {"nodes": ["n3", "n4"], "round": 1, "busbw_gbps": 46.0, "error": None}],
            "link_history": {"n1|n2": {"median_gbps": median, "runs": runs}, "n3|n4": {"median_gbps": 46.5, "runs": 9}}}


def test_a_link_below_its_own_median_warns_on_both_nodes_though_it_passes_the_floor():
    placed = [(subjects, f["code"]) for subjects, f in judge_fabric.attributed(search(42.0, 3), T)]
    assert placed == [(["n1", "n2"], "FABRIC_LINK_DEGRADED")]
    message = [f for f in judge_fabric.judge(search(42.0, 3), T)][0]["message"]
    assert message.startswith("link n1 <-> n2: 42.0 GB/s, below its own median of 52.0 GB/s over 3 earlier runs")


def test_a_link_within_its_margin_or_with_too_little_history_is_not_judged():
    assert judge_fabric.judge(search(45.0, 3), T) == []  # 52 less 15% is 44.2
    assert judge_fabric.judge(search(42.0, judge_fabric.LINK_MIN_RUNS - 1), T) == []
