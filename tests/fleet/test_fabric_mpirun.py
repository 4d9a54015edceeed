"""The fabric search (playbooks/fabric.yml) with real Open MPI between test-fleet nodes: each pair test is Debian's
`mpirun` on the pair's first node, starting its daemon (orted) on the partner over SSH and one rank of the stand-in
`all_reduce_perf` on each node; the ranks join MPI (python3-mpi4py) and rank 0 gathers their host names and prints
in nccl-tests' format, with the figure the shared fabric file gives the pair.

- a planted slow NIC on one node (the partner, rank 1, of a round-1 pair) is found and named with its action;
- a node killed (its container's PID 1) while its pair test runs: that pair is an error with Open MPI's own words,
  nobody is accused, the other pair goes on;
- a node without mpirun: its pair tests are errors that name the node and the fix.

Its own 4-node fleet (prefix gpmp) on a base with openmpi-bin and python3-mpi4py (a second cached debootstrap base:
one cold build, then nothing). Run: `flock /tmp/gpufleet-fleet.lock pytest -q -m fleet tests/fleet/test_fabric_mpirun.py`.
"""

import json
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import aptrepo  # noqa: E402
import harness  # noqa: E402
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.fabric import search  # noqa: E402
from fleet_ansible import PlaybookRun  # noqa: E402

pytestmark = [pytest.mark.fleet, pytest.mark.timeout(600)]

FLEET_DIR = Path(os.environ.get("GPUFLEET_MPI_FLEET_DIR", "/var/tmp/gpufleet-mpi-fleet"))
# Open MPI's launcher and daemon, and MPI for the stand-in's ranks, in the nodes' base image.
FABRIC_FILE = "/etc/gpufleet-sim-fabric.json"
# The key mpirun's ssh uses between the nodes (the fleet's own, whose public half every node authorizes).
NODE_KEY = "/root/.ssh/id_gpufleet_fabric"
RSH_ARGS = ("-i %s -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o ConnectTimeout=5 "
            "-o LogLevel=ERROR" % NODE_KEY)
FABRIC = "playbooks/fabric.yml"


@pytest.fixture(scope="module")
def mfleet(fleet_base):
    started = time.monotonic()
    base = fleet_base  # Open MPI is in the base
    fleet = harness.Fleet(dir=FLEET_DIR, nodes_wanted=4, prefix="gpmp", subnet="10.213.17")
    if fleet.state_path.exists():
        harness.Fleet.from_state(FLEET_DIR).down()
    shutil.rmtree(fleet.apt_dir, ignore_errors=True)
    fleet.repo_info = aptrepo.build_repo(fleet.apt_dir, harness.DEFAULT_CACHE, base=base, only=())
    fleet.up(base=base)
    fleet.write_inventory(groups=("gpufleet_testfleet", "gpufleet_nodes"))
    key = fleet.key_path.read_text()
    # The base has the real mpirun in /usr/bin: the simulator's stand-in mpirun is not linked over it.
    assert "mpirun" in fleet.repo_info["sim"]["not_linked"], fleet.repo_info["sim"]

    def prepare(name):
        fleet.ssh(name, "install -m 600 /dev/stdin %s" % NODE_KEY, input=key)
        fleet.ssh(name, "apt-get -q update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get -q -y install "
                        "gpufleet-sim >/dev/null",
                  timeout=180)
    with ThreadPoolExecutor(len(fleet.nodes)) as pool:  # the nodes at once; a node's failure is raised here
        list(pool.map(prepare, names(fleet)))
    for n in fleet.nodes:
        paths = fleet.ssh(n.name, "readlink -f /usr/bin/mpirun /usr/bin/all_reduce_perf").stdout.split()
        assert paths == ["/usr/bin/orterun", "/usr/lib/gpufleet-sim/bin/all_reduce_perf"], (n.name, paths)
    print("mpi fleet up and prepared in %.1f s" % (time.monotonic() - started))
    yield fleet
    problems = fleet.down()
    assert not problems and not fleet.leftovers(), problems + fleet.leftovers()


