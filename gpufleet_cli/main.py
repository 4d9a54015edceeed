"""gpufleet: run a burn-in, preflight, audit or provisioning through ansible-runner and show the fleet report.

    gpufleet burn-in|preflight|audit|provision -i INV [-l NODES] [-e ...] [--fail-on-warn]   (live view of the nodes)
    gpufleet history [NODE [--gpu N]] [--export csv|json]   (the history store: trends, the fleet's summary)
    gpufleet handover NODE... [--pdf]                       (the customer handover sheet)
    gpufleet run burn_in -i inventories/example [-l gpu-node-01] [-e gpufleet_burn_duration_s=3600] [--check]
    gpufleet report [RUN] [--report-dir DIR]                 (default DIR/latest, DIR reports)
    gpufleet abort -i inventories/example [-l gpu-node-01]   (stop what an interrupted run left on the nodes)
    gpufleet quarantine|repair|release NODE [--dry-run] [--reason TEXT]   (a node's lifecycle, docs/lifecycle.md)
    gpufleet postmortem -i inventory -l node01,node02 --logs '/srv/train/logs/*.log' [--since -2h]
    gpufleet postmortem --show [reports/postmortem/latest]
    gpufleet plan [--report reports/latest] [--gpus N --checkpoint-gb G --write-mb-s R --interval-min M --price P]

`run` is `ansible-playbook` with the collection's configuration (ansible.cfg of this checkout), its events kept by
ansible-runner under the report directory, and the report table printed at the end. The exit code is the playbook's:
0 when the gate passed, non-zero when a node failed (gpufleet_fail_on) or could not be reached.
burn-in, preflight, audit and provision exit 0 pass, 1 warn (with --fail-on-warn), 2 fail, 3 could not run, 4 passed
but not recorded in the history (gpufleet_cli/commands.py); so do history and handover (2: a node failing or stale,
3: no usable history: missing, damaged or not ours).
"""

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from datetime import UTC
from pathlib import Path

from gpufleet_cli.options import add_inventory_option, positive_int, run_report_dir

REPO = Path(__file__).resolve().parents[1]
# checks.yml holds the plays burn_in.yml and preflight.yml share: not a playbook of its own.
PLAYBOOKS = sorted(p.stem for p in (REPO / "playbooks").glob("*.yml") if p.stem != "checks")
# ansible-runner keeps one artifact directory per run under the reports directory: only the newest are kept.
KEEP_RUNNER_ARTIFACTS = 20
VERDICT_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "error": "magenta", "unreachable": "bold magenta"}


def parse_extra(items):
    """-e KEY=VALUE (value parsed as JSON when it is JSON, else a string), -e '{json}', or -e @file.json/yml. A value
    that cannot be read is a usage error naming it (exit 2) before Ansible starts."""
    extra = {}
    for item in items or []:
        if item.startswith("@"):
            import yaml

            try:
                loaded = yaml.safe_load(Path(item[1:]).read_text())
            except OSError as exc:
                _extra_error(item, "cannot read %s: %s" % (item[1:], exc.strerror or exc))
            except yaml.YAMLError as exc:
                _extra_error(item, "%s is not YAML or JSON: %s" % (item[1:], " ".join(str(exc).split())))
        elif item.lstrip().startswith("{"):
            try:
                loaded = json.loads(item)
            except ValueError as exc:
                _extra_error(item, "not a JSON object: %s" % exc)
        elif "=" in item:
            key, value = item.split("=", 1)
            if not VARIABLE_NAME.match(key):
                _extra_error(item, "%r is not a variable name (letters, digits and _, not first a digit)" % key)
            try:
                loaded = {key: json.loads(value)}
            except ValueError:
                loaded = {key: value}
        else:
            _extra_error(item, "use KEY=VALUE, a JSON object, or @file")
        if not isinstance(loaded, dict):
            _extra_error(item, "does not give a mapping of variables")
        extra.update(loaded)
    return extra


VARIABLE_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")


