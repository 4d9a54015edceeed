"""The repair ladder's reboot rung on a real node: `kentino.gpufleet.lifecycle` over SSH quarantines a node for a GSP
timeout (XID 119, whose rung is a reboot), then repairs it: ansible.builtin.reboot reboots the node (systemd inside
the container; the harness boots it again as systemd-nspawn@.service would), the preflight validates it over SSH, and
it is returned. A node that does not come back within the reboot's timeout stays quarantined, named."""

import json
import time

import pytest
from fleet_ansible import INSTALL_SIM, NODE_SIM_VARS, REPO, PlaybookRun
from helpers.lifecycle_runs import lifecycle_args, rows

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(600)]

LIFECYCLE = REPO / "playbooks" / "lifecycle.yml"


@pytest.fixture(scope="module")
def sim_nodes(fleet, tmp_path_factory):
    """The simulator's GPU tools on every node (real apt), the training environment (the role), each node a healthy
    H100, and the SSH inventory's vars."""
    tmp = tmp_path_factory.mktemp("reboot")
    install = PlaybookRun(fleet, INSTALL_SIM + """
- name: Provision the training environment, as the preflight that validates the repair expects
  hosts: all
  gather_facts: true
  roles:
    - kentino.gpufleet.training_env
""", tmp_path=tmp).wait(240)
    assert install.proc.returncode == 0, install.output[-3000:]
    group_vars = dict(NODE_SIM_VARS, gpufleet_sim_scenario="healthy_h100")
    inv = tmp / "sim_vars.yml"
    inv.write_text(json.dumps({"gpufleet_nodes": {"hosts": {n.name: {} for n in fleet.nodes}, "vars": group_vars}}))
    return {"tmp": tmp, "inventories": [fleet.inventory_path, inv]}


def lifecycle(fleet, setup, node, action, *extra, timeout=420):
    run = PlaybookRun(fleet, str(LIFECYCLE), lifecycle_args(setup["tmp"], node, action, *extra),
                      inventories=setup["inventories"], tmp_path=setup["tmp"])
    return run.wait(timeout)


def boot_id(fleet, node):
    return fleet.ssh(node, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def test_the_reboot_rung_reboots_the_node_over_ssh_validates_and_returns_it(fleet, sim_nodes, restore_nodes):
    node = fleet.nodes[1].name
    restore_nodes.append(node)
    before = boot_id(fleet, node)
    quarantine = lifecycle(fleet, sim_nodes, node, "quarantine", "lifecycle_code=XID_119", "lifecycle_gpu=0")
    assert quarantine.proc.returncode == 0, quarantine.output[-3000:]
    started = time.monotonic()
    repair = lifecycle(fleet, sim_nodes, node, "repair")
    repair_s = time.monotonic() - started
    assert repair.proc.returncode == 0, repair.output[-5000:]
    after = boot_id(fleet, node)
    assert after != before  # rebooted: systemd in the node gave a new boot id
    done = rows(sim_nodes["tmp"], node)
    assert [r["to_state"] for r in done] == ["quarantined", "repairing", "validating", "healthy"], done
    assert done[1]["evidence"][0] == "rung: reboot" and done[3]["actor"] == "preflight", done
    print("the reboot rung over SSH, with its preflight: %.1f s" % repair_s)


def test_a_node_that_does_not_come_back_stays_quarantined(fleet, sim_nodes, restore_nodes):
    node = fleet.nodes[2].name
    restore_nodes.append(node)
    quarantine = lifecycle(fleet, sim_nodes, node, "quarantine", "lifecycle_code=XID_119", "lifecycle_gpu=0")
    assert quarantine.proc.returncode == 0, quarantine.output[-3000:]
    # Its reboot powers it off instead (as a board that hangs in POST looks from the controller): the shutdown
    # command ansible.builtin.reboot finds is replaced on this node only, and put back below.
    fleet.ssh(node, "rm /usr/sbin/shutdown && printf '#!/bin/sh\\nexec systemctl poweroff\\n' > /usr/sbin/shutdown && "
                    "chmod 755 /usr/sbin/shutdown")
    try:
        repair = lifecycle(fleet, sim_nodes, node, "repair", "gpufleet_reboot_timeout_s=20")
    finally:
        fleet.restart_node(node)
        fleet.ssh(node, "ln -sf /bin/systemctl /usr/sbin/shutdown")
    assert repair.proc.returncode != 0
    assert "reboot did not run: node %s: reboot: node_not_back: the node did not answer within 20 s" % node \
        in repair.output, repair.output[-3000:]
    done = rows(sim_nodes["tmp"], node)
    assert [r["to_state"] for r in done] == ["quarantined", "repairing", "quarantined"], done
    assert "node_not_back" in done[-1]["reason"], done[-1]
