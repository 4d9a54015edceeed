# -*- coding: utf-8 -*-
# Copyright: kentino.gpufleet contributors; Apache-2.0
"""The customer handover sheet: per machine, its CURRENT verdict first (its newest run, whatever the playbook), then
what was shipped (serials of the board and every GPU, VBIOS, InfoROM, driver, DCGM, kernel, system BIOS) and the proof
it is healthy (its latest burn-in: verdict, checks, findings with their evidence, and its figures against the
platform's: the median of the same group's latest burn-ins) and its lifecycle (quarantines, repairs, validations), read from the history and rendered as one self-contained
HTML file (PDF through headless Chromium when it is installed).

A machine is not handed over as clean when it is not: when its newest run or its latest audit does not pass (the
default gate, findings.PASSING), when its lifecycle is not healthy (quarantined, in repair, lemon, rma), or when a version changed since its burn-in (the burn-in proves another machine),
the sheet is refused (HandoverRefused, naming why) unless forced, and a forced sheet says so first, in red. The sheet
is for a customer: the history's own bookkeeping (the trend, drift and baseline checks' figures) is not on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from ansible_collections.kentino.gpufleet.plugins.module_utils import judge_baseline
from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import PASSING
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle
from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import History, HistoryError, ident_of

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
# What a customer reads of each burn-in check: the measured figures, never the history's own bookkeeping (the trend,
# drift and baseline checks, a reference group's size, counts of compared figures) nor the run's internals.
CUSTOMER_FIGURES = {
    "gpu_facts": ("gpus", "expected_gpus"), "xid_facts": ("events",), "gpu_burn": ("gpus", "duration_s"),
    "gpu_sample": ("samples",), "dcgm_diag": ("level_run", "dcgm_version"),
    "nccl_test": ("busbw_gbps", "min_busbw_gbps", "interconnect"), "nvlink": ("interconnect", "fabric_manager"),
    "checkpoint_storage": ("write_mb_per_s", "estimated_checkpoint_s"),
    "training_env_facts": ("variables_ok",), "train_dryrun": ("world_size", "step_time_s"),
}
# The versions a burn-in proves: one that changed since is not burned in.
VERSION_KEYS = ("driver", "dcgm", "kernel", "bios", "vbios", "inforom", "board")


class HandoverRefused(HistoryError):
    """A machine is not ready to hand over (its current verdict, its versions): the message names why and --force."""


def _iso(ts):
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if ts else None


def _median(values):
    values = sorted(v for v in values if isinstance(v, (int, float)))
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2.0


def _share(value, reference):
    if not isinstance(value, (int, float)) or not reference:
        return None
    return round(100.0 * value / reference, 1)


def machine(history, host):
    """The sheet of one machine (a dict for the template). HistoryError when the history has no burn-in of it."""
    runs = history.node_runs(host, limit=500)
    if not runs:
        raise HistoryError("history %s has no run of %s: burn it in first (gpufleet burn-in -l %s)" % (
            history.path, host, host))
    burn = next((r for r in runs if r["playbook"] == "burn_in" and r["reachable"]), None)
    if burn is None:
        raise HistoryError("history %s has no burn-in of %s (only %s): the handover sheet shows a burn-in's proof; "
                           "run gpufleet burn-in -l %s" % (history.path, host, ", ".join(sorted(
                               {r["playbook"] or "?" for r in runs})), host))
    identity = next((r for r in runs if r.get("versions") and r["reachable"]), burn)
    versions = dict(identity.get("versions") or {})
    burned = dict(burn.get("versions") or {})
    changed = [{"what": key, "burn_in": burned.get(key), "now": versions.get(key)} for key in VERSION_KEYS
               if burned.get(key) != versions.get(key) and (burned.get(key) or versions.get(key))]
    latest = runs[0]
    audits = [r for r in runs if r["playbook"] == "audit"]
    blockers = []
    if latest["verdict"] not in PASSING:
        blockers.append("its newest run (%s %s, %s) is %s%s" % (
            latest["playbook"], latest["run_id"], _iso(latest["ts"]), latest["verdict"].upper(),
            ": " + ", ".join(latest["codes"]) if latest["codes"] else ""))
    if audits and audits[0] is not latest and audits[0]["verdict"] not in PASSING:
        blockers.append("its latest audit (%s, %s) is %s: %s" % (audits[0]["run_id"], _iso(audits[0]["ts"]),
                                                                 audits[0]["verdict"].upper(),
                                                                 ", ".join(audits[0]["codes"]) or "-"))
    life = lifecycle.summary(history.lifecycle_of(host))
    if life["state"] != "healthy":
        last = life["transitions"][-1]
        blockers.append("it is %s since %s (%s, by %s)" % (life["state"], _iso(last["ts"]), last["reason"],
                                                          last["actor"]))
    if changed:
        blockers.append("versions changed since its burn-in (%s): the burn-in does not prove what runs now" % "; ".join(
            "%s %s -> %s" % (c["what"], _version(c["burn_in"]), _version(c["now"])) for c in changed))
    doc = history.node_doc(burn["id"]) or {}
    gpus = history.gpu_rows_of(burn["id"])
    peers = [r for r in history.latest_of_group("burn_in", burn["grp"]) if r["host_name"] != host]
    peer_gflops = [g.get("burn_gflops") for r in peers for g in history.gpu_rows_of(r["id"])]
    platform = {"group": burn["grp"], "nodes": len(peers), "burn_gflops": _median(peer_gflops),
                "nccl_busbw_gbps": _median([(r.get("figures") or {}).get("nccl_busbw_gbps") for r in peers]),
                "storage_write_mb_per_s": _median([(r.get("figures") or {}).get("storage_write_mb_per_s")
                                                   for r in peers])}
    own = history.baselines(host)
    for gpu in gpus:
        gpu["vs_platform_pct"] = _share(gpu.get("burn_gflops"), platform["burn_gflops"])
        base = own.get((ident_of(gpu), "burn_gflops", ""))
        ref = judge_baseline.reference(base)
        gpu["baseline_gflops"] = ref["value"] if ref else None
    figures = dict(burn.get("figures") or {})
    checks = {name: {"verdict": check["verdict"], "figures": {k: check["figures"][k] for k in keep
                                                              if (check.get("figures") or {}).get(k) is not None}}
              for name, check in (doc.get("checks") or {}).items() for keep in [CUSTOMER_FIGURES.get(name)] if keep}
    nccl = (checks.get("nccl_test") or {}).get("figures") or {}
    rows = []
    if figures.get("nccl_busbw_gbps") is not None:
        rows.append({"what": "NCCL all_reduce bus bandwidth", "unit": "GB/s", "value": figures["nccl_busbw_gbps"],
                     "floor": nccl.get("min_busbw_gbps"), "floor_source": nccl.get("threshold_source"),
                     "platform": platform["nccl_busbw_gbps"],
                     "vs_platform_pct": _share(figures["nccl_busbw_gbps"], platform["nccl_busbw_gbps"])})
    if figures.get("storage_write_mb_per_s") is not None:
        rows.append({"what": "checkpoint write speed", "unit": "MB/s", "value": figures["storage_write_mb_per_s"],
                     "floor": None, "floor_source": None, "platform": platform["storage_write_mb_per_s"],
                     "vs_platform_pct": _share(figures["storage_write_mb_per_s"], platform["storage_write_mb_per_s"])})
    now_gpus = {g.get("pci"): g.get("verdict") for g in history.gpu_rows_of(latest["id"])} if latest is not burn \
        else {}
    for gpu in gpus:
        gpu["verdict_now"] = now_gpus.get(gpu.get("pci"), gpu.get("verdict"))
    return {
        "host": host, "product": identity.get("product"), "board_serial": identity.get("board_serial"),
        "current": {"verdict": latest["verdict"], "playbook": latest["playbook"], "run_id": latest["run_id"],
                    "time": _iso(latest["ts"]), "codes": latest["codes"]},
        "blockers": blockers, "changed": changed,
        "versions": versions, "dcgm": versions.get("dcgm") or (checks.get("dcgm_diag") or {}).get(
            "figures", {}).get("dcgm_version"),
        "burn": {"run_id": burn["run_id"], "time": _iso(burn["ts"]), "verdict": burn["verdict"]},
        "identity_run": {"run_id": identity["run_id"], "playbook": identity["playbook"], "time": _iso(identity["ts"])},
        "gpus": gpus, "figures": rows, "platform": platform,
        "checks": sorted(checks.items()), "findings": doc.get("findings") or [],
        "audits": [{"run_id": r["run_id"], "time": _iso(r["ts"]), "verdict": r["verdict"]}
                   for r in runs if r["playbook"] == "audit"][:5],
        "lifecycle": {"state": life["state"], "transitions": [dict(r, time=_iso(r["ts"])) for r in
                                                              life["transitions"]]},
    }


def _version(value):
    if isinstance(value, dict):  # per GPU (vbios, inforom): the distinct values
        return "/".join(sorted(set(str(v) for v in value.values()))) or "-"
    return value or "-"


def render(sheets, generated=None):
    import jinja2  # controller only

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = lambda v, d=1: "-" if v is None else (("%." + str(d) + "f") % v if isinstance(v, float)
                                                                else str(v))
    env.filters["version"] = _version
    return env.get_template("handover.html.j2").render(
        sheets=sheets, generated=generated or datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def chromium():
    return next((path for path in (shutil.which(name) for name in CHROMIUM) if path), None)


def to_pdf(html_path, pdf_path, timeout=120):
    """Print the HTML to PDF with headless Chromium. Returns None, or why no PDF was written."""
    exe = chromium()
    if exe is None:
        return "no Chromium found (apt-get install chromium): the HTML sheet is written, print it from a browser"
    profile = Path(pdf_path).with_suffix(".chromium-profile")
    argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--user-data-dir=%s" % profile, "--no-pdf-header-footer", "--print-to-pdf=%s" % pdf_path,
            Path(html_path).resolve().as_uri()]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "chromium could not print the PDF: %s" % exc
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if proc.returncode != 0 or not os.path.exists(pdf_path):
        return "chromium exited %s without a PDF: %s" % (proc.returncode, proc.stderr.strip()[-300:])
    return None


def write(history_path, hosts, out_dir, pdf=False, force=False):
    """Write handover.html (and handover.pdf) for these machines under out_dir. Returns {html, pdf, pdf_error, forced}.
    HandoverRefused when a machine is not ready (its current verdict, a version changed since its burn-in) and not
    force: nothing is written."""
    with History(history_path, readonly=True) as history:
        sheets = [machine(history, host) for host in hosts]
    blocked = ["%s: %s" % (s["host"], "; ".join(s["blockers"])) for s in sheets if s["blockers"]]
    if blocked and not force:
        raise HandoverRefused("not handing over as healthy: %s. Repair and rerun (burn-in after a version change), or "
                              "write the sheet anyway with --force (it then says this first, in red)" % " | ".join(
                                  blocked))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    html = out_dir / "handover.html"
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.report import write_atomic

    write_atomic(html, render(sheets))
    result = {"html": str(html), "pdf": None, "pdf_error": None, "hosts": list(hosts), "forced": blocked}
    if pdf:
        target = out_dir / "handover.pdf"
        result["pdf_error"] = to_pdf(html, target)
        result["pdf"] = None if result["pdf_error"] else str(target)
    return result
