"""gpufleet plan: how often to checkpoint, and what failures cost (docs/training.md, plugins/plugin_utils/cadence.py).

    gpufleet plan                                  from reports/latest/report.json (the preflight's measured write speed)
    gpufleet plan --gpus 64 --checkpoint-gb 140 --write-mb-s 2500 --interval-min 30 --price 2.1
    gpufleet plan --report reports/latest --history-dir /var/lib/gpufleet/history --json

Command-line values win over the report's. Exit 0 with the plan, 1 when an input is missing (named), 2 on a report
that cannot be read or a value out of range (a usage error naming the option: no default replaces it).
"""

import json
import sys
from pathlib import Path

from gpufleet_cli.options import between, existing_dir

# The collection's controller code (cadence.py) through collections/ansible_collections/kentino/gpufleet -> the repo.
COLLECTIONS = Path(__file__).resolve().parents[1] / "collections"
HELP = "checkpoint interval and the GPU-hours (and cost) failures take a day"


def add_parser(sub):
    p = sub.add_parser("plan", help=HELP, description=__doc__.splitlines()[0])
    p.add_argument("--report", help="report.json or its run directory (default reports/latest when it exists)")
    p.add_argument("--gpus", type=between(int, 1, 1000000), help="GPUs of the training job (default: the report's)")
    p.add_argument("--checkpoint-gb", type=between(float, 0.001, 1e6),
                   help="size of one checkpoint per node, GB (10^9 bytes)")
    p.add_argument("--write-mb-s", type=between(float, 0.01, 1e7),
                   help="checkpoint write speed, MB/s (default: the slowest node's in the report)")
    p.add_argument("--interval-min", type=between(float, 0.1, 1e6), help="current checkpoint interval, minutes")
    p.add_argument("--gpu-hours-per-failure", type=between(float, 1, 1e9),
                   help="default: the history's rate, else 50,000")
    p.add_argument("--history-dir", type=existing_dir, help="the audit history store (its failure rate)")
    p.add_argument("--restart-min", type=between(float, 0, 1e5), help="minutes one restart costs (default 2)")
    p.add_argument("--price", type=between(float, 0, 1e6), help="price of one GPU-hour")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def _load_report(path):
    if path is None:
        default = Path("reports/latest/report.json")
        return (json.loads(default.read_text()), str(default)) if default.exists() else (None, None)
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    return json.loads(path.read_text()), str(path)


def build(args, report=None):
    """The plan dict for these arguments and an optional report.json (what `--json` prints)."""
    if str(COLLECTIONS) not in sys.path:
        sys.path.insert(0, str(COLLECTIONS))
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils import cadence

    given = (report or {}).get("cadence", {}).get("inputs") or {}
    write_s, node, report_mb_s, interval = cadence.write_time_from_report(report or {})
    write_mb_s = args.write_mb_s or report_mb_s
    if args.checkpoint_gb:
        write_s = cadence.checkpoint_write_s(args.checkpoint_gb, write_mb_s) if write_mb_s else None
    elif args.write_mb_s and write_s and report_mb_s:
        write_s = write_s * report_mb_s / args.write_mb_s  # the report's checkpoint size at the given speed
    if args.write_mb_s:
        node = "--write-mb-s"
    gpus = args.gpus or given.get("gpus") or (report or {}).get("summary", {}).get("gpus")
    history, why = cadence.history_observations(args.history_dir) if args.history_dir else (None, None)
    inventory_rate = args.gpu_hours_per_failure
    if inventory_rate is None and str(given.get("failure_source", "")).startswith(("inventory", "audit history")):
        inventory_rate = given.get("gpu_hours_per_failure")  # what the report's run knew
    rate, source = cadence.failure_rate(inventory_rate, history)
    if args.gpu_hours_per_failure is None and inventory_rate is not None and history is None:
        source = "the report: " + given.get("failure_source", "")
    restart = args.restart_min if args.restart_min is not None else given.get("restart_min", 2.0)
    price = args.price if args.price is not None else given.get("gpu_hour_price")
    interval = args.interval_min or interval or given.get("interval_min")
    out = cadence.plan(gpus, rate, write_s, interval, restart, price)
    out["inputs"] = {"gpus": gpus, "gpu_hours_per_failure": round(rate, 1), "failure_source": source,
                     "checkpoint_write_s": round(write_s, 3) if write_s else None, "write_mb_per_s": write_mb_s,
                     "slowest_node": node, "interval_min": interval, "restart_min": restart, "gpu_hour_price": price}
    out["notes"] = [why] if why else []
    return out


def show(plan, console=None):
    from rich.table import Table

    from gpufleet_cli.console import Console

    console = console or Console()
    i = plan["inputs"]
    console.print("%s GPUs, 1 interruption per %s GPU-hours (%s): [bold]%s[/] interruptions a day, job MTBF %s h" % (
        i["gpus"] or "?", "%.0f" % i["gpu_hours_per_failure"], i["failure_source"],
        "%.3f" % plan["interruptions_per_day"] if plan["interruptions_per_day"] is not None else "-",
        "%.1f" % plan["mtbf_hours"] if plan["mtbf_hours"] is not None else "-"), markup=True, highlight=False)
    for note in plan["notes"]:
        console.print("note: %s" % note, markup=False)
    if plan["status"] != "ok":
        console.print("Missing: " + "; ".join(plan["missing"]), markup=False)
        return
    console.print("Checkpoint write %.1f s (%s at %s MB/s); optimal interval (Young) [bold]%.1f min[/] (Daly %.1f)" % (
        plan["checkpoint_write_s"], i["slowest_node"] or "?", "%.0f" % i["write_mb_per_s"] if i["write_mb_per_s"]
        else "?", plan["optimal_interval_min"], plan["daly_interval_min"]), highlight=False)
    table = Table(title="GPU time lost a day", show_lines=False)
    for column in ("interval", "checkpoint overhead", "lost GPU-h/day", "of which interruptions", "cost/day",
                   "worst case lost"):
        table.add_column(column, justify="right")
    for label in ("current", "optimal"):
        row = plan[label]
        if row:
            table.add_row("%s: %.1f min" % (label, row["interval_min"]), "%.3f %%" % row["checkpoint_overhead_pct"],
                          "%.3f" % row["lost_gpu_hours_per_day"], "%.3f" % row["lost_to_interruptions_gpu_hours_per_day"],
                          "%.2f" % row["cost_per_day"] if row["cost_per_day"] is not None else "-",
                          "%.1f min" % row["worst_case_lost_min"])
    console.print(table)
    if plan["saving_gpu_hours_per_day"] is not None:
        console.print("Checkpointing at the optimal interval saves %.3f GPU-hours a day%s." % (
            plan["saving_gpu_hours_per_day"],
            " (%.2f a day)" % plan["saving_per_day"] if plan["saving_per_day"] is not None else ""), highlight=False)
    for missing in plan["missing"]:
        console.print("Not shown: %s" % missing, markup=False)


def run(args):
    try:
        report, _path = _load_report(args.report)
    except (OSError, ValueError) as exc:
        sys.stderr.write("gpufleet plan: cannot read the report %s: %s\n" % (args.report, exc))
        return 2
    plan = build(args, report)
    if args.json:
        sys.stdout.write(json.dumps(plan, indent=2) + "\n")
    else:
        show(plan)
    return 0 if plan["status"] == "ok" else 1
