"""The operator's subcommands: burn-in, preflight, audit and provision with a live view; history; handover.

Exit codes (every subcommand that judges a fleet):
    0  every node passed (warnings too, unless --fail-on-warn)
    1  the worst node is warn and --fail-on-warn was given
    2  a node failed, could not be checked (error) or dropped out (unreachable)
    3  the run could not run, left no report (a refused inventory, no nodes, a crash) or was interrupted (its report
       holds what it had; no verdict); for history and handover: no usable history (missing, damaged, not ours)
    4  the nodes passed (as 0 or 1 would say) but the run is not recorded in the history (report.json's
       history.error: a damaged file, a read-only mount, no permission); 2 and 3 take precedence
Everything here is also plain ansible-playbook: `gpufleet audit -i INV -l node01` runs
`ansible-playbook kentino.gpufleet.audit -i INV -l node01,localhost` with the collection's ansible.cfg.
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from gpufleet_cli.options import (
    add_inventory_option,
    existing_dir,
    index,
    output_dir,
    output_file,
    positive_float,
    run_report_dir,
)

EXIT_PASS, EXIT_WARN, EXIT_FAIL, EXIT_NOT_RUN, EXIT_NOT_RECORDED = 0, 1, 2, 3, 4
RUN_COMMANDS = {"burn-in": "burn_in", "preflight": "preflight", "audit": "audit", "provision": "provision"}
SPARK = "▁▂▃▄▅▆▇█"


def _bad():
    """The node verdicts that fail (the report's default gate: module_utils/findings.py GATE_VERDICTS)."""
    use_collection()
    from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import GATE_VERDICTS

    return GATE_VERDICTS["fail"]


def exit_code(report, fail_on_warn=False):
    """The exit code of a report (see the module docstring)."""
    verdicts = [n["verdict"] for n in report.get("nodes") or []]
    if not verdicts or report.get("interrupted"):
        return EXIT_NOT_RUN
    if any(v in _bad() for v in verdicts):
        return EXIT_FAIL
    if (report.get("history") or {}).get("error"):
        return EXIT_NOT_RECORDED
    if fail_on_warn and "warn" in verdicts:
        return EXIT_WARN
    return EXIT_PASS


def with_localhost(limit):
    """-l as the playbooks need it: the run is checked and the report written on localhost."""
    if not limit:
        return None
    return limit if "localhost" in [p.strip() for p in limit.split(",")] else limit + ",localhost"


def _runner_kwargs(repo, playbook, args, extra, private, report_dir):
    envvars = {"ANSIBLE_CONFIG": str(repo / "ansible.cfg"), "ANSIBLE_INJECT_FACT_VARS": "false"}
    kwargs = dict(private_data_dir=private, project_dir=str(repo), playbook=str(repo / "playbooks" / (playbook + ".yml")),
                  extravars=extra, envvars=envvars, quiet=not args.ansible_output,
                  artifact_dir=str(report_dir / ".runner"), rotate_artifacts=20)
    if args.inventory:
        kwargs["inventory"] = [str(Path(i).resolve()) for i in args.inventory]
    if args.limit:
        kwargs["limit"] = with_localhost(args.limit)
    if getattr(args, "check", False):
        kwargs["cmdline"] = "--check"
    return kwargs


def cmd_play(args, repo, show_report):
    """burn-in, preflight, audit, provision: the playbook through ansible-runner under the live view."""
    import ansible_runner

    from gpufleet_cli.console import Console
    from gpufleet_cli.live import RunView, explain_no_report, run_live
    from gpufleet_cli.main import parse_extra

    playbook = RUN_COMMANDS[args.command]
    extra = parse_extra(args.extra_vars)
    report_dir = run_report_dir(extra, "gpufleet_report_dir", str(Path(args.report_dir).resolve()))
    if args.fail_on_warn:
        extra.setdefault("gpufleet_fail_on", "warn")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    console = Console()
    planned = extra.get("gpufleet_burn_duration_s")
    view = RunView(playbook, burn_planned_s=float(planned) if planned else None)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="gpufleet-runner.") as private:
        kwargs = _runner_kwargs(repo, playbook, args, extra, private, report_dir)
        if args.ansible_output:
            result = ansible_runner.run(**kwargs)
        else:
            result = run_live(lambda handler: ansible_runner.run(event_handler=handler, **kwargs), view, console)
    if playbook == "provision":
        return EXIT_PASS if result.rc == 0 else (EXIT_FAIL if result.rc in (2, 4) else EXIT_NOT_RUN)
    latest = report_dir / "latest" / "report.json"
    report = None
    if latest.exists() and latest.stat().st_mtime >= started - 1:
        report = json.loads(latest.read_text())
    if report is None or (view.run_id and report.get("run_id") != view.run_id):
        explain_no_report(sys.stderr, playbook, result, view.problems, report_dir / ".runner")
        return EXIT_NOT_RUN
    show_report(latest, console)
    return exit_code(report, args.fail_on_warn)


