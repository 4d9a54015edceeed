"""The sample fleet the report tests render: the recorded burn-in of the simulated fleet (tests/fixtures/report,
written by record.py) plus two nodes edited from it: one that went unreachable during the burn and one with a
threshold of the wrong type in its inventory."""

import copy
import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "report"


def hosts():
    data = json.loads((FIXTURES / "sim_burn_in.json").read_text())["hosts"]
    down = copy.deepcopy(data["sim-node02"])
    for key in ("gpufleet_completed", "gpufleet_result_dcgm_diag", "gpufleet_result_nccl_test",
                "gpufleet_result_checkpoint_storage", "gpufleet_result_gpu_sample"):
        down.pop(key, None)
    down["gpufleet_stage"] = "burn"
    down["gpufleet_result_gpu_burn"] = {"unreachable": True, "changed": False,
                                        "msg": "Failed to connect to the host via ssh: ssh: connect to host 10.213.0.19 "
                                               "port 22: No route to host"}
    data["sim-node09"] = down
    badvar = copy.deepcopy(data["sim-node01"])
    badvar["gpufleet_temp_max_c"] = "85C"
    data["sim-node10"] = badvar
    return data


def in_play():
    """Hosts still in the play at the report (None: decided from each host's own record)."""
    return None


def report_doc(run_id="sample", playbook="burn_in"):
    """The sample fleet judged and built into a report document, as the fleet report writes it."""
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils import report

    data = hosts()
    nodes = report.evaluate_fleet(list(data), data, in_play())
    return report.build_report(nodes, run_id, playbook=playbook, started="2026-11-29T09:00:00+00:00",
                               finished="2026-11-29T10:12:00+00:00")