def names(fleet):
    return [n.name for n in fleet.nodes]


def round_one(fleet):
    """Round 1's pairs as the search plans them (no leaves, seed 0): [(launching node, partner)]."""
    return search.first_round(dict.fromkeys(names(fleet)), seed=0)


def run_search(fleet, tmp, name, fabric, start_only=False):
    """Write the shared fabric file on every node and run the fabric playbook with real mpirun."""
    text = json.dumps(dict({"seed": 5, "leaves": {"leaf-1": names(fleet)}}, **fabric))
    for node in names(fleet):
        fleet.ssh(node, "cat > %s" % FABRIC_FILE, input=text)
    inv = tmp / ("%s.yml" % name)
    inv.write_text(json.dumps({"gpufleet_nodes": {"vars": {
        "gpufleet_fabric_ranks_per_node": 1, "gpufleet_fabric_pair_busbw_gbps": 46.0,
        "gpufleet_fabric_pair_timeout_s": 90, "gpufleet_fabric_min_bytes": "1M", "gpufleet_fabric_max_bytes": "8M",
        # How a site points mpirun's ssh at its key; MPI's own traffic over TCP (these nodes have no InfiniBand).
        "gpufleet_fabric_mpirun_args": ["--mca", "plm_rsh_args", RSH_ARGS, "--mca", "pml", "ob1",
                                        "--mca", "btl", "self,tcp"],
        # Exported to both ranks (-x): the stand-in's scenario, the shared fabric, compressed time.
        "gpufleet_fabric_env": {"GPUFLEET_SIM_SCENARIO": "/usr/lib/gpufleet-sim/scenarios/healthy_h100.json",
                                "GPUFLEET_SIM_FABRIC": FABRIC_FILE, "GPUFLEET_SIM_TIME_SCALE": "0.001"}}}}))
    reports = tmp / ("reports-%s" % name)
    run = PlaybookRun(fleet, str(REPO / FABRIC), ["-e", "gpufleet_report_dir=%s" % reports, "-e",
                                                  "gpufleet_history_enabled=false"],
                      inventories=[fleet.inventory_path, inv], tmp_path=tmp)
    run.reports = reports
    return run if start_only else finish(run)


def finish(run, timeout=240):
    run.wait(timeout)
    files = sorted(f for f in run.reports.glob("*/report.json") if not f.parent.is_symlink())
    assert len(files) == 1, "expected one report in %s\n%s" % (run.reports, run.output[-4000:])
    run.report = json.loads(files[0].read_text())
    print("fabric search with real mpirun: %.1f s, rc=%s" % (time.monotonic() - run.started, run.proc.returncode))
    return run


def nodes_of(report):
    return {n["host"]: n for n in report["nodes"]}


def codes(node):
    return {f["code"] for f in node["findings"]}


def pairs_of(report):
    return [(p["round"], tuple(p["nodes"]), p["status"], p.get("busbw_gbps"), p.get("error")) for p in
            report["fabric"]["pairs"]]


def test_a_slow_nic_on_a_partner_is_found_and_named_with_its_action(mfleet, tmp_path):
    # A pair passes only when Open MPI's ssh used the inventory's plm_rsh_args: the nodes have no other key.
    (launcher, slow), (c, d) = round_one(mfleet)
    run = run_search(mfleet, tmp_path, "slow", {"faults": [
        {"kind": "slow_nic", "node": slow, "rail": 2, "factor": 0.5}]})
    report, nodes = run.report, nodes_of(run.report)
    assert run.proc.returncode != 0, run.output[-3000:]  # the gate fails on the accused node
    assert nodes[slow]["verdict"] == "fail" and codes(nodes[slow]) == {"FABRIC_NODE_SLOW"}, pairs_of(report)
    assert nodes[slow]["worst"]["action"].startswith("on %s check the NIC rails" % slow)
    assert {h: n["verdict"] for h, n in nodes.items() if h != slow} == dict.fromkeys({launcher, c, d}, "pass")
    pairs = pairs_of(report)
    # Round 1: the slow node was rank 1, on the partner: its figure reached rank 0 on the launcher over MPI.
    first = {p[1]: p for p in pairs if p[0] == 1}
    assert first[(launcher, slow)][2] == "slow" and first[(launcher, slow)][3] < 46.0 * 0.85, pairs
    assert first[(c, d)][2] == "pass", pairs