# ---- history -----------------------------------------------------------------------------------------------------
def sparkline(values):
    """▁▂▃▄▅▆▇█ for the values (None: a gap)."""
    known = [v for v in values if isinstance(v, (int, float))]
    if not known:
        return ""
    lo, hi = min(known), max(known)
    span = (hi - lo) or 1.0
    return "".join(" " if not isinstance(v, (int, float)) else SPARK[int((v - lo) / span * (len(SPARK) - 1))]
                   for v in values)


def _day(ts):
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) if ts else "-"


def _rates(rows, key):
    """Per-run increase per day of a counter (None for the first run or a reset)."""
    out = [None]
    for before, after in zip(rows, rows[1:], strict=False):
        a, b = before.get(key), after.get(key)
        span = (after["ts"] - before["ts"]) / 86400.0
        out.append(round((b - a) / span, 1) if isinstance(a, int) and isinstance(b, int) and b >= a and span > 0.01
                   else None)
    return out


def history_gpu(history, host, index, days, console):
    from rich.table import Table

    gpus = history.gpus_of(host, index=index)
    if not gpus:
        raise SystemExit("gpufleet: no GPU %s of %s in %s" % (index, host, history.path))
    since = time.time() - days * 86400.0 if days else None
    for gpu in gpus:
        rows = history.gpu_series(gpu["id"], since=since)
        ecc_key = "ecc_corr_agg" if any(r.get("ecc_corr_agg") is not None for r in rows) else "ecc_corr_vol"
        rates = _rates(rows, ecc_key)
        xids = [ts for ts, _d in history.xid_events(gpu["id"], [92], since)]
        table = Table(title="%s GPU %s  %s  %s  (%d readings)" % (host, index, gpu.get("pci") or "?",
                                                                gpu.get("uuid") or gpu.get("serial") or "",
                                                                len(rows)), title_justify="left")
        for column in ("read at", "verdict", "temp °C", "power W", "corrected ECC", "per day", "XID 92",
                       "retired", "remapped c/u", "banks low/none", "PCIe replays"):
            table.add_column(column, no_wrap=True)
        for row, rate in zip(rows, rates, strict=True):
            xid_n = len([x for x in xids if x <= row["ts"]])
            table.add_row(_day(row["ts"]), row.get("verdict") or "-", _n(row.get("temperature_c")),
                          _n(row.get("power_w")), _n(row.get(ecc_key)), _n(rate), str(xid_n),
                          _n((row.get("retired_sbe") or 0) + (row.get("retired_dbe") or 0))
                          if row.get("retired_sbe") is not None else "-",
                          "%s/%s" % (_n(row.get("remap_corr")), _n(row.get("remap_uncorr"))),
                          "%s/%s" % (_n(row.get("banks_low")), _n(row.get("banks_none"))),
                          _n(row.get("pcie_replays")))
        console.print(table)
        console.print("trend  corrected ECC/day %s   temperature %s   PCIe replays %s" % (
            sparkline(rates), sparkline([r.get("temperature_c") for r in rows]),
            sparkline([r.get("pcie_replays") for r in rows])), markup=False, highlight=False)
    return EXIT_PASS


def _n(value):
    if value is None:
        return "-"
    if isinstance(value, float):
        return "%.1f" % value if not value.is_integer() else "%d" % value
    return str(value)


def lifecycle_table(history, host, console):
    """The node's lifecycle (history/lifecycle.py) as a table; its state, or None when it has none."""
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import lifecycle
    from rich.table import Table

    life = lifecycle.summary(history.lifecycle_of(host))
    if not life["transitions"]:
        return None
    table = Table(title="%s lifecycle: %s (quarantined %d time(s) in %g days; a lemon at %d)" % (
        host, life["state"].upper(), life["quarantines_in_window"], life["window_days"], life["lemon_quarantines"]),
        title_justify="left")
    for column in ("when", "from", "to", "reason", "finding", "GPU", "by", "evidence"):
        table.add_column(column, overflow="fold")
    for t in life["transitions"]:
        table.add_row(_day(t["ts"]), t["from_state"], t["to_state"], t["reason"], t["code"] or "-", t["gpu"] or "-",
                      t["actor"], "\n".join(t["evidence"]) or "-")
    console.print(table)
    return life["state"]


