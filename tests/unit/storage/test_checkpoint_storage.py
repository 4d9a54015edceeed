"""kentino.gpufleet.checkpoint_storage run as Ansible runs it: real statvfs and write test on a temp directory, a
mount table fixture mapping that directory to an NVMe partition, and stand-in nvme/smartctl printing fixtures."""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_storage
from ansible_collections.kentino.gpufleet.plugins.module_utils.thresholds import DEFAULTS
from helpers.module_runner import REPO, run_module

FIX = REPO / "tests" / "fixtures" / "storage"
NO_TOOLS = {"nvme_executable": "/nonexistent/nvme", "smartctl_executable": "/nonexistent/smartctl"}
T = dict(DEFAULTS)  # the module's option defaults are the inventory defaults


def _codes(findings):
    return [f["code"] for f in findings]


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    return d


def mounts_file(tmp_path, target, source="/dev/nvme1n1p1", opts="rw,noatime", fstype="ext4"):
    f = tmp_path / "mounts"
    f.write_text("/dev/nvme0n1p2 / ext4 rw,relatime 0 0\n%s %s %s %s 0 0\n"
                 % (source, str(target).replace(" ", "\\040"), fstype, opts))
    return str(f)


def stand_in(tmp_path, name, fixture, rc=0):
    """A fake tool that records its argv and prints a fixture, as the real one would."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    tool = bindir / name
    tool.write_text("#!/bin/sh\necho \"$@\" >> %s/%s.argv\ncat %s\nexit %d\n" % (tmp_path, name, FIX / fixture, rc))
    tool.chmod(0o755)
    return str(tool)


def leftovers(d):
    return [p.name for p in Path(d).iterdir()]


def test_healthy_nvme_pass_with_figures(tmp_path, ckpt, contract):
    nvme = stand_in(tmp_path, "nvme", "nvme_smart_healthy.json")
    r = run_module("checkpoint_storage", {"path": str(ckpt), "checkpoint_size_gb": 0.5, "keep": 2, "interval_min": 30,
                                          "write_test_mb": 16, "mounts_file": mounts_file(tmp_path, ckpt),
                                          "nvme_executable": nvme})
    assert r["verdict"] == "pass", r["reasons"]
    assert not r.get("failed")
    assert r["mount"]["source"] == "/dev/nvme1n1p1" and r["mount"]["read_only"] is False
    assert (tmp_path / "nvme.argv").read_text().split() == ["smart-log", "/dev/nvme1", "-o", "json"]
    dev = r["devices"][0]
    assert dev["device"] == "/dev/nvme1" and dev["tool"] == "nvme"
    assert dev["health"]["percent_used"] == 3 and dev["health"]["temperature_c"] == 37.9
    wt = r["write_test"]
    assert wt["performed"] and wt["verified"] and wt["bytes"] == 16 * 10**6 and wt["write_mb_per_s"] > 0
    expected = round(0.5e9 / (wt["write_mb_per_s"] * 1e6), 2)
    assert abs(r["estimated_checkpoint_s"] - expected) <= 0.02
    assert r["overhead_pct"] == pytest.approx(r["estimated_checkpoint_s"] / 1800 * 100, rel=0.01)
    assert r["worst_case_lost_min"] == 30
    assert r["space"]["free_gb"] > 0 and r["space"]["statvfs_line"].startswith("statvfs ")
    assert r["tool"]["argv"][1:] == ["smart-log", "/dev/nvme1", "-o", "json"] and r["tool"]["rc"] == 0
    assert leftovers(ckpt) == []  # the test file is gone
    assert contract("checkpoint_storage", r, judge_storage.judge, T) == []
    # Whether the checkpoints fit is judged, not observed: 2 x 0.5 GB + 10 % needs 1.1 GB; the report's margin can
    # make the same free space too little.
    assert judge_storage.judge(r, dict(T, gpufleet_storage_margin_pct=1e9), "vm")[0]["code"] == "STORAGE_FAIL"


def test_read_only_mount_fails_with_action(tmp_path, ckpt, contract):
    r = run_module("checkpoint_storage", dict(NO_TOOLS, path=str(ckpt), write_test_mb=1,
                                              mounts_file=mounts_file(tmp_path, ckpt, opts="ro,noatime")))
    assert r["verdict"] == "fail"
    assert _codes(contract("checkpoint_storage", r, judge_storage.judge, T)) == ["STORAGE_FAIL"]
    assert any("read-only mount (/dev/nvme1n1p1" in x and "dmesg" in x and "fsck" in x for x in r["reasons"])
    assert any(" ro,noatime " in e for e in r["evidence"])


def test_nvme_read_only_critical_warning_fails(tmp_path, ckpt, contract):
    nvme = stand_in(tmp_path, "nvme", "nvme_smart_readonly.json")
    r = run_module("checkpoint_storage", {"path": str(ckpt), "write_test_mb": 1, "nvme_executable": nvme,
                                          "mounts_file": mounts_file(tmp_path, ckpt)})
    assert r["verdict"] == "fail"
    assert any("read-only mode" in x and "replace the drive" in x for x in r["reasons"])
    assert r["devices"][0]["health"]["critical_warning_flags"] == ["reliability_degraded", "read_only"]
    assert "STORAGE_FAIL" in _codes(contract("checkpoint_storage", r, judge_storage.judge, T))


def test_worn_drive_warns(tmp_path, ckpt, contract):
    nvme = stand_in(tmp_path, "nvme", "nvme_smart_v1_floats.json")
    r = run_module("checkpoint_storage", {"path": str(ckpt), "write_test_mb": 1, "nvme_executable": nvme,
                                          "mounts_file": mounts_file(tmp_path, ckpt)})
    assert r["verdict"] == "warn"
    assert any("84% of its rated endurance" in x for x in r["reasons"])
    assert r["devices"][0]["health"]["data_written_tb"] == round(987654321012 * 512000 / 1e12, 3)
    assert _codes(contract("checkpoint_storage", r, judge_storage.judge, T)) == ["STORAGE_WARN"]
    # the wear threshold is the report's too: at 90 % the same drive is fine
    assert judge_storage.judge(r, dict(T, gpufleet_storage_wear_warn_pct=90), "vm") == []


def test_smartctl_fallback_bitmask(tmp_path, ckpt):
    smart = stand_in(tmp_path, "smartctl", "smartctl_nvme_errorlog_only.json", rc=64)
    r = run_module("checkpoint_storage", {"path": str(ckpt), "write_test_mb": 1, "nvme_executable": "/nonexistent/nvme",
                                          "smartctl_executable": smart, "mounts_file": mounts_file(tmp_path, ckpt)})
    assert r["verdict"] == "pass", r["reasons"]  # rc 64 = error-log entries only: not a failure
    assert (tmp_path / "smartctl.argv").read_text().split() == ["-j", "-a", "/dev/nvme1"]
    assert [b["name"] for b in r["devices"][0]["health"]["exit_bits"]] == ["error_log_has_errors"]

    smart = stand_in(tmp_path, "smartctl", "smartctl_nvme_failing.json", rc=72)
    r = run_module("checkpoint_storage", {"path": str(ckpt), "write_test_mb": 1, "nvme_executable": "/nonexistent/nvme",
                                          "smartctl_executable": smart, "mounts_file": mounts_file(tmp_path, ckpt)})
    assert r["verdict"] == "fail"
    assert any("SMART overall health" in x for x in r["reasons"])


def test_unreadable_health_is_a_note_not_a_verdict(tmp_path, ckpt):
    nvme = stand_in(tmp_path, "nvme", "nvme_smart_permission_denied.txt", rc=1)
    r = run_module("checkpoint_storage", {"path": str(ckpt), "write_test_mb": 1, "nvme_executable": nvme,
                                          "mounts_file": mounts_file(tmp_path, ckpt)})
    assert r["verdict"] == "pass"
    assert any("health of /dev/nvme1 not read" in n and "become: true" in n for n in r["notes"])


def test_missing_tools_only_noted(tmp_path, ckpt):
    r = run_module("checkpoint_storage", dict(NO_TOOLS, path=str(ckpt), write_test_mb=1,
                                              mounts_file=mounts_file(tmp_path, ckpt)))
    assert r["verdict"] == "pass"
    assert any("install nvme-cli" in n for n in r["notes"])
    assert r["tool"]["argv"] == []


def test_network_filesystem_not_probed(tmp_path, ckpt):
    r = run_module("checkpoint_storage", dict(NO_TOOLS, path=str(ckpt), write_test_mb=1, mounts_file=mounts_file(
        tmp_path, ckpt, source="nas01:/export/ckpt", fstype="nfs4", opts="rw,hard")))
    assert r["verdict"] == "pass" and r["devices"] == []
    assert any("network filesystem" in n for n in r["notes"])


def test_does_not_fit_and_inodes(tmp_path, ckpt, contract):
    r = run_module("checkpoint_storage", dict(NO_TOOLS, path=str(ckpt), checkpoint_size_gb=10**6, keep=3,
                                              write_test_mb=0, min_free_inodes=2**62,
                                              mounts_file=mounts_file(tmp_path, ckpt)))
    assert r["verdict"] == "fail"
    assert any("3 checkpoints of 1000000.0 GB (+10.0% margin) need 3300000.0 GB" in x for x in r["reasons"])
    assert any("free inodes" in x for x in r["reasons"])
    assert r["write_test"]["performed"] is False
    t = dict(T, gpufleet_storage_min_free_inodes=2**62)
    findings = contract("checkpoint_storage", r, judge_storage.judge, t)
    assert _codes(findings) == ["STORAGE_FAIL", "STORAGE_FAIL"]
    assert all(f["evidence"] == [r["space"]["statvfs_line"]] for f in findings)


def test_slow_storage_warns(tmp_path, ckpt, contract):
    r = run_module("checkpoint_storage", dict(NO_TOOLS, path=str(ckpt), checkpoint_size_gb=1, write_test_mb=8,
                                              interval_min=1, max_overhead_pct=0.001,
                                              mounts_file=mounts_file(tmp_path, ckpt)))
    assert r["verdict"] == "warn"
    assert any("of the 1.0-min interval" in x for x in r["reasons"])
    assert r["overhead_pct"] > 0.001
    t = dict(T, gpufleet_storage_max_overhead_pct=0.001)
    assert _codes(contract("checkpoint_storage", r, judge_storage.judge, t)) == ["STORAGE_WARN"]


def test_missing_path_fails_with_fix(tmp_path, contract):
    r = run_module("checkpoint_storage", dict(NO_TOOLS, path=str(tmp_path / "absent")))
    assert r["verdict"] == "fail"
    assert "training_env role creates it" in r["reasons"][0]
    assert _codes(contract("checkpoint_storage", r, judge_storage.judge, T)) == ["STORAGE_FAIL"]


def test_check_mode_writes_nothing(tmp_path, ckpt, contract):
    r = run_module("checkpoint_storage", dict(NO_TOOLS, path=str(ckpt), checkpoint_size_gb=1,
                                              mounts_file=mounts_file(tmp_path, ckpt)), check_mode=True)
    assert r["verdict"] == "pass"
    assert r["write_test"]["performed"] is False and "check mode: write test skipped" in r["notes"]
    assert leftovers(ckpt) == []
    assert contract("checkpoint_storage", r, judge_storage.judge, T) == [], "1 GB x 2 fits the temp filesystem"


def test_bad_options_fail_the_module(tmp_path, ckpt):
    r = run_module("checkpoint_storage", {"path": str(ckpt), "interval_min": 0})
    assert r.get("failed") is True and "interval_min" in r["msg"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser") or not os.path.exists("/usr/bin/python3"),
                    reason="needs root, runuser and /usr/bin/python3 to run the module as nobody")
def test_permission_denied_names_owner_mode_and_user():
    # A root-owned 0755 directory in a place nobody can traverse to; tmp_path's parents are 0700.
    base = tempfile.mkdtemp(prefix="gpufleet-perm-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        d = Path(base) / "ckpt"
        d.mkdir()
        os.chmod(d, 0o755)
        args = Path(base) / "args.json"
        args.write_text('{"ANSIBLE_MODULE_ARGS": {"path": "%s", "write_test_mb": 1, "nvme_executable": "/x/nvme", '
                        '"smartctl_executable": "/x/smartctl", "_ansible_check_mode": false}}' % d)
        os.chmod(args, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        site = [p for p in sys.path if p.endswith("site-packages")][0]
        env = dict(os.environ, PYTHONPATH="%s:%s" % (REPO / "collections", site))
        # The venv's interpreter may live under /root (0700): nobody runs the system python with the venv's
        # pure-Python ansible on PYTHONPATH, as a node would run the module with its own python.
        python = "/usr/bin/python3"
        proc = subprocess.run(["runuser", "-u", "nobody", "--", python,
                               str(REPO / "plugins/modules/checkpoint_storage.py"), str(args)],
                              capture_output=True, text=True, env=env, timeout=120)
        out = proc.stdout
        assert "{" in out, proc.stderr[-2000:]
        r = json.loads(out[out.index("{"):])
        assert r["verdict"] == "fail", r
        assert r["path"]["owner_mode"] == "owned by root (uid 0), mode 0755"
        reason = [x for x in r["reasons"] if "not writable" in x][0]
        assert "by nobody (uid 65534)" in reason and "owned by root (uid 0), mode 0755" in reason
        assert r["write_test"]["errno"] == "EACCES" and r["write_test"]["stage"] == "open"
        assert r["user"] == {"name": "nobody", "uid": 65534}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _module():
    import importlib
    return importlib.import_module("ansible_collections.kentino.gpufleet.plugins.module_utils.checkpoint_state")


def test_write_test_disk_full_cleans_up(tmp_path, monkeypatch):
    mod = _module()
    real_write = os.write
    calls = []

    def full(fd, data):
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(mod.os, "write", full)
    res = mod.write_test(str(tmp_path), 12 * 10**6)
    assert res["errno"] == "ENOSPC" and res["stage"] == "write" and not res["verified"]
    assert leftovers(tmp_path) == []


def test_write_test_detects_corruption(tmp_path, monkeypatch):
    mod = _module()
    real_read = os.read

    def flip(fd, n):
        data = real_read(fd, n)
        return bytes([data[0] ^ 0xFF]) + data[1:] if data else data

    monkeypatch.setattr(mod.os, "read", flip)
    res = mod.write_test(str(tmp_path), 2 * 10**6)
    assert res["stage"] == "compare" and res["verified"] is False and "differ" in res["error"]
    assert leftovers(tmp_path) == []
    result = {"path": {"given": "/ckpt", "exists": True, "is_dir": True, "writable": True},
              "user": {"name": "train", "uid": 1000}, "write_test": res}
    (finding,) = judge_storage.judge(result, T, "node01")
    assert finding["severity"] == "fail" and "silent data corruption" in finding["message"]
    assert finding["evidence"] == ["/ckpt: %s (None) at compare" % res["error"]]


def test_write_test_hang_is_bounded(tmp_path, monkeypatch):
    mod = _module()
    import threading
    gate = threading.Event()
    monkeypatch.setattr(mod, "write_test", lambda d, n: gate.wait(30))
    res = mod._run_write_test(str(tmp_path), 1, 1)
    gate.set()
    assert res["errno"] == "ETIMEDOUT" and "within 1 s" in res["error"]