def window_time(text):
    """--since/--until: checked here with the parser the nodes use (kernel_log_sources.parse_since), so a typo is a
    usage error before Ansible starts; passed on as given (a relative time is relative to when the node reads it)."""
    from gpufleet_cli.commands import use_collection

    use_collection()
    from ansible_collections.kentino.gpufleet.plugins.module_utils.kernel_log_sources import parse_since

    try:
        parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _dash_values_joined(argv):
    """`--since -2h` as `--since=-2h`: argparse reads a value that starts with a dash and is no number as an option
    ("expected one argument"), and the relative times the docs give all start with one."""
    out = []
    for word in argv:
        if out and out[-1] in ("--since", "--until") and word.startswith("-") and word[1:2].isdigit():
            out[-1] = "%s=%s" % (out[-1], word)
        else:
            out.append(word)
    return out


def _extra_error(item, problem):
    shown = item if len(item) <= 80 else item[:77] + "..."
    sys.stderr.write("gpufleet: error: argument -e %s: %s\n" % (shown, problem))
    raise SystemExit(2)


def show_report(path, console=None):
    """Print a report.json (or a run directory / reports/latest) as a table; return the report."""
    from rich.table import Table

    from gpufleet_cli.console import Console

    console = console or Console()
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    report = json.loads(path.read_text())
    table = Table(title="Fleet report %s (%s)%s" % (report["run_id"], report.get("playbook") or "-",
                                                    " INTERRUPTED" if report.get("interrupted") else ""),
                  show_lines=True)
    for column in ("node", "verdict", "stage", "worst finding", "action"):
        table.add_column(column, overflow="fold")
    for node in report["nodes"]:
        worst = node.get("worst")
        style = VERDICT_STYLE.get(node["verdict"], "")
        skipped = "\nSKIPPED: %s" % ", ".join(node["skipped"]) if node.get("skipped") else ""
        table.add_row(node["host"], ("[%s]%s[/]" % (style, node["verdict"].upper()) if style else node["verdict"])
                      + skipped,
                      node.get("stage") or "-", ("%s: %s" % (worst["code"], worst["message"])) if worst else "-",
                      node.get("action") or "-")
    console.print(table)
    gate = report["summary"]["gate"]
    if report.get("interrupted"):
        console.print("Gate (fail_on=%s): FAILED: the run was interrupted before it finished; rerun for a verdict"
                      % gate["fail_on"], markup=False)
    else:
        console.print("Gate (fail_on=%s): %s" % (gate["fail_on"], ("FAILED: " + ", ".join(gate["nodes"]))
                                                  if gate["failed"] else "passed"), markup=False)
    from gpufleet_cli.commands import use_collection

    use_collection()
    from ansible_collections.kentino.gpufleet.plugins.plugin_utils.render_md import history_line

    history = history_line(report)
    if history:
        console.print(history, style="bold magenta", markup=False, highlight=False)
    console.print("Run: started %s, finished %s" % (_utc(report.get("started")), _utc(report.get("finished"))),
                  markup=False)
    console.print("HTML report: %s" % (path.parent / "report.html"), markup=False)
    return report


