"""The XID watcher following the simulator's stand-in journalctl (-f, --after-cursor, --grep, JSON as journald writes
it): cursors across restarts, a vacuumed journal, a cursor that is gone, a reboot, journalctl without --grep, GPU
identities and counts from the stand-in nvidia-smi, dmesg, and a metrics directory that is not writable."""

import json
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest
from watchlib import SIM_BIN, XID79, WatcherProc, install_tree, total, value

REPO = Path(__file__).resolve().parents[3]
if str(REPO / "sim") not in sys.path:
    sys.path.insert(0, str(REPO / "sim"))

from gpufleet_sim.state import Node  # noqa: E402

SCENARIO = "healthy_h100"  # its previous boot holds an XID 119: not this boot's business


class SimNode:
    def __init__(self, root, scenario=SCENARIO):
        self.state = root / "node"
        self.env = {"GPUFLEET_SIM_SCENARIO": scenario, "GPUFLEET_SIM_STATE": str(self.state),
                    "GPUFLEET_SIM_NODE": "node", "GPUFLEET_SIM_TIME_SCALE": "0.001",
                    "PATH": str(SIM_BIN) + os.pathsep + os.environ["PATH"]}
        self.node = Node(env=self.env)
        self.boot_id_file = root / "boot_id"
        self.sync_boot_id()

    def sync_boot_id(self):
        self.node = Node(env=self.env)
        self.boot_id_file.write_text(self.node.boot["id"] + "\n")

    def gpu(self, index):
        return self.node.gpus[index]

    def xid(self, index, code, body="test", pid="'<unknown>'", name="<unknown>"):
        self.node.append_kernel(["NVRM: Xid (PCI:%s): %d, pid=%s, name=%s, %s" % (self.gpu(index)["pci_xid"], code,
                                                                               pid, name, body)])

    def reboot(self):
        """A new boot in the simulated journal (the old one's entries stay, as journald keeps them)."""
        info = self.node.read_json("node.json")
        now = time.time()
        info["boots"][-1]["end"] = now - 1
        info["boots"].append({"id": "%032x" % (int(info["boots"][-1]["id"], 16) + 1), "start": now, "end": None})
        self.node.write_json("node.json", info)
        self.sync_boot_id()


@pytest.fixture
def sim(tmp_path):
    return SimNode(tmp_path)


def journal_watcher(tmp_path, sim, **cfg):
    conf = {"source": "journal", "journalctl": str(SIM_BIN / "journalctl"), "boot_id_file": str(sim.boot_id_file)}
    conf.update(cfg)
    return WatcherProc(tmp_path / "w", env=sim.env, **conf)


def xids(m, **labels):
    return total(m, "gpufleet_xid_events_total", **labels)


def test_journal_follow_counts_this_boot_then_resumes_after_its_cursor(tmp_path, sim):
    w = journal_watcher(tmp_path, sim)
    try:
        w.start()
        sim.xid(3, 79, "GPU has fallen off the bus.")
        m = w.wait_for(lambda m: value(m, "gpufleet_xid_events_total", xid="79") == 1)
        assert xids(m) == 1  # the previous boot's XID 119 is history, not this boot
        pci = "0000:%s:00" % sim.gpu(3)["bus"]
        assert value(m, "gpufleet_xid_events_total", pci=pci, xid="79", severity="critical") == 1
        assert value(m, "gpufleet_gpu_lost", pci=pci) == 1
        w.stop()
        assert w.state()["position"]["cursor"].startswith("s=")  # saved with the counters at the stop
        sim.xid(1, 48, "DBE while the watcher was down")
        w.start()
        m = w.wait_for(lambda m: xids(m) == 2)
        assert value(m, "gpufleet_xid_events_total", xid="48") == 1
        assert value(m, "gpufleet_xid_events_total", xid="79") == 1
        argv = w.log()
        assert "boot" in argv
    finally:
        w.stop()


