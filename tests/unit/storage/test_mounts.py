"""Mount table parsing and the path -> mount -> NVMe device lookup."""

import json
import os
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils.mounts import (
    backing_devices,
    disk_for_source,
    find_mount,
    nvme_devices_for_source,
    parse_findmnt_json,
    parse_proc_mounts,
    unescape_mount_field,
)
from hypothesis import given, settings
from hypothesis import strategies as st

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "storage"


def mounts_of(name):
    parsed = parse_proc_mounts((FIX / name).read_text())
    assert parsed["unparsed"]["count"] == 0
    return parsed["mounts"]


def test_rw_mount_longest_prefix():
    mounts = mounts_of("proc_mounts_rw.txt")
    entry = find_mount(mounts, "/mnt/nvme/ckpt/run7")
    assert entry["source"] == "/dev/nvme1n1p1" and entry["read_only"] is False
    assert find_mount(mounts, "/home/user")["target"] == "/"
    assert find_mount(mounts, "/mnt/nvme")["target"] == "/mnt/nvme"
    assert find_mount(mounts, "/mnt/nvmefoo")["target"] == "/"  # component prefix, not string prefix


def test_read_only_remount_seen():
    entry = find_mount(mounts_of("proc_mounts_ro.txt"), "/mnt/nvme/ckpt")
    assert entry["read_only"] is True and "ro" in entry["options"]
    assert entry["line"].startswith("/dev/nvme1n1p1 /mnt/nvme ext4 ro")


def test_bind_mounts_are_separate_targets():
    mounts = mounts_of("proc_mounts_bind.txt")
    assert find_mount(mounts, "/srv/ckpt/a")["read_only"] is False
    assert find_mount(mounts, "/srv/ckpt-ro/a")["read_only"] is True
    assert find_mount(mounts, "/srv/ckpt-ro/a")["target"] == "/srv/ckpt-ro"


def test_nested_and_stacked_mounts():
    mounts = mounts_of("proc_mounts_nested.txt")
    # nvme3n1p1 was mounted over /data/ckpt after NFS and the tmpfs below it: it hides both.
    assert find_mount(mounts, "/data/ckpt/run1")["source"] == "/dev/nvme3n1p1"
    assert find_mount(mounts, "/data/ckpt/scratch/x")["source"] == "/dev/nvme3n1p1"
    assert find_mount(mounts, "/data/other")["source"] == "/dev/md0"
    assert find_mount(mounts, "/data2/x")["source"] == "/dev/nvme2n1"
    nfs = [m for m in mounts if m["fstype"] == "nfs4"][0]
    assert nfs["source"] == "nas01:/export/ckpt"


def test_octal_escapes():
    mounts = mounts_of("proc_mounts_escaped.txt")
    targets = [m["target"] for m in mounts]
    assert "/mnt/fast ckpt" in targets
    assert "/mnt/usb\ttab\\back" in targets
    assert find_mount(mounts, "/mnt/fast ckpt/run")["source"] == "/dev/nvme1n1p1"
    assert unescape_mount_field(r"a\040b\134c") == "a b\\c"


def test_findmnt_json_tree_and_bind_source():
    parsed = parse_findmnt_json((FIX / "findmnt.json").read_text())
    assert parsed["unparsed"]["count"] == 0
    mounts = parsed["mounts"]
    assert [m["target"] for m in mounts] == ["/", "/mnt/nvme", "/srv/ckpt", "/mnt/fast ckpt"]
    bind = find_mount(mounts, "/srv/ckpt/x")
    assert bind["source"] == "/dev/nvme1n1p1" and bind["bind_root"] == "/ckpt" and not bind["read_only"]
    assert find_mount(mounts, "/mnt/nvme/x")["read_only"] is True


def test_garbage_is_counted_not_raised():
    parsed = parse_proc_mounts("only three fields\n/dev/x relative ext4 rw 0 0\n/dev/y /ok ext4 rw 0 0\n")
    assert parsed["unparsed"]["count"] == 2 and len(parsed["mounts"]) == 1
    assert parse_findmnt_json("not json")["unparsed"]["count"] == 1
    assert parse_findmnt_json('{"filesystems": [1, {"target": "rel"}]}')["unparsed"]["count"] == 2
    assert parse_proc_mounts(None)["unparsed"]["count"] == 1
    assert find_mount([], "/x") is None


def test_device_mapping():
    assert nvme_devices_for_source("/dev/nvme0n1p1") == {"namespace": "/dev/nvme0n1", "controller": "/dev/nvme0"}
    assert nvme_devices_for_source("/dev/nvme12n3") == {"namespace": "/dev/nvme12n3", "controller": "/dev/nvme12"}
    assert nvme_devices_for_source("/dev/nvme1") == {"namespace": None, "controller": "/dev/nvme1"}
    assert nvme_devices_for_source("/dev/nvme1n") is None and nvme_devices_for_source(None) is None
    assert nvme_devices_for_source("/dev/sda1") is None
    assert nvme_devices_for_source("nas01:/export") is None
    assert disk_for_source("/dev/sdb2") == "/dev/sdb" and disk_for_source("/dev/nvme0n1") is None


def test_backing_devices_follows_slaves(tmp_path):
    sys_block = tmp_path / "sys"
    (sys_block / "dm-0" / "slaves" / "md0").mkdir(parents=True)
    (sys_block / "md0" / "slaves" / "nvme0n1p1").mkdir(parents=True)
    (sys_block / "md0" / "slaves" / "nvme1n1p1").mkdir(parents=True)
    dev = tmp_path / "dev"
    (dev / "mapper").mkdir(parents=True)
    (dev / "dm-0").write_text("")
    os.symlink(str(dev / "dm-0"), str(dev / "mapper" / "vg-ckpt"))
    # sources must look like /dev paths; point the lookup at the fake tree through realpath of the link
    found = backing_devices("/dev/" + os.path.relpath(str(dev / "mapper" / "vg-ckpt"), "/dev"),
                            sys_block=str(sys_block), dev_root="/dev")
    assert found == ["/dev/nvme0n1p1", "/dev/nvme1n1p1"]
    assert backing_devices("tmpfs") == []


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_fuzz_proc_mounts(text):
    parsed = parse_proc_mounts(text)
    for m in parsed["mounts"]:
        assert m["target"].startswith("/")
    find_mount(parsed["mounts"], "/a/b")


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.integers() | st.text(max_size=10),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(
                        st.sampled_from(["filesystems", "target", "source", "options", "fstype", "children"]),
                        c, max_size=5), max_leaves=15))
def test_fuzz_findmnt(doc):
    parsed = parse_findmnt_json(json.dumps(doc))
    find_mount(parsed["mounts"], "/")


def test_many_mounts_stay_fast():
    import time
    lines = ["/dev/vda / ext4 rw 0 0"] + ["overlay /run/containerd/%d/rootfs overlay rw 0 0" % i for i in range(5000)]
    lines.append("/dev/nvme1n1p1 /mnt/nvme ext4 ro 0 0")
    mounts = parse_proc_mounts("\n".join(lines))["mounts"]
    started = time.perf_counter()
    for _ in range(20):
        assert find_mount(mounts, "/mnt/nvme/ckpt")["read_only"] is True
    assert time.perf_counter() - started < 2.0