def _utc(text):
    """An ISO time of report.json as 'YYYY-mm-dd HH:MM:SS UTC' (as the report pages show it)."""
    from datetime import datetime

    try:
        when = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return str(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def show_postmortem(path, console=None):
    """Print a postmortem.json (or its directory) as the verdict and a findings table; return the document."""
    from rich.table import Table

    from gpufleet_cli.console import Console

    console = console or Console()
    path = Path(path)
    if path.is_dir():
        path = path / "postmortem.json"
    doc = json.loads(path.read_text())
    v = doc["verdict"]
    style = "bold red" if v["kind"] in ("hardware", "software", "rank", "tie") else "yellow"
    console.print("[%s]Job post-mortem %s: %s[/] (confidence %s)" % (style, doc["run_id"], v["kind"].upper(),
                                                                   v["confidence"]))
    console.print(v["message"], markup=False)
    console.print("Action: " + v["action"], markup=False)
    table = Table(title="Findings", show_lines=True)
    for column in ("severity", "code", "message", "action"):
        table.add_column(column, overflow="fold")
    for f in doc["findings"]:
        table.add_row(f["severity"].upper(), f["code"], f["message"], f["action"])
    console.print(table)
    console.print("Files: %s" % path.parent)
    return doc


def _envvars(stream=None):
    """The environment of the ansible-playbook that ansible-runner starts. It runs in a pseudo-terminal, so Ansible
    would colour its output even when ours goes to a pipe or a file: no colour codes unless we write to a terminal."""
    stream = stream or sys.stdout
    envvars = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_INJECT_FACT_VARS": "false"}
    if not (hasattr(stream, "isatty") and stream.isatty()):
        envvars["ANSIBLE_NOCOLOR"] = "1"
    return envvars


def _printer(quiet, stream=None, problems=None):
    """ansible-runner event handler: Ansible's output as it comes, with the pseudo-terminal's CR LF made LF; nothing
    when quiet. Events are kept in the artifact directory either way, and read by `problems` (live.RunProblems)."""
    stream = stream or sys.stdout

    def handle(event):
        if problems is not None:
            problems.handle(event)
        text = event.get("stdout")
        if text and not quiet:
            stream.write(text.replace("\r\n", "\n").replace("\r", "\n") + "\n")
            stream.flush()
        return True

    return handle


def _runner(playbook, args, extra):
    import ansible_runner

    envvars = _envvars()
    # ansible-runner execs ansible-playbook from PATH: use the one installed beside this Python.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    with tempfile.TemporaryDirectory(prefix="gpufleet-runner.") as private:
        kwargs = dict(private_data_dir=private, project_dir=str(REPO), playbook=str(REPO / "playbooks" /
                      (playbook + ".yml")), extravars=extra, envvars=envvars, quiet=True,
                      event_handler=_printer(args.quiet),
                      artifact_dir=str(Path(args.report_dir).resolve() / ".runner"))
        if args.inventory:
            kwargs["inventory"] = [str(Path(i).resolve()) for i in args.inventory]
        if args.limit:
            # The last play runs on localhost: a limit without it would silently skip the report.
            kwargs["limit"] = args.limit if "localhost" in args.limit.split(",") else args.limit + ",localhost"
        if getattr(args, "check", False):
            kwargs["cmdline"] = "--check"
        return ansible_runner.run(**kwargs)


def cmd_postmortem(args):
    pm_dir = Path(args.report_dir).resolve() / "postmortem"
    if args.show is not None:
        path = Path(args.show or (pm_dir / "latest"))
        path = path / "postmortem.json" if path.is_dir() or not path.suffix else path
        try:
            show_postmortem(path)
        except BrokenPipeError:
            raise  # the reader left (main's business), not an unreadable post-mortem
        except (OSError, ValueError, KeyError) as exc:
            sys.stderr.write("gpufleet: no readable post-mortem at %s (%s): run `gpufleet postmortem` first\n"
                             % (path, exc))
            return 1
        return 0
    extra = parse_extra(args.extra_vars)
    run_report_dir(extra, "job_postmortem_report_dir", str(pm_dir))
    for key, value in (("job_postmortem_logs", args.logs), ("job_postmortem_journal_units", args.journal_unit),
                       ("job_postmortem_dump_prefixes", args.dump_prefix)):
        if value:
            extra[key] = value
    for key, value in (("job_postmortem_since", args.since), ("job_postmortem_until", args.until),
                       ("job_postmortem_world_size", args.world_size), ("job_postmortem_hosts", args.hosts),
                       ("job_postmortem_job_user", args.job_user)):
        if value is not None:
            extra[key] = value
    if args.become:
        extra["job_postmortem_become"] = True
    started = time.time()
    result = _runner("job_postmortem", args, extra)
    latest = Path(extra["job_postmortem_report_dir"]) / "latest" / "postmortem.json"
    if latest.exists() and latest.stat().st_mtime >= started - 1:
        show_postmortem(latest)
    if result.status != "successful":
        sys.stderr.write("gpufleet: job_postmortem ended %s (rc %s)\n" % (result.status, result.rc))
    return result.rc if result.rc is not None else 1


def cmd_run(args):
    import ansible_runner

    from gpufleet_cli.live import RunProblems, explain_no_report

    extra = parse_extra(args.extra_vars)
    report_dir = run_report_dir(extra, "gpufleet_report_dir", str(Path(args.report_dir).resolve()))
    shows_report = args.playbook in ("burn_in", "preflight") and not args.check
    if shows_report:
        # The table is printed below, once: not also by the playbook.
        extra.setdefault("gpufleet_show_summary", False)
    envvars = _envvars()
    # ansible-runner execs ansible-playbook from PATH: use the one installed beside this Python.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    cmdline = " ".join(["--check"] if args.check else [])
    problems = RunProblems()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="gpufleet-runner.") as private:
        kwargs = dict(private_data_dir=private, project_dir=str(REPO), playbook=str(REPO / "playbooks" /
                      (args.playbook + ".yml")), extravars=extra, envvars=envvars, quiet=True,
                      event_handler=_printer(args.quiet, problems=problems), artifact_dir=str(report_dir / ".runner"),
                      rotate_artifacts=KEEP_RUNNER_ARTIFACTS)
        if args.inventory:
            kwargs["inventory"] = [str(Path(i).resolve()) for i in args.inventory]
        if args.limit:
            # The report play runs on localhost: a limit without it would silently skip the report.
            kwargs["limit"] = args.limit if "localhost" in args.limit.split(",") else args.limit + ",localhost"
        if cmdline:
            kwargs["cmdline"] = cmdline
        result = ansible_runner.run(**kwargs)
    latest = report_dir / "latest" / "report.json"
    # Only this run's report: an older one under latest (the run stopped before its report) is not shown as new.
    if shows_report and latest.exists() and latest.stat().st_mtime >= started - 1:
        show_report(latest)
    elif shows_report:
        explain_no_report(sys.stderr, args.playbook, result, problems, report_dir / ".runner")
    if result.status != "successful":
        sys.stderr.write("gpufleet: %s ended %s (rc %s)\n" % (args.playbook, result.status, result.rc))
    return result.rc if result.rc is not None else 1