def history_node(history, host, days, console):
    from rich.table import Table

    runs = list(reversed(history.node_runs(host, limit=400)))
    if days:
        runs = [r for r in runs if r["ts"] >= time.time() - days * 86400.0]
    state = lifecycle_table(history, host, console)
    if not runs and state is not None:
        return EXIT_PASS if state == "healthy" else EXIT_FAIL
    if not runs:
        raise SystemExit("gpufleet: no run of %s in %s" % (host, history.path))
    table = Table(title="%s: %d run(s)" % (host, len(runs)), title_justify="left")
    for column in ("when", "run", "playbook", "verdict", "GPUs", "driver", "findings"):
        table.add_column(column, overflow="fold")
    for r in runs:
        table.add_row(_day(r["ts"]), r["run_id"], r["playbook"] or "-", r["verdict"], _n(r.get("gpu_count")),
                      r.get("driver") or "-", ", ".join(r["codes"]) or "-")
    console.print(table)
    ranks = verdict_rank()
    console.print("verdicts %s" % sparkline([ranks.get(r["verdict"], ranks["error"]) for r in runs]), markup=False,
                  highlight=False)
    stale = [s for s in history.fleet_summary() if s["name"] == host and s["stale"]]
    if stale:
        console.print("[bold magenta]stale:[/] not reached since %s (last pass %s)" % (
            _day(stale[0]["seen_ts"]), _day(stale[0]["pass_ts"])))
    return EXIT_FAIL if runs[-1]["verdict"] in _bad() or state not in (None, "healthy") else EXIT_PASS


def history_fleet(history, console):
    from rich.table import Table

    rows = history.fleet_summary()
    table = Table(title="History %s: %d node(s)" % (history.path, len(rows)), title_justify="left")
    for column in ("node", "last run", "playbook", "verdict", "last pass", "stale", "findings"):
        table.add_column(column, overflow="fold")
    for s in rows:
        table.add_row(s["name"], _day(s["ts"]), s["playbook"] or "-", s["verdict"], _day(s["pass_ts"]),
                      "STALE" if s["stale"] else "", (s["codes"] or "").replace(",", ", ") or "-")
    console.print(table)
    console.print("last pass: the newest run whose verdict was pass or warn (what the default gate lets through); "
                  "stale: not reached for 2 days", markup=False, highlight=False)
    return EXIT_FAIL if any(s["stale"] or s["verdict"] in _bad() for s in rows) else EXIT_PASS


def use_collection():
    """Make this checkout's collection importable (ansible_collections.kentino.gpufleet) for the controller-side code
    the CLI calls directly (history, handover); ansible-playbook finds it through ansible.cfg."""
    path = str(Path(__file__).resolve().parents[1] / "collections")
    if path not in sys.path:
        sys.path.insert(0, path)


def verdict_rank():
    """{verdict: rank} in the collection's one verdict order (module_utils/findings.py)."""
    use_collection()
    from ansible_collections.kentino.gpufleet.plugins.module_utils.findings import VERDICT_ORDER

    return {v: i for i, v in enumerate(VERDICT_ORDER)}


def cmd_history(args):
    use_collection()
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import (
        History,
        HistoryError,
        default_path,
    )

    from gpufleet_cli.console import Console

    console = Console()
    path = default_path(args.history_dir or Path(args.report_dir) / "history")
    try:
        with History(path, readonly=True) as history:
            if args.export:
                return export_history(history, args)
            if args.node and args.gpu is not None:
                return history_gpu(history, args.node, args.gpu, args.days, console)
            if args.node:
                return history_node(history, args.node, args.days, console)
            return history_fleet(history, console)
    except HistoryError as exc:
        sys.stderr.write("gpufleet: %s\n" % exc)
        return EXIT_NOT_RUN


