"""judge_storage: each way a checkpoint fails (space, inodes, read-only, permissions, write errors, slowness, drive
health) against the job's figures and the thresholds; bad input."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_storage
from hypothesis import given, settings
from judgelib import BAD_TOP, GARBAGE, HOST, assert_schema, check_shape, codes, door, only, set_path, thresholds

STATVFS = "statvfs /ckpt: f_bavail=1 f_frsize=4096 f_favail=50000 f_files=100000"


def healthy(free_gb=100.0, size_gb=10.0, keep=2, rate=1000.0, interval_min=30.0):
    """A local NVMe directory with room for `keep` checkpoints of `size_gb`, written at `rate` MB/s."""
    return {
        "tool": {"argv": [], "rc": None, "timed_out": False, "duration_s": 0.0, "error": None},
        "job": {"checkpoint_size_gb": size_gb, "keep": keep, "interval_min": interval_min},
        "path": {"given": "/ckpt", "resolved": "/ckpt", "exists": True, "is_dir": True, "writable": True,
                 "owner_mode": "owned by train (uid 1000), mode 0755"},
        "mount": {"source": "/dev/nvme1n1p1", "target": "/ckpt", "fstype": "ext4", "read_only": False,
                  "line": "/dev/nvme1n1p1 /ckpt ext4 rw,noatime 0 0"},
        "space": {"free_gb": free_gb, "total_gb": 1000.0, "free_inodes": 50000, "total_inodes": 100000,
                  "statvfs_line": STATVFS},
        "devices": [{"device": "/dev/nvme1", "tool": "nvme", "readable": True, "health": {
            "device": "/dev/nvme1", "critical_warning": 0, "critical_warning_flags": [], "percent_used": 3,
            "available_spare_pct": 100, "available_spare_threshold_pct": 10, "media_errors": 0}}],
        "notes": [], "user": {"name": "train", "uid": 1000},
        "write_test": {"performed": True, "bytes": 256000000, "write_s": 0.256, "read_s": 0.1,
                       "write_mb_per_s": rate, "read_mb_per_s": 2000.0, "verified": True, "error": None,
                       "errno": None, "stage": None, "file": None},
    }


def judge(result, **t):
    return judge_storage.judge(result, thresholds(**t), HOST)


def _messages(findings):
    return [f["message"] for f in findings]


def test_healthy_storage_has_no_finding_and_matches_the_schema():
    result = healthy()
    result.update(judge_storage.figures(result))
    assert judge(result) == []
    assert_schema("checkpoint_storage", result, [])


@pytest.mark.parametrize("free_gb, expected", [(22.0, []), (21.99, [("STORAGE_FAIL", None)])])
def test_free_space_for_keep_checkpoints_plus_the_margin(free_gb, expected):
    # 2 x 10 GB + 10 % = 22 GB
    findings = judge(healthy(free_gb=free_gb))
    assert codes(findings) == expected
    if findings:
        assert "need 22.0 GB" in findings[0]["message"] and findings[0]["evidence"] == [STATVFS]


def test_margin_is_a_threshold():
    assert judge(healthy(free_gb=21.0), gpufleet_storage_margin_pct=5.0) == []
    assert codes(judge(healthy(free_gb=21.0))) == [("STORAGE_FAIL", None)]
    assert judge(healthy(free_gb=1.0, size_gb=None)) == [], "no checkpoint size given: space reported, not judged"


@pytest.mark.parametrize("free_inodes, expected", [(10000, []), (9999, [("STORAGE_FAIL", None)])])
def test_free_inodes(free_inodes, expected):
    result = set_path(healthy(), ("space", "free_inodes"), free_inodes)
    assert codes(judge(result)) == expected
    assert judge(result, gpufleet_storage_min_free_inodes=100) == []
    # a filesystem without an inode limit (btrfs) reports 0 of 0: not a finding
    assert judge(set_path(set_path(result, ("space", "total_inodes"), 0), ("space", "free_inodes"), 0)) == []


def test_read_only_mount_and_statvfs_error():
    f = only(judge(set_path(healthy(), ("mount", "read_only"), True)), "STORAGE_FAIL")
    assert "read-only mount (/dev/nvme1n1p1 on /ckpt)" in f["message"] and "fsck" in f["action"]
    f = only(judge(set_path(healthy(), ("space",), {"error": "Stale file handle"})), "STORAGE_ERROR")
    assert f["severity"] == "error" and "statvfs(/ckpt) failed: Stale file handle" in f["message"]


def test_missing_path_and_not_a_directory():
    f = only(judge(set_path(healthy(), ("path", "exists"), False)), "STORAGE_FAIL")
    assert "does not exist" in f["message"] and "training_env role creates it" in f["message"]
    f = only(judge(set_path(healthy(), ("path", "is_dir"), False)), "STORAGE_FAIL")
    assert "is not a directory" in f["message"]


def test_not_writable_names_user_owner_and_mode():
    result = set_path(healthy(), ("path", "writable"), False)
    result["write_test"] = {"performed": False}
    f = only(judge(result), "STORAGE_FAIL")
    assert "not writable by train (uid 1000): owned by train (uid 1000), mode 0755" in f["message"]


@pytest.mark.parametrize("errno, stage, words", [
    ("EACCES", "open", "not writable by train (uid 1000): owned by train (uid 1000), mode 0755"),
    ("EROFS", "open", "read-only filesystem"),
    ("ENOSPC", "write", "is full (ENOSPC)"),
    ("EDQUOT", "write", "is full (EDQUOT)"),
    ("EIO", "fsync", "I/O error while writing (fsync)"),
    ("ETIMEDOUT", "hung", "the storage is hanging"),
    (None, "compare", "silent data corruption"),
    ("EINVAL", "read", "write test failed at read"),
])
def test_each_write_failure_says_why(errno, stage, words):
    result = healthy()
    result["write_test"].update(error="boom", errno=errno, stage=stage, verified=False)
    f = only(judge(result), "STORAGE_FAIL")
    assert words in f["message"] and f["evidence"] == ["/ckpt: boom (%s) at %s" % (errno, stage)]


@pytest.mark.parametrize("rate, expected", [(100.0, []), (99.0, [("STORAGE_WARN", None)])])
def test_checkpoint_overhead_against_the_interval(rate, expected):
    # 10 GB at 100 MB/s = 100 s = 5.0 % of a 2000 s interval (33.33 min): exactly the limit
    result = healthy(rate=rate, interval_min=2000 / 60.0)
    assert codes(judge(result)) == expected
    assert judge(result, gpufleet_storage_max_overhead_pct=10.0) == []
    fig = judge_storage.figures(healthy(rate=100.0, interval_min=2000 / 60.0))
    assert fig["estimated_checkpoint_s"] == 100.0 and fig["overhead_pct"] == 5.0


@pytest.mark.parametrize("health, severity, words", [
    ({"critical_warning_flags": ["read_only"]}, "fail", "replace the drive"),
    ({"critical_warning_flags": ["reliability_degraded"]}, "fail", "replace the drive"),
    ({"smart_passed": False}, "fail", "SMART overall health"),
    ({"percent_used": 80}, "warn", "80% of its rated endurance"),
    ({"available_spare_pct": 9}, "warn", "below its threshold"),
    ({"media_errors": 2}, "warn", "2 media/data integrity errors"),
])
def test_drive_health(health, severity, words):
    result = healthy()
    result["devices"][0]["health"].update(health)
    findings = judge(result)
    f = only(findings, "STORAGE_" + severity.upper())
    assert words in f["message"] and f["evidence"][0].startswith("/dev/nvme1: critical_warning=")


def test_wear_threshold_and_unreadable_health():
    worn = healthy()
    worn["devices"][0]["health"]["percent_used"] = 79
    assert judge(worn) == []
    assert codes(judge(worn, gpufleet_storage_wear_warn_pct=79)) == [("STORAGE_WARN", None)]
    worn["devices"][0]["readable"] = False
    assert judge(worn, gpufleet_storage_wear_warn_pct=79) == [], "unreadable health is a note, not a verdict"


@pytest.mark.parametrize("bad", BAD_TOP)
def test_bad_input_is_refused_at_the_door(bad):
    findings = door("checkpoint_storage", bad, lambda data: check_shape(judge_storage.judge(data, {}, HOST)))
    assert findings is None or (findings and all(f["severity"] == "error" for f in findings)), "never a fail"
    if not isinstance(bad, dict):
        assert set(judge_storage.figures(bad)) == {"estimated_checkpoint_s", "overhead_pct", "worst_case_lost_min",
                                                   "write_mb_per_s"}


@pytest.mark.parametrize("path, value", [
    (("job", "keep"), None), (("job",), None), (("space", "free_gb"), "lots"), (("devices", 0), None),
    (("devices", 0, "health"), "x"), (("write_test", "errno"), 13), (("path",), "x"), (("mount",), "ro"),
    (("job", "interval_min"), 0),
])
def test_values_of_the_wrong_type_are_refused_or_judged(path, value):
    door("checkpoint_storage", set_path(healthy(free_gb=1.0), path, value),
         lambda data: (check_shape(judge(data)), judge_storage.figures(data)))


@settings(max_examples=200, deadline=None)
@given(GARBAGE)
def test_fuzz_is_refused_or_judged(data):
    door("checkpoint_storage", data, lambda d: (check_shape(judge_storage.judge(d, thresholds(), HOST)),
                                                judge_storage.figures(d)))