def collection_problem(repo=REPO):
    """Why this command cannot use the collection of its clone (None when it can): it runs the clone's playbooks with
    the clone's ansible.cfg, whose collections path holds a link back to the clone."""
    link = repo / "collections" / "ansible_collections" / "kentino" / "gpufleet"
    if not (repo / "galaxy.yml").is_file() or not (repo / "playbooks").is_dir():
        return ("gpufleet: no clone of kentino.gpufleet at %s: the command runs the playbooks of the clone it is "
                "installed from (pip install -e <clone>, or make venv in the clone); with the collection installed "
                "instead, run ansible-playbook kentino.gpufleet.<playbook>" % repo)
    if not link.is_dir() or link.resolve() != repo.resolve():
        return ("gpufleet: %s does not lead back to the clone, so Ansible cannot find the collection kentino.gpufleet: "
                "restore it with `git -C %s checkout -- collections`" % (link, repo))
    return None


def main(argv=None):
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`gpufleet history --export csv | head`): what it wanted was written. Stop as a C tool
        # killed by SIGPIPE does, without a traceback, and keep Python's exit flush from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    problem = None if {"-h", "--help"} & set(argv) else collection_problem()
    if problem:
        sys.stderr.write(problem + "\n")
        return 3
    parser = argparse.ArgumentParser(prog="gpufleet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a playbook of the collection")
    run.add_argument("playbook", choices=PLAYBOOKS)
    add_inventory_option(run)
    run.add_argument("-l", "--limit")
    run.add_argument("-e", "--extra-vars", action="append", default=[])
    run.add_argument("--check", action="store_true", help="check mode: invasive checks report skipped")
    run.add_argument("--report-dir", default=os.environ.get("GPUFLEET_REPORT_DIR", "reports"))
    run.add_argument("-q", "--quiet", action="store_true", help="only the report table, not Ansible's output")
    abort = sub.add_parser("abort", help="stop what interrupted runs left running on the nodes")
    add_inventory_option(abort)
    abort.add_argument("-l", "--limit")
    abort.add_argument("-e", "--extra-vars", action="append", default=[])
    abort.add_argument("--report-dir", default=os.environ.get("GPUFLEET_REPORT_DIR", "reports"))
    abort.add_argument("-q", "--quiet", action="store_true")
    rep = sub.add_parser("report", help="show a fleet report as a table")
    rep.add_argument("path", nargs="?", help="a run id, a run directory or report.json (default <report-dir>/latest)")
    rep.add_argument("--report-dir", default=os.environ.get("GPUFLEET_REPORT_DIR", "reports"))
    from gpufleet_cli import commands

    commands.add_parsers(sub, os.environ.get("GPUFLEET_REPORT_DIR", "reports"))
    pm = sub.add_parser("postmortem", help="name the rank, node, GPU and reason of a hung training job")
    add_inventory_option(pm)
    pm.add_argument("-l", "--limit", help="the job's nodes (localhost is added for the analysis)")
    pm.add_argument("--hosts", help="host pattern of the job's nodes (default gpufleet_nodes)")
    pm.add_argument("--logs", action="append", default=[], help="log file or glob of the job on each node (repeat)")
    pm.add_argument("--journal-unit", action="append", default=[], help="systemd unit whose journal has the output")
    pm.add_argument("--dump-prefix", action="append", default=[],
                    help="flight-recorder dump prefix (default /var/tmp/gpufleet-nccl-dumps/nccl_trace_rank_)")
    pm.add_argument("--since", type=window_time,
                    help="window start: ISO 8601, @epoch or -2h (default: around the last timeout)")
    pm.add_argument("--until", type=window_time, help="window end (the same forms)")
    pm.add_argument("--world-size", type=positive_int)
    pm.add_argument("--become", action="store_true", help="read logs, dumps and the kernel log as root")
    pm.add_argument("--job-user", help="the user the job ran as: only its logs and dumps are read")
    pm.add_argument("-e", "--extra-vars", action="append", default=[])
    pm.add_argument("--report-dir", default=os.environ.get("GPUFLEET_REPORT_DIR", "reports"))
    pm.add_argument("-q", "--quiet", action="store_true", help="only the verdict, not Ansible's output")
    pm.add_argument("--show", nargs="?", const="", help="show a written post-mortem instead (default the latest)")
    from gpufleet_cli import lifecycle, plan

    plan.add_parser(sub)
    lifecycle.add_parsers(sub, os.environ.get("GPUFLEET_REPORT_DIR", "reports"))
    args = parser.parse_args(_dash_values_joined(argv))
    if args.command == "plan":
        return plan.run(args)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "abort":
        args.playbook, args.check = "abort", False
        return cmd_run(args)
    if args.command == "postmortem":
        return cmd_postmortem(args)
    if args.command in lifecycle.ACTIONS:
        return lifecycle.run(args, cmd_run)
    if args.command in commands.RUN_COMMANDS:
        return commands.cmd_play(args, REPO, show_report)
    if args.command == "history":
        return commands.cmd_history(args)
    if args.command == "handover":
        return commands.cmd_handover(args)
    path = Path(args.path or Path(args.report_dir) / "latest")
    if args.path and not path.exists() and (Path(args.report_dir) / args.path).exists():
        path = Path(args.report_dir) / args.path  # a run id
    try:
        report = show_report(path)
    except BrokenPipeError:
        raise  # the reader left (main's business), not an unreadable report
    except (OSError, ValueError, KeyError) as exc:
        sys.stderr.write("gpufleet: no readable report at %s (%s)\n" % (path, exc))
        return commands.EXIT_NOT_RUN
    if report.get("interrupted"):
        return commands.EXIT_NOT_RUN  # no verdict: the run did not finish
    return 2 if report["summary"]["gate"]["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
