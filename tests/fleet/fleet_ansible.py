"""Run Ansible against the test fleet as a user would: ansible-playbook subprocesses with the repo's ansible.cfg."""

import contextlib
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_BIN = Path(sys.executable).parent
INSTALL_SIM = """
- name: Install the simulated GPU tools
  hosts: all
  gather_facts: false
  tasks:
    - name: Install gpufleet-sim from the local repository
      ansible.builtin.apt:
        name: gpufleet-sim
        update_cache: true
"""
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The simulator's GPU tools on a fleet node (package gpufleet-sim): the variables that point a run at them.
SIM_VARS = {
    "gpufleet_sim_time_scale": "0.01",
    "gpufleet_poll_interval_s": 2,
    "gpufleet_psu_rails": {"A": [0, 1, 2, 3], "B": [4, 5, 6, 7]},
    "gpufleet_environment": {
        "PATH": "{{ gpufleet_sim_root }}/bin:{{ gpufleet_sim_base_path }}",
        "GPUFLEET_SIM_SCENARIO": "{{ gpufleet_sim_root }}/scenarios/{{ gpufleet_sim_scenario }}.json",
        "GPUFLEET_SIM_STATE": "{{ gpufleet_sim_state_root }}/{{ inventory_hostname }}",
        "GPUFLEET_SIM_NODE": "{{ inventory_hostname }}",
        "GPUFLEET_SIM_TIME_SCALE": "{{ gpufleet_sim_time_scale }}",
        "GPUFLEET_SIM_NCCL_HOLD_S": "{{ gpufleet_sim_nccl_hold_s | default(0) }}",
    },
    # Per node: the role keeps its XID read position here. Shared by "local" nodes, one would hide another's XIDs.
    "gpufleet_state_dir": "{{ gpufleet_sim_state_root }}/{{ inventory_hostname }}/gpufleet",
    "gpufleet_checkpoint_path": "{{ gpufleet_sim_state_root }}/{{ inventory_hostname }}/checkpoint",
    "gpufleet_checkpoint_size_gb": 1.0,
    "gpufleet_checkpoint_write_test_mb": 64,
    "gpufleet_checkpoint_mounts_file": "{{ gpufleet_sim_state_root }}/{{ inventory_hostname }}/mounts",
}
# Where package gpufleet-sim puts the simulator on a node, and its state there: SIM_VARS for nodes reached over SSH.
NODE_SIM_ROOT = "/usr/lib/gpufleet-sim"
NODE_SIM_STATE_ROOT = "/var/lib/gpufleet-sim"
NODE_SIM_VARS = dict(SIM_VARS, gpufleet_sim_root=NODE_SIM_ROOT, gpufleet_sim_state_root=NODE_SIM_STATE_ROOT,
                     gpufleet_sim_base_path=NODE_PATH)


def ansible_env(extra=None):
    env = dict(os.environ)
    env.update({"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_INJECT_FACT_VARS": "false",
                "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "PATH": "%s:%s" % (ANSIBLE_BIN, env["PATH"])})
    env.update(extra or {})
    return env


LIVE = set()  # runs not yet waited for: the fleet finalizer ends them (Ctrl-C, a failed test) before teardown


def stop_live_runs():
    for run in list(LIVE):
        if run.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, 9)
            run.proc.wait()
        LIVE.discard(run)


class PlaybookRun:
    """An ansible-playbook subprocess whose output lines are time-stamped as they arrive."""

    RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)"
                       r"\s+rescued=(\d+)\s+ignored=(\d+)")

    def __init__(self, fleet, playbook, extra_args=(), env=None, tmp_path=None, inventories=None):
        if not str(playbook).endswith(".yml"):  # inline playbook text
            path = Path(tmp_path) / "play.yml"
            path.write_text(textwrap.dedent(playbook))
            playbook = path
        inventories = inventories or [fleet.inventory_path]
        self.argv = [str(ANSIBLE_BIN / "ansible-playbook"), *[a for i in inventories for a in ("-i", str(i))],
                     str(playbook), *extra_args]
        self.started = time.monotonic()
        self.lines = []  # (seconds since start, line)
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=ansible_env(env), cwd=str(REPO), start_new_session=True)
        LIVE.add(self)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))

    def wait(self, timeout):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
            raise AssertionError("ansible-playbook did not finish within %s s:\n%s" % (timeout, self.output[-4000:])) from None
        finally:
            LIVE.discard(self)
        self._reader.join(10)
        return self

    @property
    def output(self):
        return "\n".join(line for _, line in self.lines)

    def first(self, pattern):
        """Seconds after start at which a line matching `pattern` appeared, or None."""
        rx = re.compile(pattern)
        for t, line in self.lines:
            if rx.search(line):
                return t
        return None

    @property
    def recap(self):
        out = {}
        for _, line in self.lines:
            m = self.RECAP.match(line)
            if m:
                keys = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")
                out[m.group(1)] = dict(zip(keys, map(int, m.groups()[1:]), strict=True))
        return out
