"""Run the fabric playbook on a small simulated fabric written for one test: the fabric file (sim/gpufleet_sim/
ib_fabric.py's format), an inventory with one group a leaf switch (and nodes on no leaf), the sim's group_vars."""

import json

from helpers.playbook_runner import REPO, run_playbook


def run_fabric(tmp_path_factory, name, leaves, fabric, fabric_vars, no_leaf=()):
    """(rc, output, report, reports/latest) of playbooks/fabric.yml over `leaves` ({leaf: [node]}) and the nodes of
    `no_leaf`; fabric: the fabric file's other keys (seed, faults, down...); fabric_vars: gpufleet_fabric_* values."""
    inv = tmp_path_factory.mktemp("%s-inventory" % name)
    path = inv.parent / ("%s-fabric.json" % inv.name)
    path.write_text(json.dumps(dict(fabric, leaves=leaves)))
    lines = ["gpufleet_nodes:", "  children:", "    gpufleet_sim:", "gpufleet_sim:", "  vars:",
             "    gpufleet_sim_scenario: healthy_h100", "    gpufleet_sim_fabric: %s" % path]
    lines += ["    %s: %s" % (k, v) for k, v in fabric_vars.items()]
    if no_leaf:
        lines += ["  hosts:"] + ["    %s:" % n for n in no_leaf]
    lines.append("  children:")
    for leaf, nodes in leaves.items():
        lines += ["    %s:" % leaf.replace("-", "_"), "      vars: {gpufleet_fabric_leaf: %s}" % leaf, "      hosts:"]
        lines += ["        %s:" % n for n in nodes]
    (inv / "hosts.yml").write_text("\n".join(lines) + "\n")
    (inv / "group_vars").symlink_to(REPO / "inventories" / "sim" / "group_vars")
    root = tmp_path_factory.mktemp("%s-run" % name)
    rc, output, report = run_playbook("fabric", root, inventory=str(inv), extra={"gpufleet_sim_time_scale": 0.001},
                                      timeout=300)
    assert report is not None, output[-4000:]
    return rc, output, report, root / "reports" / "latest"
