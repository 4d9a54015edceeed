"""The repair ladder's BMC power cycle on the simulated fleet, through a real Redfish client and server: the
lifecycle playbook runs community.general's Redfish modules against sushy-tools' emulator (sim/bmc: its fake driver,
one system per node, HTTPS with basic auth). A node whose GPU fell off the bus (XID 79) is quarantined, power-cycled
(the emulator's power state goes Off and On; the node's simulator state is cleared at power-off, so the lost GPU is
back), validated by the preflight and returned to Slurm. A BMC that refuses the credentials (401), one that never
answers (a socket that accepts and says nothing), one that accepts the reset but whose system never powers on
(sushy-tools' static emulator, its system mocked Off) and a malformed BMC address each leave the node quarantined and
drained with the fault named, and nothing resumed."""

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from helpers.lifecycle_runs import play, rows, slurm

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NODES = ("bm01", "bm02", "bm03", "bm04", "bm05")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, limit=60):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the BMC emulator exited with %s" % proc.returncode
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("nothing listens on %d after %ss" % (port, limit))


def static_bmc(root, port, cert, key):
    """sushy-static serving a BMC whose one system accepts every reset (204) and stays Off."""
    mock = root / "mockup"
    system = {"@odata.id": "/redfish/v1/Systems/dead", "Id": "dead", "Name": "dead", "PowerState": "Off",
              "Actions": {"#ComputerSystem.Reset": {"target": "/redfish/v1/Systems/dead/Actions/ComputerSystem.Reset",
                                                    "ResetType@Redfish.AllowableValues": ["On", "ForceOff"]}}}
    for rel, doc in (("", {"@odata.id": "/redfish/v1/", "Id": "RootService", "RedfishVersion": "1.6.0",
                           "Systems": {"@odata.id": "/redfish/v1/Systems"}}),
                     ("Systems", {"@odata.id": "/redfish/v1/Systems", "Members@odata.count": 1,
                                  "Members": [{"@odata.id": "/redfish/v1/Systems/dead"}]}),
                     ("Systems/dead", system)):
        (mock / rel).mkdir(parents=True, exist_ok=True)
        (mock / rel / "index.json").write_text(json.dumps(system if rel == "Systems/dead" else doc))
    return subprocess.Popen([str(BIN / "sushy-static"), "--interface", "127.0.0.1", "--port", str(port),
                             "--mockup-files", str(mock), "--ssl-certificate", str(cert), "--ssl-key", str(key)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("bmc")
    subprocess.run([sys.executable, str(REPO / "sim" / "make_inventory.py"), "--out", str(root / "inv"), "--nodes",
                    str(len(NODES)), "--scenario", "riser_xid79", "--prefix", "bm"], check=True)
    port, static_port, silent = free_port(), free_port(), socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does) and never answers: a BMC that hangs
    emulator = subprocess.Popen([sys.executable, str(REPO / "sim" / "bmc"), "--dir", str(root / "bmc"), "--root",
                                 str(root / "state"), "--nodes", ",".join(NODES), "--port", str(port), "--password",
                                 "s3cret-bmc"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env=dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"])))
    ids = {}
    while len(ids) < len(NODES):
        _, node, sid = emulator.stdout.readline().split()
        ids[node] = sid
    procs = [emulator]
    try:
        wait_listening(port, emulator)
        procs.append(static_bmc(root, static_port, root / "bmc" / "bmc.crt", root / "bmc" / "bmc.key"))
        wait_listening(static_port, procs[-1])
        good = {"gpufleet_bmc_url": "https://127.0.0.1:%d" % port, "gpufleet_bmc_username": "admin",
                "gpufleet_bmc_password": "s3cret-bmc", "gpufleet_bmc_validate_certs": True,
                "gpufleet_bmc_ca_path": str(root / "bmc" / "bmc.crt"), "gpufleet_bmc_timeout_s": 3,
                "gpufleet_bmc_power_on_wait_s": 60, "gpufleet_poll_interval_s": 1}
        host_vars = {
            "bm01": dict(good, gpufleet_bmc_system_id=ids["bm01"]),
            "bm02": dict(good, gpufleet_bmc_system_id=ids["bm02"], gpufleet_bmc_password="wrong-password"),
            "bm03": dict(good, gpufleet_bmc_url="https://127.0.0.1:%d" % silent.getsockname()[1]),
            "bm04": dict(good, gpufleet_bmc_url="https://127.0.0.1:%d" % static_port, gpufleet_bmc_validate_certs=False,
                         gpufleet_bmc_power_on_wait_s=2),
            "bm05": dict(good, gpufleet_bmc_url="https://127.0.0.1:%d/redfish\n" % port),
        }
        (root / "inv" / "host_vars").mkdir()
        for node, values in host_vars.items():
            (root / "inv" / "host_vars" / ("%s.yml" % node)).write_text(yaml.safe_dump(values))
        yield root
    finally:
        silent.close()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def sim(root, node, *argv):
    env = dict(os.environ, GPUFLEET_SIM_STATE=str(root / "state" / node), GPUFLEET_SIM_NODE=node,
               GPUFLEET_SIM_SCENARIO="riser_xid79", GPUFLEET_SIM_TIME_SCALE="0.001")
    return subprocess.run([str(REPO / "sim" / "bin" / argv[0])] + list(argv[1:]), env=env, capture_output=True,
                          text=True, timeout=60)


def test_power_cycle_through_the_bmc_returns_the_node_and_each_bmc_fault_keeps_it_quarantined(fleet):
    def one(node):
        if node == "bm01":  # the riser drops GPU 3 under load: lost until the node loses power
            sim(fleet, node, "gpu_burn", "30")
            lost = sim(fleet, node, "nvidia-smi", "-L").returncode
        else:
            lost = None
        quarantine = play(fleet, node, "quarantine", "lifecycle_code=XID_79", "lifecycle_gpu=3")
        return lost, quarantine, play(fleet, node, "repair")

    with ThreadPoolExecutor(len(NODES)) as pool:
        results = dict(zip(NODES, pool.map(one, NODES), strict=True))

    lost, (rc, out), (rc2, out2) = results["bm01"]
    assert lost != 0 and rc == 0, out[-3000:]
    assert rc2 == 0, out2[-6000:]
    bm01 = rows(fleet, "bm01")
    assert [r["to_state"] for r in bm01] == ["quarantined", "repairing", "validating", "healthy"]
    assert bm01[1]["evidence"][0] == "rung: bmc_power_cycle" and bm01[3]["actor"] == "preflight"
    # The yaml callback folds a long message at spaces: where depends on the steps' timestamps.
    said = " ".join(out2.split())
    assert "PowerState Off" in said and "PowerState On" in said
    assert sim(fleet, "bm01", "nvidia-smi", "-L").returncode == 0  # the power cycle brought GPU 3 back
    assert slurm(fleet, "bm01")["drain"] is False

    expected = {"bm02": "auth_failed: HTTP Error 401", "bm03": "timeout: ", "bm04": "no_power_on: the system still "
                "reports PowerState Off", "bm05": "bad_input: gpufleet_bmc_url must be https://HOST[:PORT]"}
    for node, words in expected.items():
        (rc, out), (rc2, out2) = results[node][1:]
        assert rc == 0, out[-3000:]
        said = " ".join(out2.split())
        assert rc2 != 0 and words in said and "stays quarantined" in said, (node, out2[-4000:])
        states = [r["to_state"] for r in rows(fleet, node)]
        assert states == ["quarantined", "repairing", "quarantined"], (node, states)
        assert words.split(":")[0] in rows(fleet, node)[-1]["reason"], rows(fleet, node)[-1]
        assert slurm(fleet, node)["drain"] is True and slurm(fleet, node)["reason"] == "gpufleet: XID_79 3", slurm(fleet, node)
        assert "s3cret-bmc" not in out2 and "wrong-password" not in out2
