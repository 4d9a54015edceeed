# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""ib_ports results -> findings on the node's InfiniBand ports (judge: module_utils/judge_ib).

The burn-in reads the ports before the load and after it (the second read carries the first's counters as its
baseline); a node without InfiniBand is skipped with the module's reason.
"""

from __future__ import annotations

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_ib

MODULE = "ib_ports"


def apply(node, data):
    findings = judge_ib.judge(data, node.t, node.host)
    ports = data.get("ports") or []
    figures = {"ports": len(ports), "ports_active": sum(p.get("state_name") == "ACTIVE" for p in ports)}
    node.judged(MODULE, findings, figures, data.get("not_run"), data)


def not_applicable(data):
    """Why there is nothing to check (a node without InfiniBand), else None: skipped, not a check left out."""
    why = str(data.get("not_run") or "")
    return why if not data.get("ports") and why.startswith(judge_ib.NO_INFINIBAND) else None
