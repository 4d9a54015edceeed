# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The InfiniBand ports check (stdlib only: runs on the node): sysfs read (ib_sysfs) -> judge (judge_ib), in the result
shape of the ib_ports module. The ib_ports module runs it once per call; gpu_burn runs it just before and just after
its load (option ib_ports), so a burn-in reads the counters' rise without two module round trips of its own."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible_collections.kentino.gpufleet.plugins.module_utils import check_result, ib_sysfs, judge_ib

ROOT = ib_sysfs.ROOT


def root_error(root):
    """Why `root` cannot be read as the InfiniBand class directory, or None."""
    if not os.path.isabs(root) or any(ord(c) < 32 for c in root):
        return "root: %r is not an absolute path (gpufleet_ib_sysfs_root, e.g. /sys/class/infiniband)" % root
    return None


def _hcas(root):
    try:
        return os.listdir(root)
    except OSError:
        return []


def read(root, baseline_ports=None):
    """The observations of one read; baseline_ports: the ports of an earlier read (ValueError when malformed)."""
    baseline = ib_sysfs.counters_by_port(baseline_ports)
    obs = ib_sysfs.read_ports(root)
    obs.update(root=root, baseline=baseline, not_run=None)
    if not obs["ports"] and not _hcas(root):
        obs["not_run"] = "%s: %s" % (judge_ib.NO_INFINIBAND,
                                     "; ".join(p["message"] for p in obs["problems"]) or "%s has no HCA" % root)
    return obs


def judged(obs, thresholds, host):
    """The observations with the node's own verdict, reasons and evidence (the module's result)."""
    return check_result.judged(obs, judge_ib.judge(obs, thresholds, host))