def test_a_vacuumed_journal_and_a_cursor_that_is_gone_never_recount(tmp_path, sim):
    w = journal_watcher(tmp_path, sim)
    try:
        w.start()
        sim.xid(3, 79, "GPU has fallen off the bus.")
        sim.xid(4, 48, "DBE")
        w.wait_for(lambda m: xids(m) == 2)
        w.stop()
        # journald vacuum: the oldest entries, the one the cursor names included, are gone
        kernel = sim.state / "kernel.jsonl"
        lines = kernel.read_text().splitlines(keepends=True)
        kernel.write_text("".join(lines[-1:]))
        w.start()
        sim.xid(6, 31, "MMU fault after the vacuum")  # counted once read: what came before it was read too
        m = w.wait_for(lambda m: value(m, "gpufleet_xid_events_total", xid="31") == 1)
        assert xids(m) == 3
        w.stop()
        # a cursor journalctl cannot seek to: resume from the saved time, skip what is at or before it
        state = w.state()
        state["position"]["cursor"] = "not-a-cursor"
        (w.state_dir / "xid-watcher.state.json").write_text(json.dumps(state))
        w.start()
        sim.xid(5, 63, "row remap")
        m = w.wait_for(lambda m: value(m, "gpufleet_xid_events_total", xid="63") == 1)
        assert xids(m) == 4
        assert value(m, "gpufleet_xid_events_total", xid="79") == 1
        w.wait_for_log("the saved journal cursor is gone")
    finally:
        w.stop()


def test_after_a_reboot_the_rest_of_the_previous_boot_counts_but_its_losses_are_not_current(tmp_path, sim):
    w = journal_watcher(tmp_path, sim)
    try:
        w.start()
        sim.xid(2, 31, "page fault")
        w.wait_for(lambda m: xids(m) == 1)
        w.stop()
        sim.xid(3, 79, "GPU has fallen off the bus.")  # logged before the node went down
        sim.reboot()
        sim.xid(5, 48, "DBE in the new boot")
        w.start()
        m = w.wait_for(lambda m: xids(m) == 3)
        pci3 = "0000:%s:00" % sim.gpu(3)["bus"]
        assert value(m, "gpufleet_xid_events_total", pci=pci3, xid="79") == 1
        assert value(m, "gpufleet_gpu_lost", pci=pci3) == 0
        sim.xid(3, 79, "GPU has fallen off the bus.")  # and again in this boot
        m = w.wait_for(lambda m: value(m, "gpufleet_gpu_lost", pci=pci3) == 1)
        assert value(m, "gpufleet_xid_events_total", pci=pci3, xid="79") == 2
    finally:
        w.stop()


def test_journalctl_without_grep_support_is_asked_again_without_it(tmp_path, sim):
    wrapper = tmp_path / "journalctl"
    wrapper.write_text("#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in --grep=*) "
                       "echo 'Compiled without pattern matching support' >&2; exit 1;; esac; done\n"
                       "exec %s \"$@\"\n" % (SIM_BIN / "journalctl"))
    wrapper.chmod(0o755)
    w = journal_watcher(tmp_path, sim, journalctl=str(wrapper))
    try:
        w.start()
        sim.node.append_kernel(["igb 0000:c5:00.0 eno1: Reset adapter"] * 50)
        sim.xid(0, 79, "GPU has fallen off the bus.")
        m = w.wait_for(lambda m: xids(m) == 1)
        w.wait_for_log("cannot filter with --grep")
        # every kernel entry came (journalctl's JSON of each holds its message), NVRM ones were decoded
        assert value(m, "gpufleet_watcher_bytes_read_total") > 50 * len("igb 0000:c5:00.0 eno1: Reset adapter")
    finally:
        w.stop()


def test_gpu_identity_and_counts_come_from_nvidia_smi(tmp_path, sim):
    w = journal_watcher(tmp_path, sim, nvidia_smi=str(SIM_BIN / "nvidia-smi"), inventory_interval_seconds=0.5)
    try:
        w.start()
        m = w.wait_for(lambda m: value(m, "gpufleet_gpus_visible") == 8, what="8 GPUs listed")
        assert value(m, "gpufleet_gpus_expected") == 8
        g3 = sim.gpu(3)
        pci3 = "0000:%s:00" % g3["bus"]
        assert value(m, "gpufleet_gpu_info", pci=pci3, gpu="3", uuid=g3["uuid"]) == 1
        sim.xid(3, 48, "DBE")
        m = w.wait_for(lambda m: xids(m) == 1)
        assert value(m, "gpufleet_xid_events_total", pci=pci3, gpu="3", uuid=g3["uuid"], xid="48") == 1
        sim.node.mark_lost([3], "test")  # nvidia-smi now says "GPU is lost" for it
        m = w.wait_for(lambda m: value(m, "gpufleet_gpus_visible") == 7, what="7 GPUs visible")
        assert value(m, "gpufleet_gpus_expected") == 8  # the most it ever saw
        assert value(m, "gpufleet_gpu_lost", pci=pci3) == 1
    finally:
        w.stop()