def export_history(history, args):
    """--export to standard output, or to --out whole or not at all: a regular file is written under a temp name
    beside it and renamed at the end, so a full disk or an interrupt leaves the previous export (or nothing), never a
    cut one; a device or a pipe (/dev/stdout, a FIFO) is written in place."""
    target = Path(os.path.realpath(args.out)) if args.out else None  # a link's file is replaced, not the link
    in_place = target is not None and target.exists() and not target.is_file()
    tmp = None
    try:
        if target is None:
            out = sys.stdout
        elif in_place:
            out = open(target, "w", newline="")
        else:
            fd, tmp = tempfile.mkstemp(prefix="." + target.name + ".", suffix=".tmp", dir=str(target.parent))
            os.fchmod(fd, 0o644)
            out = os.fdopen(fd, "w", newline="")
    except OSError as exc:
        sys.stderr.write("gpufleet history: argument --out: cannot write %s: %s\n" % (args.out, exc.strerror))
        return 2
    try:
        try:
            count = history.export(args.export, out, host=args.node)
        finally:
            if target is not None:
                out.close()
        if tmp is not None:
            os.replace(tmp, str(target))
            tmp = None
    except OSError as exc:
        if target is None:
            raise  # standard output: main() handles a closed pipe
        sys.stderr.write("gpufleet history: cannot write %s: %s; %s\n" % (
            args.out, exc.strerror or exc, "it may be cut short" if in_place else "nothing was written"))
        return EXIT_NOT_RUN
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    sys.stderr.write("gpufleet: %d row(s) exported%s\n" % (count, " to %s" % args.out if args.out else ""))
    return EXIT_PASS


def cmd_handover(args):
    use_collection()
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history import handover
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.history.store import HistoryError, default_path

    path = default_path(args.history_dir or Path(args.report_dir) / "history")
    out = Path(args.out or Path(args.report_dir) / "handover" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    try:
        written = handover.write(path, args.nodes, out, pdf=args.pdf, force=args.force)
    except handover.HandoverRefused as exc:  # a machine failing now, or changed since its burn-in
        sys.stderr.write("gpufleet: %s\n" % exc)
        return EXIT_FAIL
    except HistoryError as exc:
        sys.stderr.write("gpufleet: %s\n" % exc)
        return EXIT_NOT_RUN
    except OSError as exc:  # a full disk, a directory that became unwritable after the usage check
        sys.stderr.write("gpufleet handover: cannot write the sheet into %s: %s\n" % (
            getattr(exc, "filename", None) or out, exc.strerror or exc))
        return EXIT_NOT_RUN
    print("handover sheet: %s" % written["html"])
    for blocked in written["forced"]:
        sys.stderr.write("gpufleet: --force: the sheet says first that %s\n" % blocked)
    if written["pdf"]:
        print("PDF: %s" % written["pdf"])
    elif args.pdf:
        sys.stderr.write("gpufleet: no PDF: %s\n" % written["pdf_error"])
        return EXIT_NOT_RUN
    return EXIT_PASS


def add_parsers(sub, default_report_dir):
    for name, playbook in RUN_COMMANDS.items():
        p = sub.add_parser(name, help="run kentino.gpufleet.%s with a live view of the nodes" % playbook)
        add_inventory_option(p)
        p.add_argument("-l", "--limit", help="nodes to run on (localhost, where the report is written, is added)")
        p.add_argument("-e", "--extra-vars", action="append", default=[])
        p.add_argument("--check", action="store_true", help="check mode")
        p.add_argument("--report-dir", default=default_report_dir)
        p.add_argument("--fail-on-warn", action="store_true", help="exit 1 when the worst node is warn")
        p.add_argument("--ansible-output", action="store_true", help="Ansible's own output instead of the live view")
    h = sub.add_parser("history", help="a node's runs, one GPU's trend (with sparklines), or the fleet's summary")
    h.add_argument("node", nargs="?")
    h.add_argument("--gpu", type=index, help="the GPU's nvidia-smi index")
    h.add_argument("--days", type=positive_float, help="only the last DAYS days")
    h.add_argument("--export", choices=["csv", "json"], help="every GPU reading (of NODE, when given)")
    h.add_argument("--out", type=output_file, help="export to this file instead of stdout")
    h.add_argument("--history-dir", type=existing_dir, help="default: <report-dir>/history")
    h.add_argument("--report-dir", default=default_report_dir)
    s = sub.add_parser("handover", help="the customer handover sheet of machines, from the history (HTML, PDF)")
    s.add_argument("nodes", nargs="+")
    s.add_argument("--pdf", action="store_true", help="also print it to PDF with headless Chromium")
    s.add_argument("--force", action="store_true", help="write the sheet of a machine that fails now or changed since "
                                                        "its burn-in (it says so first, in red)")
    s.add_argument("--out", type=output_dir, help="directory (default <report-dir>/handover/<time>)")
    s.add_argument("--history-dir", type=existing_dir, help="default: <report-dir>/history")
    s.add_argument("--report-dir", default=default_report_dir)