def test_a_node_without_mpirun_is_an_error_naming_it_and_the_fix(mfleet, tmp_path):
    _pair, (bare, partner) = round_one(mfleet)
    mfleet.ssh(bare, "mv /usr/bin/mpirun /root/mpirun.away")
    try:
        run = run_search(mfleet, tmp_path, "nompirun", {})
    finally:
        mfleet.ssh(bare, "mv /root/mpirun.away /usr/bin/mpirun")
    nodes = nodes_of(run.report)
    assert nodes[bare]["verdict"] == "error" and codes(nodes[bare]) == {"FABRIC_PAIR_ERROR"}, pairs_of(run.report)
    errors = [p for p in pairs_of(run.report) if p[1][0] == bare]
    said = "on %s, the node that launches the test: mpirun not found: install Open MPI (openmpi-bin)" % bare
    assert errors and all(p[2] == "error" and p[4].startswith(said) for p in errors), errors
    assert [h for h, n in nodes.items() if n["verdict"] == "fail"] == []  # nobody accused
    assert nodes[partner]["verdict"] == "pass", pairs_of(run.report)  # re-paired with a node that passed


def test_a_partner_killed_mid_test_is_open_mpi_s_error_and_accuses_nobody(mfleet, tmp_path):
    (launcher, victim), (c, d) = round_one(mfleet)
    # The victim's pair test holds (a stuck collective) until the victim dies; the other pair runs to its end.
    run = run_search(mfleet, tmp_path, "kill", {"hung": [victim]}, start_only=True)
    try:
        deadline = time.monotonic() + 120
        while mfleet.ssh(victim, "pgrep -f '[a]ll_reduce_perf'", check=False).returncode != 0:
            assert time.monotonic() < deadline and run.proc.poll() is None, run.output[-3000:]
            time.sleep(0.5)
        mfleet.kill_node(victim)
        run = finish(run)
    finally:
        if harness.container_pid1(mfleet.node(victim).netns) is None:
            mfleet.restart_node(victim)
    report, nodes, pairs = run.report, nodes_of(run.report), pairs_of(run.report)
    killed = [p for p in pairs if p[0] == 1 and p[1] == (launcher, victim)]
    assert killed and killed[0][2] == "error", pairs
    finding = [f for f in report["fabric"]["findings"] if f["code"] == "FABRIC_PAIR_ERROR"
               and "pair %s <-> %s:" % (launcher, victim) in f["message"]]
    assert finding and "neither node is accused" in finding[0]["message"], finding
    # Open MPI ended the job at once (not the timeout), in its own words; which ones is a race (seen: ssh's line
    # first or not, then that the daemon's connection was lost or that the daemons could not be started).
    said = [killed[0][4]] + finding[0]["evidence"]
    assert re.fullmatch(r"rc=\d+: (ORTE has lost communication with a remote daemon\.|Connection to %s closed by "
                        r"remote host\.)" % victim, killed[0][4]), said
    assert {"ORTE has lost communication with a remote daemon.",
            "ORTE was unable to reliably start one or more daemons."} & {line.split(": ", 1)[-1] for line in said}, said
    assert [p for p in pairs if p[0] == 1 and p[1] == (c, d)][0][2] == "pass", pairs
    assert [h for h, n in nodes.items() if n["verdict"] == "fail"] == []  # nobody accused
    assert nodes[victim]["verdict"] == "error" and codes(nodes[victim]) == {"FABRIC_PAIR_ERROR"}, pairs