def test_dmesg_source_skips_what_it_read_before(tmp_path, sim):
    w = WatcherProc(tmp_path / "w", env=sim.env, source="dmesg", dmesg=str(SIM_BIN / "dmesg"),
                    boot_id_file=str(sim.boot_id_file))
    try:
        w.start()
        sim.xid(6, 79, "GPU has fallen off the bus.")
        m = w.wait_for(lambda m: xids(m) == 1, timeout=20)
        pci = "0000:%s:00" % sim.gpu(6)["bus"]
        assert value(m, "gpufleet_gpu_lost", pci=pci) == 1
        # the stand-in dmesg exits after printing: the next line comes from a restarted dmesg, which prints the
        # whole buffer again; the lines read before are skipped
        sim.xid(2, 31, "MMU fault")
        m = w.wait_for(lambda m: value(m, "gpufleet_xid_events_total", xid="31") == 1, timeout=20)
        assert xids(m) == 2
    finally:
        w.stop()


def status_when(w, predicate, timeout=15.0):
    """The watcher's status file once it satisfies predicate."""
    deadline = time.monotonic() + timeout
    status = {}
    while time.monotonic() < deadline:
        path = w.state_dir / "xid-watcher.status.json"
        try:
            status = json.loads(path.read_text())
        except (OSError, ValueError):
            status = {}
        if predicate(status):
            return status
        time.sleep(0.1)
    raise AssertionError("status not reached in %s s: %s\n%s" % (timeout, status, w.log()[-2000:]))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the watcher as another user")
def test_an_unwritable_metrics_directory_is_reported_and_recovered(sim):
    # As root every directory is writable: run the watcher as nobody, as the service runs as its own user.
    root = Path(tempfile.mkdtemp(prefix="gpufleet-unwritable-", dir="/tmp"))
    w = None
    try:
        root.chmod(0o755)
        kern = root / "kern.log"
        kern.write_text("")
        kern.chmod(0o644)
        # the node's layout: the role's list of module_utils files and nothing else, the system Python
        tree = install_tree(root / "lib")
        w = WatcherProc(root / "w", user=65534, python="/usr/bin/python3", tree=tree, source="file", log_file=str(kern))
        for d in (w.root, w.metrics_dir, w.state_dir):
            os.chown(d, 65534, 65534)
        w.root.chmod(0o755)
        w.config_path.chmod(0o644)
        w.start()
        w.metrics_dir.chmod(0o555)  # e.g. an operator's chown, a read-only remount
        with open(kern, "a") as fh:
            fh.write("%s host kernel: [ 1.0] %s\n" % (time.strftime("%b %e %H:%M:%S"), XID79.format(bus="c1")))
        status = status_when(w, lambda st: st.get("textfile_ok") is False)
        assert "Permission denied" in status["textfile_error"]["error"]
        assert "keeps reading the kernel log" in w.wait_for_log("cannot write")
        assert w.proc.poll() is None
        w.metrics_dir.chmod(0o755)
        m = w.wait_for(lambda m: xids(m) == 1, what="the event once writable again")
        assert value(m, "gpufleet_gpu_lost", pci="0000:c1:00") == 1
        assert "writable again" in w.wait_for_log("writable again")  # the log line may follow the textfile
        status_when(w, lambda st: st.get("textfile_ok") is True)  # written right after the textfile
        assert stat.S_IMODE(os.stat(w.prom).st_mode) == 0o644
    finally:
        if w is not None:
            w.stop()  # also when an assertion failed: no watcher outlives its test
        shutil.rmtree(root, ignore_errors=True)
