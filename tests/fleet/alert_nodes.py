"""Test-fleet nodes for the alert path (tests/helpers/alert_path.py with fleet=...): each node runs, under its own
systemd, Debian's prometheus-node-exporter and the gpu_monitoring role's XID watcher (installed by the roles over SSH,
real apt from the fleet's local repository), with the simulator's GPU tools (package gpufleet-sim) for the watcher's
GPU inventory and the lifecycle's RMA bundle. Used by bench/quarantine.py --nodes fleet and its fleet test."""

import shutil

import aptrepo
import harness
from fleet_ansible import INSTALL_SIM, NODE_SIM_ROOT, NODE_SIM_STATE_ROOT, NODE_SIM_VARS, PlaybookRun

SCENARIO = "healthy_h100"
# The watcher's nvidia-smi: the simulator's, with the node's simulator variables (the watcher's unit has no
# environment of its own; gpu_monitoring_nvidia_smi names one executable).
NVIDIA_SMI = "/usr/local/sbin/gpufleet-sim-nvidia-smi"

INSTALL = INSTALL_SIM + """
- name: node_exporter and the XID watcher, the watcher reading the simulator's GPU inventory
  hosts: all
  gather_facts: true
  vars:
    gpu_monitoring_journal_matches: [SYSLOG_IDENTIFIER={ident}]
    gpu_monitoring_heartbeat_seconds: 1
    gpu_monitoring_inventory_interval_seconds: 5
    gpu_monitoring_nvidia_smi: {nvidia_smi}
    gpu_monitoring_health: false
  pre_tasks:
    - name: The simulator's nvidia-smi with this node's variables
      ansible.builtin.copy:
        dest: {nvidia_smi}
        mode: "0755"
        content: |
          #!/bin/sh
          export GPUFLEET_SIM_SCENARIO={sim_root}/scenarios/{scenario}.json
          export GPUFLEET_SIM_STATE={state_root}/{{{{ inventory_hostname }}}} GPUFLEET_SIM_NODE={{{{ inventory_hostname }}}}
          exec {sim_root}/bin/nvidia-smi "$@"
    - name: The node's simulated state, made once by root and readable by the watcher's user
      ansible.builtin.shell: "{nvidia_smi} -L >/dev/null && chmod -R a+rX {state_root}"
      changed_when: false
  roles:
    - kentino.gpufleet.gpufleet_node_exporter
    - kentino.gpufleet.gpu_monitoring
"""


def inventory_vars():
    """The variables that point the lifecycle's playbook at the simulator's tools on a node of this fleet."""
    return dict(NODE_SIM_VARS, gpufleet_sim_scenario=SCENARIO, gpufleet_slurm_node_name="{{ inventory_hostname }}")


def up(fleet_dir, nodes, prefix, subnet, work, ident, timeout_s=600):
    """A fleet of `nodes` nodes with the exporter and the watcher running; the caller calls fleet.down()."""
    base = harness.ensure_base()
    fleet = harness.Fleet(dir=fleet_dir, nodes_wanted=nodes, prefix=prefix, subnet=subnet)
    if fleet.state_path.exists():
        harness.Fleet.from_state(fleet_dir).down()
    shutil.rmtree(fleet.apt_dir, ignore_errors=True)
    aptrepo.build_repo(fleet.apt_dir, harness.DEFAULT_CACHE, base=base, only=(), debian=aptrepo.DEBIAN_PACKAGES)
    fleet.up(base=base)
    try:
        fleet.write_inventory(groups=("gpufleet_testfleet", "gpufleet_nodes"))
        play = INSTALL.format(ident=ident, nvidia_smi=NVIDIA_SMI, sim_root=NODE_SIM_ROOT,
                              state_root=NODE_SIM_STATE_ROOT, scenario=SCENARIO)
        run = PlaybookRun(fleet, play, tmp_path=work).wait(timeout_s)
        if run.proc.returncode != 0:
            raise RuntimeError("installing the watcher on the fleet failed:\n%s" % run.output[-4000:])
    except BaseException:
        fleet.down()
        raise
    return fleet
